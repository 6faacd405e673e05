// paged_decode: the paged pass for decode batches on CPU adapters (every sequence runs one
// query row), where each lane takes keys of its own. Same work list, parameters, bindings and
// outputs as paged_attention (paged_common.wgsl is prepended); an item is one
// sequence's row × the query heads of one KV head × a chunk of keys.
//
// On llvmpipe a workgroup of 8 is one SIMD vector and every lane-wide load is a loop over the
// lanes, so staging a key's head across lanes through workgroup memory (paged_attention) saves
// no load and adds exchanges. Here each lane takes a run of consecutive keys whole — each
// lane's reads one stream — with every head's q in registers, in two passes: the scores (kept
// in workgroup memory, each lane its own) and the lane's max per head; then the weights
// exp(s − max), their sum and weight · V. The lanes' states are then combined (the largest
// max, each lane's sum and accumulator scaled by exp(m − M)), with the sink on the first
// chunk, into the final row or a partial state as paged_attention writes them.
// Loops that index the private arrays have constant bounds (HEADS, DK4), so they unroll.
// Dispatch: one workgroup per item, over x then y.
// The host's prelude defines THREADS, HEADS (query heads per item, a power of two ≤ 8), DK4,
// KEYS (most keys of an item: a multiple of THREADS) and the pool's element type KvElem.

var<private> qv: array<vec4<f32>, HEADS * DK4>;
var<private> acc: array<vec4<f32>, HEADS * DK4>;
var<private> lane_max: array<f32, HEADS>;
var<private> lane_sum: array<f32, HEADS>;
var<private> dots: array<f32, HEADS>;

var<workgroup> key_scores: array<f32, KEYS * HEADS>;
var<workgroup> state: array<f32, 2u * HEADS * THREADS>;   // lanes' maxima, then sums
var<workgroup> acc_sh: array<vec4<f32>, THREADS * DK4>;   // one head's accumulators

