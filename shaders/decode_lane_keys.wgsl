// decode_lane_keys: the decode pass for CPU adapters, where each lane takes keys of its own.
// As in decode_attention, one workgroup takes one key range ("split") of one (batch, key/value
// head) for every query row that reads that head, so a GQA group reads its K/V once. Here each
// lane takes a run of consecutive keys whole (every element of the head) and keeps its own
// softmax state, so nothing crosses lanes while the keys are read: no barrier, no partial dot
// products through workgroup memory. On llvmpipe every lane-wide storage load is a loop over the
// lanes, whichever memory they read, so splitting a key's head over lanes (decode_attention)
// saves no load and adds the exchanges: this pass steps about 1.8x faster at d128. A run of
// consecutive keys makes each lane's reads one stream that the CPU's prefetcher follows.
// Per split, two passes over the lane's keys:
//   1. scores: each key dotted with every row's q (held in registers), scaled and masked (a
//      masked score is replaced by -1e9, a bias added, as on the other paths), kept in
//      workgroup memory (a lane reads back only its own) and the lane's max per row;
//   2. values: weights exp(s - max) against the lane's own max, their sum, and weight · V.
// Two passes instead of an online softmax: the accumulator (ROWS · DV4 vec4s a lane) is never
// rescaled per key. Then the lanes' states are combined (M = the lanes' largest max, each lane's
// sum and accumulator scaled by exp(m - M)) and written to `partials` as decode_attention writes
// them; decode_reduce combines the splits. A row whose every score is -inf keeps max -f32::MAX
// (LOWEST) and sum 0, and the reduce returns NaN for it, as PyTorch; scores of -f32::MAX are
// finite ones (exp(0) = 1 at that max).
// Dispatch: as decode_attention: (splits, B·H_kv, 1) workgroups of THREADS, one dispatch per
// chunk of a KV cache.
//
// Loops that index the private arrays (q, acc, ...) have constant bounds, CHUNK vec4s at most,
// and rows or chunks are visited by explicit calls with constant arguments: Mesa then unrolls
// them and the arrays stay registers. One runtime index would make every access of the array a
// per-lane gather or scatter (see decode_attention.wgsl); chunks of 8 vec4s stayed rolled and
// ran 2.2x slower. So both head sizes are at most 8 · CHUNK vec4s (d128).
//
// The host's prelude (src/kernels/decode.rs) defines HEAD_CAP_QK, HEAD_CAP_V, ROWS (≤ 8),
// THREADS, KEYS (keys per split, a multiple of THREADS) and the element type QkvElem; the mask
// rule (mask.wgsl), the parameters (decode_params.wgsl) and the Q, K, V loads query4, key4 and
// value4 (decode_rows_*.wgsl) are prepended.

const CHUNK: u32 = 4u;

var<private> q: array<vec4<f32>, ROWS * DK4>;
var<private> acc: array<vec4<f32>, ROWS * DV4>;
var<private> key_dots: array<vec4<f32>, ROW_VECS>;   // one key against every row
var<private> weights: array<vec4<f32>, ROW_VECS>;    // one key's weight for every row
var<private> lane_max: array<vec4<f32>, ROW_VECS>;
var<private> lane_sum: array<vec4<f32>, ROW_VECS>;
var<private> factor: array<vec4<f32>, ROW_VECS>;     // exp(lane max - split max)
var<private> split_max: array<vec4<f32>, ROW_VECS>;
var<private> split_sum: array<vec4<f32>, ROW_VECS>;

var<workgroup> score_sh: array<vec4<f32>, ROW_VECS * KEYS>;
var<workgroup> state_sh: array<vec4<f32>, 2u * ROW_VECS * THREADS>;  // maxima, then sums
var<workgroup> acc_sh: array<vec4<f32>, THREADS * DV4>;               // one row's accumulators

// The split's lanes, key range and (batch, head) group; the same in every function.
struct Work {
    t: u32,
    split: u32,
    zkv: u32,        // b · H_kv + g
    b: u32,
    g: u32,
    rows: u32,       // kv_group · Lq; row r: head g · kv_group + r / lq, query r % lq
    first: u32,
    end: u32,
    per_lane: u32,   // keys of each lane: a run of consecutive keys, so each lane reads a stream
    lane_first: u32,
}

fn head_of(w: Work, r: u32) -> u32 {
    return w.g * p.kv_group + r / p.lq;
}

