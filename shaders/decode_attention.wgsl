// decode_attention: attention for a few query rows per sequence (token-by-token decoding),
// split over keys so that every lane reads keys instead of idling on rows that do not exist.
// One workgroup takes one key range ("split") of one (batch, key/value head) and every query
// row that reads that head: the kv_group query heads of a GQA group times the step's Lq rows
// (ROWS at most), so K and V are read once for the whole group. Within the workgroup:
//   1. each thread scores one key of the tile against every row (masked as the other paths:
//      a masked score is replaced by -1e9, a bias added);
//   2. every thread takes the rows' new max over the tile (the same value in every thread),
//      and turns its own key's scores into weights exp(s - max);
//   3. threads own V columns (vec4s), PARTS threads per column splitting the tile's keys, and
//      accumulate weight · V for every row; each V vec4 read feeds every row.
// The running max starts at -f32::MAX, so keys whose score is -inf weigh exactly 0 and a row
// with every score -inf keeps max -f32::MAX (the reduce pass returns NaN for it, as PyTorch).
// Each split writes, per row, (max, sum, accumulator) to `partials`; decode_reduce combines
// the splits in a fixed order. Keys per split are bounded so that one invocation's loops stay
// far under the 65,535 iterations a software rasteriser allows.
// Dispatch: (splits, B·H_kv, 1) workgroups of THREADS.
//
// The host's prelude (src/kernels/decode.rs) defines HEAD_DIM_QK, HEAD_DIM_V, ROWS, THREADS
// and the element type QkvElem; the mask rule (mask.wgsl) is prepended.

const DK4: u32 = (HEAD_DIM_QK + 3u) / 4u;
const DV4: u32 = (HEAD_DIM_V + 3u) / 4u;
const PARTS: u32 = THREADS / DV4;             // threads per V column
const PART_STRIDE: u32 = 2u + 4u * DV4;       // per (row, split): max, sum, accumulator

struct DecodeParams {
    lq: u32,              // query rows per (batch, head)
    lk: u32,
    heads: u32,
    kv_heads: u32,
    kv_group: u32,        // query heads per key/value head
    scale: f32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    kv_stride: u32,       // rows of K/V per (batch, kv head)
    keys_per_split: u32,  // a multiple of THREADS
    splits: u32,
}

@group(0) @binding(0) var<uniform> p: DecodeParams;
@group(0) @binding(1) var<storage, read> q_in: array<QkvElem>;
@group(0) @binding(2) var<storage, read> k_in: array<QkvElem>;
@group(0) @binding(3) var<storage, read> v_in: array<QkvElem>;
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;

var<workgroup> q_sh: array<vec4<f32>, ROWS * DK4>;
var<workgroup> s_sh: array<f32, ROWS * THREADS>;
var<workgroup> max_sh: array<f32, ROWS * THREADS>;
var<workgroup> acc_sh: array<vec4<f32>, ROWS * THREADS>;

// Which buffer a row is read from (a literal at every call, so the switch folds away).
const Q_ROW: u32 = 0u;
const K_ROW: u32 = 1u;
const V_ROW: u32 = 2u;

fn elem(which: u32, i: u32) -> f32 {
    switch which {
        case Q_ROW: { return f32(q_in[i]); }
        case K_ROW: { return f32(k_in[i]); }
        default: { return f32(v_in[i]); }
    }
}

