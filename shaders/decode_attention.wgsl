// decode_attention: attention for a few query rows per sequence (token-by-token decoding),
// split over keys so that every lane reads keys instead of idling on rows that do not exist.
// One workgroup takes one key range ("split") of one (batch, key/value head) and every query
// row that reads that head: the kv_group query heads of a GQA group times the step's Lq rows
// (ROWS at most), so K and V are read once for the whole group.
//
// Lanes work across the head dimension: QK_LANES lanes share one key, each holding QK_VECS
// vec4s of every row's q in registers (q is read once, never from workgroup memory), and
// V_LANES lanes share one value row, each accumulating V_VECS vec4 columns of every row.
// Vec4 c of a row belongs to lane c % LANES, so neighbouring lanes read neighbouring memory.
// Per tile of TILE keys:
//   1. each lane's partial dot products of its keys against every row (QK_PARTS keys at once);
//   2. lane t sums the partials of keys t, t + THREADS, ... of the tile, scales and masks
//      their scores (a masked score is replaced by -1e9, a bias added, as on the other paths)
//      and keeps their max;
//   3. every lane takes the rows' new max over the tile from the lanes' maxima, rescales what
//      it accumulated, and turns its keys' scores into weights exp(s - max);
//   4. each lane adds weight · V over its part of the tile's keys (V_PARTS parts).
// The running max starts at exactly -f32::MAX (LOWEST), so keys whose score is -inf weigh
// exactly 0, a score of -f32::MAX weighs exp(0) = 1 where it is the max (torch's finfo.min mask),
// and a row with every score -inf keeps sum 0 (the reduce pass returns NaN for it, as PyTorch).
// Each split writes, per row, (max, sum, accumulator) to `partials`; decode_reduce combines
// the splits in a fixed order. The host bounds keys per split so that one invocation's loops
// stay far under the 65,535 iterations a software rasteriser allows.
// Dispatch: (splits, B·H_kv, 1) workgroups of THREADS; a KV cache stored in chunks makes one
// dispatch per chunk, each binding that chunk's K/V and taking its splits.
//
// The host's prelude (src/kernels/decode.rs) defines HEAD_CAP_QK, HEAD_CAP_V, ROWS, THREADS,
// TILE, QK_LANES, QK_VECS, V_LANES, V_VECS, ACC_SHARED and the element type QkvElem; the mask
// rule (mask.wgsl), the parameters (decode_params.wgsl) and the K/V bindings with their loads
// key4 and value4 (decode_rows_vec4.wgsl where every row starts on a vec4, else
// decode_rows_scalar.wgsl) are prepended.

const QK_PARTS: u32 = THREADS / QK_LANES;     // keys scored at once
const V_PARTS: u32 = THREADS / V_LANES;       // keys whose values are added at once

