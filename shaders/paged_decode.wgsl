// paged_decode: the paged pass for decode batches on CPU adapters (every sequence runs one
// query row), where each lane takes keys of its own. Same work list, parameters, bindings and
// outputs as paged_attention (paged_common.wgsl is prepended); an item is one sequence's
// row × the query heads of one KV head × a chunk of keys.
//
// On llvmpipe a workgroup of 8 is one SIMD vector and every lane-wide load is a loop over the
// lanes, so staging a key's head across lanes through workgroup memory (paged_attention) saves
// no load and adds exchanges. Here each lane takes a run of consecutive keys whole — each
// lane's reads one stream — reading the pool as whole vec4s (the host takes this pass only for
// head sizes that are multiples of 4, so every row starts on one), with every head's q in
// registers, in two passes: the scores (kept in workgroup memory, each lane reading back only
// its own) and the lane's max per head; then the weights exp(s − max), their sum and weight · V.
// The lanes' states are then combined (the largest max, each lane's sum and accumulator scaled
// by exp(m − M)), with the sink on the first chunk, into the final row or a partial state as
// paged_attention writes them.
//
// As in decode_lane_keys (the contiguous cache's pass), loops that index the private arrays
// have constant bounds of CHUNK vec4s at most, and heads or chunks are visited by explicit
// calls with constant arguments: Mesa then unrolls them and the arrays stay registers (one
// runtime index would make every access a per-lane gather). So heads are at most 8 · CHUNK
// vec4s (d128).
// Dispatch: one workgroup per item, over x then y.
// The host's prelude defines THREADS, HEADS (query heads per item, a power of two ≤ 8), DK4
// (≤ 32), KEYS (most keys of an item: a multiple of THREADS) and the pool's element type KvElem;
// the pool's binding and its reads (pool_vec4: paged_rows_vec4.wgsl, or paged_rows_quant.wgsl
// for a quantized pool) come before this body.

const CHUNK: u32 = 4u;

// q as whole vec4s (the head size is a multiple of 4, and so is every head's first element,
// q_offset being 0): on llvmpipe each is one load, a loop over the lanes, where four f32s were
// four — an item's fixed cost, paid again for each chunk of a split sequence (`bench --only
// serve --config serve:div=64`, items of ~47 keys, Intel lavapipe: step medians 10 % lower).
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
const HEAD_VECS: u32 = (HEADS + 3u) / 4u;   // four heads' scalars to a vec4

var<private> qv: array<vec4<f32>, HEADS * DK4>;
var<private> acc: array<vec4<f32>, HEADS * DK4>;
var<private> key_dots: array<vec4<f32>, HEAD_VECS>;   // one key against every head
var<private> weights: array<vec4<f32>, HEAD_VECS>;    // one key's weight for every head
var<private> slopes: array<vec4<f32>, HEAD_VECS>;     // ALiBi
var<private> lane_max: array<vec4<f32>, HEAD_VECS>;
var<private> lane_sum: array<vec4<f32>, HEAD_VECS>;

var<workgroup> score_sh: array<vec4<f32>, HEAD_VECS * KEYS>;
var<workgroup> state_sh: array<vec4<f32>, 2u * HEAD_VECS * THREADS>;  // maxima, then sums
var<workgroup> acc_sh: array<vec4<f32>, THREADS * DK4>;               // one head's accumulators

// One item as the work list gives it, and this lane's keys; the same in every function.
struct Item {
    t: u32,
    kvh: u32,
    n_heads: u32,
    head_base: u32,    // the item's first query head
    out_row: u32,      // the query row's index in `out`
    pos: u32,          // its position among the sequence's keys
    page_begin: u32,
    key_end: u32,
    partial: u32,
    first_chunk: u32,
    lane_first: u32,
    per_lane: u32,     // keys of each lane: a run of consecutive keys
}

// Vec4s c0 .. c0 + CHUNK of head h's q, from q's element `at` (h and c0 constants wherever
// called, as below).
fn query_chunk(at: u32, h: u32, c0: u32) {
    for (var c = c0; c < min(c0 + CHUNK, DK4); c++) {
        qv[h * DK4 + c] = q[at / 4u + c];
    }
}