// Elements d .. d + 3 of the row of `width` at `base`, zero past its end (whole vec4s, the
// usual head sizes, need no test).
fn row4(which: u32, base: u32, d: u32, width: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) {
        if (width % 4u == 0u || d + e < width) {
            v[e] = elem(which, base + d + e);
        }
    }
    return v;
}

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    let split = wid.x;
    let zkv = wid.y;                 // b · H_kv + g
    let b = zkv / p.kv_heads;
    let g = zkv % p.kv_heads;
    let rows = p.kv_group * p.lq;    // row r: head g · kv_group + r / lq, query r % lq

    // The group's query rows, as vec4s.
    for (var e = t; e < ROWS * DK4; e += THREADS) {
        let r = e / DK4;
        var q = vec4<f32>(0.0);
        if (r < rows) {
            let h = g * p.kv_group + r / p.lq;
            let base = p.q_offset + ((b * p.heads + h) * p.lq + r % p.lq) * HEAD_DIM_QK;
            q = row4(Q_ROW, base, 4u * (e % DK4), HEAD_DIM_QK);
        }
        q_sh[e] = q;
    }
    workgroupBarrier();

    let column = t % DV4;
    let part = t / DV4;
    var row_max: array<f32, ROWS>;
    var row_sum: array<f32, ROWS>;
    var acc: array<vec4<f32>, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        row_max[r] = -3.402823e38;
    }
    let first = split * p.keys_per_split;
    let end = min(p.lk, first + p.keys_per_split);
    for (var j0 = first; j0 < end; j0 += THREADS) {
        let keys = min(THREADS, end - j0);
        // 1. This thread's key, scored against every row.
        if (t < keys) {
            let j = j0 + t;
            let base = p.k_offset + (zkv * p.kv_stride + j) * HEAD_DIM_QK;
            var dots: array<f32, ROWS>;
            for (var c = 0u; c < DK4; c++) {
                let k = row4(K_ROW, base, 4u * c, HEAD_DIM_QK);
                for (var r = 0u; r < ROWS; r++) {
                    dots[r] += dot(q_sh[r * DK4 + c], k);
                }
            }
            for (var r = 0u; r < ROWS; r++) {
                if (r < rows) {
                    let h = g * p.kv_group + r / p.lq;
                    s_sh[r * THREADS + t] = apply_mask(p.scale * dots[r], b, h, r % p.lq, j);
                }
            }
        }
        workgroupBarrier();
        // 2. The rows' max over the tile, halving in workgroup memory; then every thread's
        //    rescale of what it accumulated, and its own key's weights.
        for (var r = 0u; r < ROWS; r++) {
            max_sh[r * THREADS + t] = select(-3.402823e38, s_sh[r * THREADS + t], t < keys);
        }
        workgroupBarrier();
        for (var stride = THREADS / 2u; stride > 0u; stride /= 2u) {
            if (t < stride) {
                for (var r = 0u; r < ROWS; r++) {
                    let e = r * THREADS + t;
                    max_sh[e] = max(max_sh[e], max_sh[e + stride]);
                }
            }
            workgroupBarrier();
        }
        var correction: array<f32, ROWS>;
        for (var r = 0u; r < ROWS; r++) {
            let m = max(row_max[r], max_sh[r * THREADS]);
            correction[r] = exp(row_max[r] - m);
            row_max[r] = m;
        }
        workgroupBarrier();
        if (t < keys) {
            for (var r = 0u; r < ROWS; r++) {
                s_sh[r * THREADS + t] = exp(s_sh[r * THREADS + t] - row_max[r]);
            }
        }
        workgroupBarrier();
        // 3. The sums (only thread 0 writes them out) and weight · V for this thread's
        //    column and keys.
        for (var r = 0u; r < ROWS; r++) {
            if (t == 0u) {
                var s = 0.0;
                for (var k = 0u; k < keys; k++) {
                    s += s_sh[r * THREADS + k];
                }
                row_sum[r] = row_sum[r] * correction[r] + s;
            }
            acc[r] = acc[r] * correction[r];
        }
        if (part < PARTS) {
            for (var k = part; k < keys; k += PARTS) {
                let base = p.v_offset + (zkv * p.kv_stride + j0 + k) * HEAD_DIM_V;
                let v = row4(V_ROW, base, 4u * column, HEAD_DIM_V);
                for (var r = 0u; r < ROWS; r++) {
                    acc[r] += s_sh[r * THREADS + k] * v;
                }
            }
        }
        workgroupBarrier();
    }

    // The parts of each column summed; (max, sum, accumulator) of every row to `partials`.
    for (var r = 0u; r < ROWS; r++) {
        acc_sh[r * THREADS + t] = acc[r];
    }
    workgroupBarrier();
    if (part == 0u) {
        for (var r = 0u; r < rows; r++) {
            var total = vec4<f32>(0.0);
            for (var q = 0u; q < PARTS; q++) {
                total += acc_sh[r * THREADS + q * DV4 + column];
            }
            let h = g * p.kv_group + r / p.lq;
            let row = (b * p.heads + h) * p.lq + r % p.lq;
            let base = (row * p.splits + split) * PART_STRIDE;
            if (t == 0u) {
                partials[base] = row_max[r];
                partials[base + 1u] = row_sum[r];
            }
            for (var e = 0u; e < 4u; e++) {
                partials[base + 2u + 4u * column + e] = total[e];
            }
        }
    }
}