// Per-row values travel four rows to a vec4 (rows 4n..4n+3 in vec4 n): llvmpipe reads and
// writes workgroup memory one lane at a time whatever the type, so a vec4 moves four rows for
// the price of one.
var<workgroup> dot_sh: array<vec4<f32>, ROW_VECS * TILE * QK_LANES>;
var<workgroup> score_sh: array<vec4<f32>, ROW_VECS * TILE>;
var<workgroup> weight_sh: array<vec4<f32>, ROW_VECS * TILE>;
var<workgroup> max_sh: array<vec4<f32>, ROW_VECS * THREADS>;  // each lane's max of step 2
// The V parts' accumulators of one row, summed at the end (one element when V_PARTS is 1).
var<workgroup> acc_sh: array<vec4<f32>, ACC_SHARED>;
var<workgroup> sum_sh: array<f32, THREADS>;

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    let split = p.split_base + wid.x;
    let zkv = wid.y;                 // b · H_kv + g
    let b = zkv / p.kv_heads;
    let g = zkv % p.kv_heads;
    let rows = p.kv_group * p.lq;    // row r: head g · kv_group + r / lq, query r % lq
    // A part index that is 0 in every lane is written as the constant, so that the compiler
    // sees the loops over keys as uniform (llvmpipe then reads workgroup memory once, not
    // per lane).
    let qk_lane = t % QK_LANES;
    let qk_part = select(t / QK_LANES, 0u, QK_PARTS == 1u);
    let v_lane = t % V_LANES;
    let v_part = select(t / V_LANES, 0u, V_PARTS == 1u);

    // This lane's vec4s of every row's q.
    var q: array<vec4<f32>, ROWS * QK_VECS>;
    for (var r = 0u; r < ROWS; r++) {
        if (r < rows) {
            let h = g * p.kv_group + r / p.lq;
            let base = row_start(p.q, b, h, r % p.lq);
            for (var v = 0u; v < QK_VECS; v++) {
                q[r * QK_VECS + v] = query4(base, qk_lane + QK_LANES * v);
            }
        }
    }

    // Every loop that indexes these private arrays has a constant trip count, so that the
    // compiler unrolls it and the arrays become registers. Had one index stayed dynamic,
    // llvmpipe would turn every access of the array into a per-lane gather or scatter (about
    // 1.5x the whole step's time at d128).
    var row_max: array<vec4<f32>, ROW_VECS>;
    var row_sum: array<vec4<f32>, ROW_VECS>;
    var acc: array<vec4<f32>, ROWS * V_VECS>;
    for (var n = 0u; n < ROW_VECS; n++) {
        row_max[n] = vec4<f32>(LOWEST);
    }
    let first = split * p.keys_per_split;
    let end = min(p.lk, first + p.keys_per_split);
    for (var j0 = first; j0 < end; j0 += TILE) {
        let keys = min(TILE, end - j0);
        // 1. Partial dot products over this lane's share of each of its keys.
        if (qk_part < QK_PARTS) {
            for (var kk = qk_part; kk < keys; kk += QK_PARTS) {
                let base = row_start(p.k, zkv / p.kv_heads, zkv % p.kv_heads, j0 + kk - p.key_base);
                var dots: array<vec4<f32>, ROW_VECS>;
                for (var v = 0u; v < QK_VECS; v++) {
                    let k = key4(base, qk_lane + QK_LANES * v);
                    for (var r = 0u; r < ROWS; r++) {
                        dots[r / 4u][r % 4u] += dot(q[r * QK_VECS + v], k);
                    }
                }
                for (var n = 0u; n < ROW_VECS; n++) {
                    dot_sh[(n * TILE + kk) * QK_LANES + qk_lane] = dots[n];
                }
            }
        }
        workgroupBarrier();
        // 2. The scores of keys t, t + THREADS, ..., scaled and masked, and this lane's max.
        var lane_max: array<vec4<f32>, ROW_VECS>;
        for (var n = 0u; n < ROW_VECS; n++) {
            lane_max[n] = vec4<f32>(LOWEST);
        }
        for (var kt = t; kt < TILE; kt += THREADS) {
            for (var n = 0u; n < ROW_VECS; n++) {
                var d = vec4<f32>(0.0);
                for (var l = 0u; l < QK_LANES; l++) {
                    d += dot_sh[(n * TILE + kt) * QK_LANES + l];
                }
                var s = vec4<f32>(LOWEST);
                for (var e = 0u; e < 4u; e++) {
                    let r = 4u * n + e;
                    if (kt < keys && r < rows) {
                        let h = g * p.kv_group + r / p.lq;
                        s[e] = apply_mask(p.scale * d[e], b, h, r % p.lq, j0 + kt);
                    }
                }
                score_sh[n * TILE + kt] = s;
                lane_max[n] = max(lane_max[n], s);
            }
        }
        for (var n = 0u; n < ROW_VECS; n++) {
            max_sh[n * THREADS + t] = lane_max[n];
        }
        workgroupBarrier();
        // 3. The rows' max over the tile (the same in every lane), the rescale of what this
        //    lane accumulated, and key t's weights.
        var tile_max: array<vec4<f32>, ROW_VECS>;
        var correction: array<vec4<f32>, ROW_VECS>;
        for (var n = 0u; n < ROW_VECS; n++) {
            var m = row_max[n];
            for (var l = 0u; l < THREADS; l++) {
                m = max(m, max_sh[n * THREADS + l]);
            }
            tile_max[n] = m;
            correction[n] = exp(row_max[n] - m);
            row_max[n] = m;
            row_sum[n] *= correction[n];
        }
        for (var r = 0u; r < ROWS; r++) {
            for (var v = 0u; v < V_VECS; v++) {
                acc[r * V_VECS + v] *= correction[r / 4u][r % 4u];
            }
        }
        for (var kt = t; kt < keys; kt += THREADS) {
            for (var n = 0u; n < ROW_VECS; n++) {
                weight_sh[n * TILE + kt] = exp(score_sh[n * TILE + kt] - tile_max[n]);
            }
        }
        workgroupBarrier();
        // 4. weight · V over this lane's part of the tile; every V vec4 read feeds every row.
        for (var kk = v_part; kk < keys; kk += V_PARTS) {
            let base = row_start(p.v, zkv / p.kv_heads, zkv % p.kv_heads, j0 + kk - p.key_base);
            var w: array<vec4<f32>, ROW_VECS>;
            for (var n = 0u; n < ROW_VECS; n++) {
                w[n] = weight_sh[n * TILE + kk];
                row_sum[n] += w[n];
            }
            for (var v = 0u; v < V_VECS; v++) {
                let value = value4(base, v_lane + V_LANES * v);
                for (var r = 0u; r < ROWS; r++) {
                    acc[r * V_VECS + v] += w[r / 4u][r % 4u] * value;
                }
            }
        }
    }

    // (max, sum, accumulator) of every row to `partials`, the V parts summed first.
    for (var r = 0u; r < ROWS; r++) {
        let h = g * p.kv_group + r / p.lq;
        let out = (((b * p.heads + h) * p.lq + r % p.lq) * p.splits + split) * part_stride();
        var total_sum = row_sum[r / 4u][r % 4u];
        if (V_PARTS > 1u) {
            workgroupBarrier();
            for (var v = 0u; v < V_VECS; v++) {
                acc_sh[t * V_VECS + v] = acc[r * V_VECS + v];
            }
            sum_sh[t] = total_sum;
            workgroupBarrier();
            if (v_part == 0u) {
                for (var part = 1u; part < V_PARTS; part++) {
                    let lane = part * V_LANES + v_lane;
                    for (var v = 0u; v < V_VECS; v++) {
                        acc[r * V_VECS + v] += acc_sh[lane * V_VECS + v];
                    }
                    total_sum += sum_sh[lane];
                }
            }
        }
        if (v_part == 0u && r < rows) {
            if (t == 0u) {
                partials[out] = row_max[r / 4u][r % 4u];
                partials[out + 1u] = total_sum;
            }
            for (var v = 0u; v < V_VECS; v++) {
                let c = v_lane + V_LANES * v;
                let a = acc[r * V_VECS + v];
                let at = out + 2u + 4u * c;
                // Element by element with constant indices: a loop over the vec4 here
                // measured 1.5x slower on lavapipe (the compiler then leaves `acc` an
                // indexed array, every access of it a per-lane gather or scatter).
                if (4u * c < p.head_dim_v) {
                    partials[at] = a.x;
                }
                if (4u * c + 1u < p.head_dim_v) {
                    partials[at + 1u] = a.y;
                }
                if (4u * c + 2u < p.head_dim_v) {
                    partials[at + 2u] = a.z;
                }
                if (4u * c + 3u < p.head_dim_v) {
                    partials[at + 3u] = a.w;
                }
            }
        }
    }
}