// Head h's q and ALiBi slope (zero for the heads past `n_heads` that pad HEADS).
fn load_query(it: Item, h: u32) {
    if (h < it.n_heads) {
        let at = p.q_offset + it.out_row * p.q_row + (it.head_base + h) * p.q_head;
        query_chunk(at, h, 0u);
        if (CHUNK < DK4) { query_chunk(at, h, CHUNK); }
        if (2u * CHUNK < DK4) { query_chunk(at, h, 2u * CHUNK); }
        if (3u * CHUNK < DK4) { query_chunk(at, h, 3u * CHUNK); }
        if (4u * CHUNK < DK4) { query_chunk(at, h, 4u * CHUNK); }
        if (5u * CHUNK < DK4) { query_chunk(at, h, 5u * CHUNK); }
        if (6u * CHUNK < DK4) { query_chunk(at, h, 6u * CHUNK); }
        if (7u * CHUNK < DK4) { query_chunk(at, h, 7u * CHUNK); }
        if ((p.flags & 2u) != 0u) {
            slopes[h / 4u][h % 4u] = bitcast<f32>(plan[p.heads_at + p.heads + it.head_base + h]);
        }
    }
}

// Vec4s c0 .. c0 + CHUNK of the key row at element `base` dotted with every head's q. A chunk
// (16 elements from a multiple of 16) lies in one block of a quantized pool, its quants one
// load (pool_chunk): its sums are of the raw quants, scaled once (a float pool's scale is 1).
fn dot_chunk(base: u32, c0: u32, d: f32) {
    var part: array<vec4<f32>, HEAD_VECS>;
    let ch = pool_chunk(base, c0);
    for (var c = c0; c < min(c0 + CHUNK, DK4); c++) {
        let k = chunk_vec4(ch, c - c0);
        for (var h = 0u; h < HEADS; h++) {
            part[h / 4u][h % 4u] += dot(qv[h * DK4 + c], k);
        }
    }
    for (var n = 0u; n < HEAD_VECS; n++) {
        key_dots[n] += d * part[n];
    }
}

// Vec4s c0 .. c0 + 2 · CHUNK of the key row (a block of 32 of a quantized pool: its scale
// loaded once for both chunks).
fn dot_block(base: u32, c0: u32) {
    let d = pool_scale(base, c0);
    dot_chunk(base, c0, d);
    if (c0 + CHUNK < DK4) { dot_chunk(base, c0 + CHUNK, d); }
}

// Vec4s c0 .. c0 + CHUNK of the value row at element `base`, weighted, added to every head's
// acc (the weights times the chunk's block scale `d`, once).
fn value_chunk(base: u32, c0: u32, d: f32) {
    var w: array<vec4<f32>, HEAD_VECS>;
    for (var n = 0u; n < HEAD_VECS; n++) {
        w[n] = d * weights[n];
    }
    let ch = pool_chunk(base, c0);
    for (var c = c0; c < min(c0 + CHUNK, DK4); c++) {
        let v = chunk_vec4(ch, c - c0);
        for (var h = 0u; h < HEADS; h++) {
            acc[h * DK4 + c] += w[h / 4u][h % 4u] * v;
        }
    }
}

// Vec4s c0 .. c0 + 2 · CHUNK of the value row, as dot_block.
fn value_block(base: u32, c0: u32) {
    let d = pool_scale(base, c0);
    value_chunk(base, c0, d);
    if (c0 + CHUNK < DK4) { value_chunk(base, c0 + CHUNK, d); }
}

// Key j's row in the pool, its first element, K (which 0) or V (1); a step past the lane's keys
// reads the item's last key again (its score then is −inf, its weight 0).
fn key_row(it: Item, j: u32, which: u32) -> u32 {
    let key = min(j, it.key_end - 1u);
    let page = plan[p.indices_at + it.page_begin + (key >> p.page_shift)];
    return pool_index(page, which, key & (p.page_size - 1u), it.kvh, 0u);
}

// Heads 4n..4n+3 of key j's scores, scaled, capped, masked and biased, to workgroup memory and
// the lane's max (a hidden key's score −inf).
fn mask_scores(it: Item, n: u32, j: u32, visible: bool, slot: u32) {
    var s = p.scale * key_dots[n];
    if (p.softcap > 0.0) {
        s = p.softcap * tanh(s / p.softcap);
    }
    if ((p.flags & 2u) != 0u) {
        s += slopes[n] * (f32(j) - f32(it.pos));
    }
    for (var e = 0u; e < 4u; e++) {
        if (!visible || 4u * n + e >= it.n_heads) {
            s[e] = neg_inf();
        }
    }
    score_sh[slot * HEAD_VECS + n] = s;
    lane_max[n] = max(lane_max[n], s);
}