// Vec4s c0 .. c0 + CHUNK of row r's q (r and c0 constants wherever called, as below).
fn query_chunk(base: u32, r: u32, c0: u32) {
    for (var c = c0; c < min(c0 + CHUNK, DK4); c++) {
        q[r * DK4 + c] = query4(base, c);
    }
}

// Row r's q (zero for the rows past `rows` that pad ROWS to a power of two).
fn load_query(w: Work, r: u32) {
    if (r < w.rows) {
        let base = row_start(p.q, w.b, head_of(w, r), r % p.lq);
        query_chunk(base, r, 0u);
        if (CHUNK < DK4) { query_chunk(base, r, CHUNK); }
        if (2u * CHUNK < DK4) { query_chunk(base, r, 2u * CHUNK); }
        if (3u * CHUNK < DK4) { query_chunk(base, r, 3u * CHUNK); }
        if (4u * CHUNK < DK4) { query_chunk(base, r, 4u * CHUNK); }
        if (5u * CHUNK < DK4) { query_chunk(base, r, 5u * CHUNK); }
        if (6u * CHUNK < DK4) { query_chunk(base, r, 6u * CHUNK); }
        if (7u * CHUNK < DK4) { query_chunk(base, r, 7u * CHUNK); }
    }
}

// Vec4s c0 .. c0 + CHUNK of the key row at `base` dotted with every row's q.
// Vec4s c0 .. c0 + 2·CHUNK (a block of 32 values; the second chunk only where the head has
// it) of the key row at `base` dotted with every row's q. The block is read at once (key32):
// a quantized row's block is one or two vec4s of words and one scale, by which the block's dot
// products are multiplied once. CHUNK is 4 and head caps are multiples of 16, so every chunk
// is whole.
fn dot_block(base: u32, c0: u32) {
    let k = key32(base, c0);
    var part: array<vec4<f32>, ROW_VECS>;
    for (var i = 0u; i < CHUNK; i++) {
        for (var r = 0u; r < ROWS; r++) {
            part[r / 4u][r % 4u] += dot(q[r * DK4 + c0 + i], k.lo[i]);
        }
    }
    if (c0 + CHUNK < DK4) {
        for (var i = 0u; i < CHUNK; i++) {
            for (var r = 0u; r < ROWS; r++) {
                part[r / 4u][r % 4u] += dot(q[r * DK4 + c0 + CHUNK + i], k.hi[i]);
            }
        }
    }
    for (var n = 0u; n < ROW_VECS; n++) {
        key_dots[n] += k.scale * part[n];
    }
}

// Rows 4n..4n+3 of key j's scores, scaled and masked, to workgroup memory and the lane's max.
fn mask_scores(w: Work, n: u32, j: u32, live: bool, slot: u32, plain_scores: bool) {
    let d = key_dots[n];
    var s = vec4<f32>(LOWEST);
    if (plain_scores) {
        // Uniform: no rule to apply; rows past `rows` (padding ROWS) and a key past the
        // range stay at LOWEST.
        let r = vec4<u32>(4u * n) + vec4<u32>(0u, 1u, 2u, 3u);
        s = select(vec4<f32>(LOWEST), p.scale * d, vec4<bool>(live) & (r < vec4<u32>(w.rows)));
        score_sh[slot * ROW_VECS + n] = s;
        lane_max[n] = max(lane_max[n], s);
        return;
    }
    for (var e = 0u; e < 4u; e++) {
        let r = 4u * n + e;
        if (live && r < w.rows) {
            s[e] = apply_mask(p.scale * d[e], w.b, head_of(w, r), r % p.lq, j);
        }
    }
    score_sh[slot * ROW_VECS + n] = s;
    lane_max[n] = max(lane_max[n], s);
}

// Vec4s c0 .. c0 + 2·CHUNK (a block, as dot_block) of the value row at `base`, weighted, added
// to every row's acc; a quantized block's scale joins the weights once.
fn value_block(base: u32, c0: u32) {
    let v = value32(base, c0);
    var wd: array<vec4<f32>, ROW_VECS>;
    for (var n = 0u; n < ROW_VECS; n++) {
        wd[n] = v.scale * weights[n];
    }
    for (var i = 0u; i < CHUNK; i++) {
        for (var r = 0u; r < ROWS; r++) {
            acc[r * DV4 + c0 + i] += wd[r / 4u][r % 4u] * v.lo[i];
        }
    }
    if (c0 + CHUNK < DV4) {
        for (var i = 0u; i < CHUNK; i++) {
            for (var r = 0u; r < ROWS; r++) {
                acc[r * DV4 + c0 + CHUNK + i] += wd[r / 4u][r % 4u] * v.hi[i];
            }
        }
    }
}