// The vec4 of columns 4c .. 4c + 3 of the pool row at `base` (0 past the head size).
fn row4(base: u32, c: u32) -> vec4<f32> {
    let at = base + 4u * c;
    if (4u * c + 3u < p.head_dim) {
        return vec4<f32>(f32(pool[at]), f32(pool[at + 1u]), f32(pool[at + 2u]), f32(pool[at + 3u]));
    }
    var x = vec4<f32>(0.0);
    for (var lane = 0u; lane < 4u; lane++) {
        if (4u * c + lane < p.head_dim) {
            x[lane] = f32(pool[at + lane]);
        }
    }
    return x;
}

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    let item = wid.y * p.groups_x + wid.x;
    if (item >= p.items) {
        return; // uniform across the workgroup: every barrier below is skipped by all threads
    }
    let w = item * ITEM_WORDS;
    let seq = plan[w];
    let kvh = plan[w + 1u];
    let head0 = plan[w + 2u];
    let n_heads = plan[w + 3u];
    let row = plan[w + 4u];
    let key_begin = plan[w + 6u];
    let key_end = plan[w + 7u];
    let partial = plan[w + 8u];
    let first_chunk = plan[w + 9u];
    let s = p.seqs_at + seq * SEQ_WORDS;
    let q_begin = plan[s];
    let q_len = plan[s + 1u];
    let kv_len = plan[s + 2u];
    let page_begin = plan[s + 3u];
    let head_base = kvh * (p.heads / p.kv_heads) + head0;
    // The query's own position: its row is among the sequence's last tokens.
    let pos = kv_len - q_len + row;

    for (var h = 0u; h < HEADS; h++) {
        let q_at = p.q_offset + (q_begin + row) * p.q_row + (head_base + h) * p.q_head;
        for (var c = 0u; c < DK4; c++) {
            var x = vec4<f32>(0.0);
            for (var lane = 0u; lane < 4u; lane++) {
                if (h < n_heads && 4u * c + lane < p.head_dim) {
                    x[lane] = q[q_at + 4u * c + lane];
                }
            }
            qv[h * DK4 + c] = x;
            acc[h * DK4 + c] = vec4<f32>(0.0);
        }
        lane_max[h] = LOWEST;
        lane_sum[h] = 0.0;
    }

    // This lane's run of keys.
    let per_lane = (key_end - key_begin + THREADS - 1u) / THREADS;
    let first = min(key_begin + t * per_lane, key_end);
    let last = min(first + per_lane, key_end);
    let v_stride = p.page_size * p.kv_heads * p.head_dim;

    // 1. Scores, and the lane's max per head.
    for (var j = first; j < last; j++) {
        let page = plan[p.indices_at + page_begin + (j >> p.page_shift)];
        let base = pool_index(page, 0u, j & (p.page_size - 1u), kvh, 0u);
        for (var h = 0u; h < HEADS; h++) {
            dots[h] = 0.0;
        }
        for (var c = 0u; c < DK4; c++) {
            let k = row4(base, c);
            for (var h = 0u; h < HEADS; h++) {
                dots[h] += dot(qv[h * DK4 + c], k);
            }
        }
        var visible = true;
        if (p.causal == 1u) {
            visible = j <= pos;
        }
        if (p.window_left != NO_WINDOW) {
            visible = visible && j + p.window_left >= pos;
        }
        for (var h = 0u; h < HEADS; h++) {
            var score = neg_inf();
            if (visible && h < n_heads) {
                score = dots[h] * p.scale;
                if (p.softcap > 0.0) {
                    score = p.softcap * tanh(score / p.softcap);
                }
                if ((p.flags & 2u) != 0u) {
                    let slope = bitcast<f32>(plan[p.heads_at + p.heads + head_base + h]);
                    score += slope * (f32(j) - f32(pos));
                }
            }
            key_scores[(j - key_begin) * HEADS + h] = score;
            lane_max[h] = max(lane_max[h], score);
        }
    }

    // 2. Weights against the lane's max, their sum, and weight · V.
    for (var j = first; j < last; j++) {
        let page = plan[p.indices_at + page_begin + (j >> p.page_shift)];
        let base = pool_index(page, 0u, j & (p.page_size - 1u), kvh, 0u) + v_stride;
        for (var h = 0u; h < HEADS; h++) {
            dots[h] = exp(key_scores[(j - key_begin) * HEADS + h] - lane_max[h]);
            lane_sum[h] += dots[h];
        }
        for (var c = 0u; c < DK4; c++) {
            let v = row4(base, c);
            for (var h = 0u; h < HEADS; h++) {
                acc[h * DK4 + c] += dots[h] * v;
            }
        }
    }

    // 3. The lanes' states combined, head by head, into the row's output or partial state.
    for (var h = 0u; h < HEADS; h++) {
        state[h * THREADS + t] = lane_max[h];
        state[(HEADS + h) * THREADS + t] = lane_sum[h];
    }
    workgroupBarrier();
    for (var h = 0u; h < HEADS; h++) {
        let head = head_base + h;
        var m = LOWEST;
        let sink = (p.flags & 1u) != 0u && first_chunk == 1u && h < n_heads;
        var sink_logit = 0.0;
        if (sink) {
            sink_logit = bitcast<f32>(plan[p.heads_at + head]);
            m = max(m, sink_logit);
        }
        for (var l = 0u; l < THREADS; l++) {
            m = max(m, state[h * THREADS + l]);
        }
        var total = 0.0;
        for (var l = 0u; l < THREADS; l++) {
            total += state[(HEADS + h) * THREADS + l] * exp(state[h * THREADS + l] - m);
        }
        if (sink) {
            total += exp(sink_logit - m);
        }
        let f = exp(lane_max[h] - m);
        for (var c = 0u; c < DK4; c++) {
            acc_sh[t * DK4 + c] = acc[h * DK4 + c] * f;
        }
        workgroupBarrier();
        var inv = 0.0;
        var row_lse = neg_inf();
        if (total >= 0.5) {
            inv = 1.0 / total;
            row_lse = m + log(total);
        }
        if (h < n_heads) {
            for (var c = t; c < DK4; c += THREADS) {
                var o = vec4<f32>(0.0);
                for (var l = 0u; l < THREADS; l++) {
                    o += acc_sh[l * DK4 + c];
                }
                o *= inv;
                var base: u32;
                if (partial == DIRECT) {
                    base = ((q_begin + row) * p.heads + head) * p.head_dim;
                } else {
                    base = (partial * p.heads + head) * p.head_dim;
                }
                for (var lane = 0u; lane < 4u; lane++) {
                    if (4u * c + lane < p.head_dim) {
                        if (partial == DIRECT) {
                            out[base + 4u * c + lane] = o[lane];
                        } else {
                            scratch[base + 4u * c + lane] = o[lane];
                        }
                    }
                }
            }
            if (t == 0u) {
                if (partial == DIRECT) {
                    if ((p.flags & 4u) != 0u) {
                        lse[(q_begin + row) * p.heads + head] = row_lse;
                    }
                } else {
                    scratch[p.partial_rows * p.heads * p.head_dim + partial * p.heads + head] =
                        row_lse;
                }
            }
        }
        workgroupBarrier();
    }
}