// 1. The scores of this lane's keys, to workgroup memory, and the lane's max per head.
fn score_keys(it: Item) {
    for (var n = 0u; n < HEAD_VECS; n++) {
        lane_max[n] = vec4<f32>(LOWEST);
    }
    for (var step = 0u; step < it.per_lane; step++) {
        let j = it.lane_first + step;
        let base = key_row(it, j, 0u);
        for (var n = 0u; n < HEAD_VECS; n++) {
            key_dots[n] = vec4<f32>(0.0);
        }
        dot_block(base, 0u);
        if (2u * CHUNK < DK4) { dot_block(base, 2u * CHUNK); }
        if (4u * CHUNK < DK4) { dot_block(base, 4u * CHUNK); }
        if (6u * CHUNK < DK4) { dot_block(base, 6u * CHUNK); }
        var visible = j < it.key_end;
        if (p.causal == 1u) {
            visible = visible && j <= it.pos;
        }
        if (p.window_left != NO_WINDOW) {
            visible = visible && j + p.window_left >= it.pos;
        }
        let slot = step * THREADS + it.t;
        mask_scores(it, 0u, j, visible, slot);
        if (HEAD_VECS > 1u) { mask_scores(it, 1u, j, visible, slot); }
    }
}

// 2. Weights against the lane's own max, their sums, and weight · V.
fn add_values(it: Item) {
    for (var step = 0u; step < it.per_lane; step++) {
        let base = key_row(it, it.lane_first + step, 1u);
        for (var n = 0u; n < HEAD_VECS; n++) {
            weights[n] = exp(score_sh[(step * THREADS + it.t) * HEAD_VECS + n] - lane_max[n]);
            lane_sum[n] += weights[n];
        }
        value_block(base, 0u);
        if (2u * CHUNK < DK4) { value_block(base, 2u * CHUNK); }
        if (4u * CHUNK < DK4) { value_block(base, 4u * CHUNK); }
        if (6u * CHUNK < DK4) { value_block(base, 6u * CHUNK); }
    }
}

// Vec4s c0 .. c0 + CHUNK of head h's acc, scaled by f, to lane t's slot of workgroup memory.
fn share_chunk(t: u32, h: u32, f: f32, c0: u32) {
    for (var c = c0; c < min(c0 + CHUNK, DK4); c++) {
        acc_sh[t * DK4 + c] = f * acc[h * DK4 + c];
    }
}

// Head h's accumulator scaled by exp(lane max − m) (h a constant at every call, so acc and
// lane_max keep constant indices).
fn share_head(t: u32, h: u32, m: f32) {
    let f = exp(lane_max[h / 4u][h % 4u] - m);
    share_chunk(t, h, f, 0u);
    if (CHUNK < DK4) { share_chunk(t, h, f, CHUNK); }
    if (2u * CHUNK < DK4) { share_chunk(t, h, f, 2u * CHUNK); }
    if (3u * CHUNK < DK4) { share_chunk(t, h, f, 3u * CHUNK); }
    if (4u * CHUNK < DK4) { share_chunk(t, h, f, 4u * CHUNK); }
    if (5u * CHUNK < DK4) { share_chunk(t, h, f, 5u * CHUNK); }
    if (6u * CHUNK < DK4) { share_chunk(t, h, f, 6u * CHUNK); }
    if (7u * CHUNK < DK4) { share_chunk(t, h, f, 7u * CHUNK); }
}