// The split's max and sum of rows 4n..4n+3 from every lane's, and this lane's factor.
fn combine_state(w: Work, n: u32) {
    var m = vec4<f32>(LOWEST);
    for (var l = 0u; l < THREADS; l++) {
        m = max(m, state_sh[n * THREADS + l]);
    }
    var sum = vec4<f32>(0.0);
    for (var l = 0u; l < THREADS; l++) {
        sum += state_sh[(ROW_VECS + n) * THREADS + l] * exp(state_sh[n * THREADS + l] - m);
    }
    split_max[n] = m;
    split_sum[n] = sum;
    factor[n] = exp(lane_max[n] - m);
}

// Vec4s c0 .. c0 + CHUNK of row r's acc, scaled by f, to lane t's slot of workgroup memory.
fn share_chunk(t: u32, r: u32, f: f32, c0: u32) {
    for (var c = c0; c < min(c0 + CHUNK, DV4); c++) {
        acc_sh[t * DV4 + c] = f * acc[r * DV4 + c];
    }
}

// Row r's accumulator, scaled by its factor, to lane t's slot of workgroup memory (r a
// constant at every call, so acc keeps constant indices).
fn share_row(t: u32, r: u32) {
    let f = factor[r / 4u][r % 4u];
    share_chunk(t, r, f, 0u);
    if (CHUNK < DV4) { share_chunk(t, r, f, CHUNK); }
    if (2u * CHUNK < DV4) { share_chunk(t, r, f, 2u * CHUNK); }
    if (3u * CHUNK < DV4) { share_chunk(t, r, f, 3u * CHUNK); }
    if (4u * CHUNK < DV4) { share_chunk(t, r, f, 4u * CHUNK); }
    if (5u * CHUNK < DV4) { share_chunk(t, r, f, 5u * CHUNK); }
    if (6u * CHUNK < DV4) { share_chunk(t, r, f, 6u * CHUNK); }
    if (7u * CHUNK < DV4) { share_chunk(t, r, f, 7u * CHUNK); }
}

// Row r's combined (max, sum, accumulator) to `partials`: the lanes' scaled accumulators
// summed through workgroup memory, lane t taking vec4s t, t + THREADS, ...
fn write_row(w: Work, r: u32) {
    workgroupBarrier();
    switch r {
        case 0u: { share_row(w.t, 0u); }
        case 1u: { if (ROWS > 1u) { share_row(w.t, 1u); } }
        case 2u: { if (ROWS > 2u) { share_row(w.t, 2u); } }
        case 3u: { if (ROWS > 3u) { share_row(w.t, 3u); } }
        case 4u: { if (ROWS > 4u) { share_row(w.t, 4u); } }
        case 5u: { if (ROWS > 5u) { share_row(w.t, 5u); } }
        case 6u: { if (ROWS > 6u) { share_row(w.t, 6u); } }
        default: { if (ROWS > 7u) { share_row(w.t, 7u); } }
    }
    workgroupBarrier();
    let row = (w.b * p.heads + head_of(w, r)) * p.lq + r % p.lq;
    let out = (row * p.splits + w.split) * part_stride();
    if (w.t == 0u) {
        partials[out] = split_max[r / 4u][r % 4u];
        partials[out + 1u] = split_sum[r / 4u][r % 4u];
    }
    for (var c = w.t; c < DV4; c += THREADS) {
        var a = vec4<f32>(0.0);
        for (var l = 0u; l < THREADS; l++) {
            a += acc_sh[l * DV4 + c];
        }
        for (var e = 0u; e < 4u; e++) {
            if (4u * c + e < p.head_dim_v) {
                partials[out + 2u + 4u * c + e] = a[e];
            }
        }
    }
}

// Key `j`'s row start in K or V (`rows`); a step past the range's end reads its last key again
// (its score then counts as -f32::MAX and its weight as 0).
fn row_base(w: Work, j: u32, rows: RowStrides) -> u32 {
    let key = min(j, w.end - 1u);
    return row_start(rows, w.zkv / p.kv_heads, w.zkv % p.kv_heads, key - p.key_base);
}