// Head h's combined state (the lanes' maxima and sums in state_sh, the sink on the first
// chunk) written as the final row or the item's partial state: the lanes' scaled accumulators
// summed through workgroup memory, lane t taking vec4s t, t + THREADS, ...
fn write_head(it: Item, h: u32) {
    let n = h / 4u;
    let e = h % 4u;
    let head = it.head_base + h;
    var m = LOWEST;
    let sink = (p.flags & 1u) != 0u && it.first_chunk == 1u;
    var sink_logit = 0.0;
    if (sink) {
        sink_logit = bitcast<f32>(plan[p.heads_at + head]);
        m = max(m, sink_logit);
    }
    for (var l = 0u; l < THREADS; l++) {
        m = max(m, state_sh[n * THREADS + l][e]);
    }
    var total = 0.0;
    for (var l = 0u; l < THREADS; l++) {
        total += state_sh[(HEAD_VECS + n) * THREADS + l][e] * exp(state_sh[n * THREADS + l][e] - m);
    }
    if (sink) {
        total += exp(sink_logit - m);
    }
    workgroupBarrier();
    switch h {
        case 0u: { share_head(it.t, 0u, m); }
        case 1u: { if (HEADS > 1u) { share_head(it.t, 1u, m); } }
        case 2u: { if (HEADS > 2u) { share_head(it.t, 2u, m); } }
        case 3u: { if (HEADS > 3u) { share_head(it.t, 3u, m); } }
        case 4u: { if (HEADS > 4u) { share_head(it.t, 4u, m); } }
        case 5u: { if (HEADS > 5u) { share_head(it.t, 5u, m); } }
        case 6u: { if (HEADS > 6u) { share_head(it.t, 6u, m); } }
        default: { if (HEADS > 7u) { share_head(it.t, 7u, m); } }
    }
    workgroupBarrier();
    var inv = 0.0;
    var row_lse = neg_inf();
    if (total >= 0.5) {
        inv = 1.0 / total;
        row_lse = m + log(total);
    }
    var base: u32;
    if (it.partial == DIRECT) {
        base = (it.out_row * p.heads + head) * p.head_dim;
    } else {
        base = (it.partial * p.heads + head) * p.head_dim;
    }
    for (var c = it.t; c < DK4; c += THREADS) {
        var o = vec4<f32>(0.0);
        for (var l = 0u; l < THREADS; l++) {
            o += acc_sh[l * DK4 + c];
        }
        o *= inv;
        for (var lane = 0u; lane < 4u; lane++) {
            if (it.partial == DIRECT) {
                out[base + 4u * c + lane] = o[lane];
            } else {
                scratch[base + 4u * c + lane] = o[lane];
            }
        }
    }
    if (it.t == 0u) {
        if (it.partial == DIRECT) {
            if ((p.flags & 4u) != 0u) {
                lse[it.out_row * p.heads + head] = row_lse;
            }
        } else {
            scratch[p.partial_rows * p.heads * p.head_dim + it.partial * p.heads + head] = row_lse;
        }
    }
}

// 3. The lanes' states combined and written, one head at a time.
fn combine_lanes(it: Item, n_heads: u32) {
    for (var n = 0u; n < HEAD_VECS; n++) {
        state_sh[n * THREADS + it.t] = lane_max[n];
        state_sh[(HEAD_VECS + n) * THREADS + it.t] = lane_sum[n];
    }
    workgroupBarrier();
    // A loop with a uniform bound, so the head's barriers and sums are compiled once (each
    // barrier is a suspend point of llvmpipe's lane coroutines). The bound comes apart from
    // `it`, which holds the lane: WGSL's uniformity analysis (Tint's, a browser's) counts the
    // whole struct as varying and would refuse a barrier under a loop bounded by its field.
    for (var h = 0u; h < n_heads; h++) {
        write_head(it, h);
    }
}

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let work = plan_item(wid);
    if (!work.live) {
        return; // uniform across the workgroup: every barrier below is skipped by all threads
    }
    var it: Item;
    it.t = lid.x;
    it.kvh = work.kvh;
    it.n_heads = work.n_heads;
    it.head_base = work.head_base;
    it.out_row = work.q_begin + work.row0;
    // The query's own position: its row is among the sequence's last tokens.
    it.pos = work.kv_len - work.q_len + work.row0;
    it.page_begin = work.page_begin;
    it.key_end = work.key_end;
    it.partial = work.partial;
    it.first_chunk = work.first_chunk;
    it.per_lane = (it.key_end - work.key_begin + THREADS - 1u) / THREADS;
    it.lane_first = work.key_begin + it.t * it.per_lane;

    load_query(it, 0u);
    if (HEADS > 1u) { load_query(it, 1u); }
    if (HEADS > 2u) { load_query(it, 2u); }
    if (HEADS > 3u) { load_query(it, 3u); }
    if (HEADS > 4u) { load_query(it, 4u); }
    if (HEADS > 5u) { load_query(it, 5u); }
    if (HEADS > 6u) { load_query(it, 6u); }
    if (HEADS > 7u) { load_query(it, 7u); }
    score_keys(it);
    add_values(it);
    combine_lanes(it, work.n_heads);
}