// 1. The scores of this lane's keys, to workgroup memory, and the lane's max per row.
fn score_keys(w: Work) {
    // No cap, bias or temperature, and no key of the split masked for any row (no mask, or a
    // causal one whose first query sees the split's last key — every key of a decode step's
    // split but the step's own): the scores are the scaled dot products. Uniform. apply_mask
    // for every row and key cost lavapipe most of the step (d32: 112 ms of it, 40 without).
    let causal_clear = mask.kind == MASK_CAUSAL && mask.chunk == 0u
        && i32(w.end) - 1 <= mask.causal_offset;
    let plain = (mask.kind == MASK_NONE || causal_clear) && mask.softcap == 0.0
        && mask.alibi_heads == 0u && mask.temp_floor_scale == 0.0;
    for (var n = 0u; n < ROW_VECS; n++) {
        lane_max[n] = vec4<f32>(LOWEST);
    }
    for (var step = 0u; step < w.per_lane; step++) {
        let j = w.lane_first + step;
        let base = row_base(w, j, p.k);
        for (var n = 0u; n < ROW_VECS; n++) {
            key_dots[n] = vec4<f32>(0.0);
        }
        dot_block(base, 0u);
        if (2u * CHUNK < DK4) { dot_block(base, 2u * CHUNK); }
        if (4u * CHUNK < DK4) { dot_block(base, 4u * CHUNK); }
        if (6u * CHUNK < DK4) { dot_block(base, 6u * CHUNK); }
        let slot = step * THREADS + w.t;
        mask_scores(w, 0u, j, j < w.end, slot, plain);
        if (ROW_VECS > 1u) { mask_scores(w, 1u, j, j < w.end, slot, plain); }
    }
}

// 2. Weights against the lane's own max, their sums, and weight · V.
fn add_values(w: Work) {
    for (var step = 0u; step < w.per_lane; step++) {
        let j = w.lane_first + step;
        let base = row_base(w, j, p.v);
        for (var n = 0u; n < ROW_VECS; n++) {
            let s = score_sh[(step * THREADS + w.t) * ROW_VECS + n];
            weights[n] = select(vec4<f32>(0.0), exp(s - lane_max[n]), j < w.end);
            lane_sum[n] += weights[n];
        }
        value_block(base, 0u);
        if (2u * CHUNK < DV4) { value_block(base, 2u * CHUNK); }
        if (4u * CHUNK < DV4) { value_block(base, 4u * CHUNK); }
        if (6u * CHUNK < DV4) { value_block(base, 6u * CHUNK); }
    }
}

// 3. The lanes' states combined and written, one row at a time.
fn combine_lanes(w: Work) {
    for (var n = 0u; n < ROW_VECS; n++) {
        state_sh[n * THREADS + w.t] = lane_max[n];
        state_sh[(ROW_VECS + n) * THREADS + w.t] = lane_sum[n];
    }
    workgroupBarrier();
    combine_state(w, 0u);
    if (ROW_VECS > 1u) { combine_state(w, 1u); }
    // A loop with a runtime bound (uniform), not a call per row, so the row's barriers and
    // sums are compiled once: llvmpipe runs a workgroup's lanes as coroutines, each barrier in
    // the code a suspend point whose frame holds every live value (d128, 4 rows: 11.3 s of
    // cold compile as calls, 10.0 s as a loop; `bench --only compile`). The bound is read from
    // the parameters, not `w.rows`: `w` also holds the lane, and WGSL's uniformity analysis
    // (Tint's, a browser's) counts the whole struct as varying, so a barrier under that loop
    // would be refused.
    for (var r = 0u; r < p.kv_group * p.lq; r++) {
        write_row(w, r);
    }
}

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    var w: Work;
    w.t = lid.x;
    w.split = p.split_base + wid.x;
    w.zkv = wid.y;
    w.b = w.zkv / p.kv_heads;
    w.g = w.zkv % p.kv_heads;
    w.rows = p.kv_group * p.lq;
    w.first = w.split * p.keys_per_split;
    w.end = min(p.lk, w.first + p.keys_per_split);
    w.per_lane = (w.end - w.first + THREADS - 1u) / THREADS;
    w.lane_first = w.first + w.t * w.per_lane;

    load_query(w, 0u);
    if (ROWS > 1u) { load_query(w, 1u); }
    if (ROWS > 2u) { load_query(w, 2u); }
    if (ROWS > 3u) { load_query(w, 3u); }
    if (ROWS > 4u) { load_query(w, 4u); }
    if (ROWS > 5u) { load_query(w, 5u); }
    if (ROWS > 6u) { load_query(w, 6u); }
    if (ROWS > 7u) { load_query(w, 7u); }
    score_keys(w);
    add_values(w);
    combine_lanes(w);
}
