// paged_attention: attention of ragged query rows over keys and values held in the pages of a
// pool, one workgroup per work item of a plan (src/serve/plan.rs). An item is one sequence's
// block of query rows × a block of the query heads of one KV head × one chunk of its keys; it
// keeps an online softmax per (row, head) slot and writes either the final row (out, lse) or,
// when the keys were split into chunks, a partial state that `paged_merge` combines.
//
// Per tile of KEY_TILE keys: the threads stage K and V from their pages into workgroup memory,
// score every (slot, key) pair, update each slot's running max and sum, and add P·V into the
// slots' accumulators in workgroup memory, a (slot, value column) pair per thread at a time.
// Dispatch: one workgroup per item, over x then y (groups_x per row).
// The host's prelude defines THREADS, SLOTS, KEY_TILE, DK4, DV4 and the pool's element type
// KvElem; paged_common.wgsl is prepended, then the pool's binding and its reads (pool_vec4:
// paged_rows_scalar.wgsl, or paged_rows_quant.wgsl for a quantized pool).

@group(0) @binding(1) var<storage, read> q: array<f32>;   // see PagedParams::q_offset

var<workgroup> q_tile: array<vec4<f32>, SLOTS * DK4>;
var<workgroup> k_tile: array<vec4<f32>, KEY_TILE * DK4>;
var<workgroup> v_tile: array<vec4<f32>, KEY_TILE * DV4>;
var<workgroup> scores: array<f32, SLOTS * KEY_TILE>;
var<workgroup> row_max: array<f32, SLOTS>;
var<workgroup> row_sum: array<f32, SLOTS>;
var<workgroup> row_scale: array<f32, SLOTS>;
// Each slot's output accumulators (a private array indexed at run time would be per-lane
// gathers on llvmpipe).
var<workgroup> acc: array<vec4<f32>, SLOTS * DV4>;
// Per slot: its query's position and head; per key of a tile: its K row's first element
// (V's follows at v_stride) — worked out once, not per element (integer division is per lane
// on a CPU adapter).
var<workgroup> slot_pos: array<u32, SLOTS>;
var<workgroup> slot_head: array<u32, SLOTS>;
var<workgroup> key_base: array<u32, KEY_TILE>;

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    let work = plan_item(wid);
    if (!work.live) {
        return; // uniform across the workgroup: every barrier below is skipped by all threads
    }

    // Stage the slots' query rows (slot = row · n_heads + head within the item), a vec4 per
    // thread at a time (lanes past the head size stay 0).
    for (var e = t; e < SLOTS * DK4; e += THREADS) {
        let slot = e / DK4;
        let c = e % DK4;
        var x = vec4<f32>(0.0);
        if (slot < work.rows * work.n_heads) {
            let row = work.q_begin + work.row0 + slot / work.n_heads;
            let h = work.head_base + slot % work.n_heads;
            let base = p.q_offset + row * p.q_row + h * p.q_head;
            for (var lane = 0u; lane < 4u; lane++) {
                if (c * 4u + lane < p.head_dim) {
                    x[lane] = q[base + c * 4u + lane];
                }
            }
        }
        q_tile[e] = x;
    }
    // Each slot's running state starts empty, or at its sink (a logit of value zero).
    if (t < SLOTS) {
        let h = work.head_base + t % max(work.n_heads, 1u);
        if ((p.flags & 1u) != 0u && work.first_chunk == 1u) {
            row_max[t] = bitcast<f32>(plan[p.heads_at + h]);
            row_sum[t] = 1.0;
        } else {
            row_max[t] = LOWEST;
            row_sum[t] = 0.0;
        }
    }
    for (var e = t; e < SLOTS * DV4; e += THREADS) {
        acc[e] = vec4<f32>(0.0);
    }
    if (t < SLOTS) {
        // The query's own position: its rows are the sequence's last tokens.
        slot_pos[t] = work.kv_len - work.q_len + work.row0 + t / max(work.n_heads, 1u);
        slot_head[t] = work.head_base + t % max(work.n_heads, 1u);
    }
    let busy_slots = work.rows * work.n_heads;
    // V's element of a key follows its K's by one page half.
    let v_stride = p.page_size * p.kv_heads * p.head_dim;
    workgroupBarrier();

    for (var tile = work.key_begin; tile < work.key_end; tile += KEY_TILE) {
        // Where each key of the tile lies: its page from the table, its row in the page.
        for (var key = t; key < KEY_TILE; key += THREADS) {
            let j = min(tile + key, work.key_end - 1u);
            let page = plan[p.indices_at + work.page_begin + (j >> p.page_shift)];
            key_base[key] = pool_index(page, 0u, j & (p.page_size - 1u), work.kvh, 0u);
        }
        workgroupBarrier();
        // K and V of keys tile .. tile + KEY_TILE (zero past key_end: never read past a chunk;
        // a key past it reads the chunk's last key's row, as key_base holds).
        for (var e = t; e < KEY_TILE * DK4; e += THREADS) {
            let key = e / DK4;
            let c = e % DK4;
            let live = tile + key < work.key_end;
            let kx = pool_vec4(key_base[key], c, live);
            let vx = pool_vec4(key_base[key] + v_stride, c, live);
            k_tile[e] = kx;
            v_tile[key * DV4 + c] = vx;
        }
        workgroupBarrier();

        // Scores of every (slot, key) pair: scaled, capped, biased, masked.
        for (var e = t; e < SLOTS * KEY_TILE; e += THREADS) {
            let slot = e / KEY_TILE;
            let key = e % KEY_TILE;
            let j = tile + key;
            let pos = slot_pos[slot];
            let h = slot_head[slot];
            var visible = slot < busy_slots && j < work.key_end;
            if (p.causal == 1u) {
                visible = visible && j <= pos;
            }
            if (p.window_left != NO_WINDOW) {
                visible = visible && j + p.window_left >= pos;
            }
            var score = neg_inf();
            if (visible) {
                var qk = 0.0;
                for (var c = 0u; c < DK4; c++) {
                    qk += dot(q_tile[slot * DK4 + c], k_tile[key * DK4 + c]);
                }
                score = qk * p.scale;
                if (p.softcap > 0.0) {
                    score = p.softcap * tanh(score / p.softcap);
                }
                if ((p.flags & 2u) != 0u) {
                    let slope = bitcast<f32>(plan[p.heads_at + p.heads + h]);
                    score += slope * (f32(j) - f32(pos));
                }
            }
            scores[e] = score;
        }
        workgroupBarrier();

        // Each slot's online softmax: new max, rescale of what came before, this tile's weights.
        if (t < SLOTS) {
            let old_max = row_max[t];
            var new_max = old_max;
            for (var key = 0u; key < KEY_TILE; key++) {
                new_max = max(new_max, scores[t * KEY_TILE + key]);
            }
            let rescale = exp(old_max - new_max);
            var sum = row_sum[t] * rescale;
            for (var key = 0u; key < KEY_TILE; key++) {
                let weight = exp(scores[t * KEY_TILE + key] - new_max);
                scores[t * KEY_TILE + key] = weight;
                sum += weight;
            }
            row_max[t] = new_max;
            row_sum[t] = sum;
            row_scale[t] = rescale;
        }
        workgroupBarrier();

        // acc = acc · rescale + Σ_key weight · v, a (slot, column) pair per thread at a time.
        for (var e = t; e < SLOTS * DV4; e += THREADS) {
            let slot = e / DV4;
            let c = e % DV4;
            var sum = acc[e] * row_scale[slot];
            for (var key = 0u; key < KEY_TILE; key++) {
                sum += scores[slot * KEY_TILE + key] * v_tile[key * DV4 + c];
            }
            acc[e] = sum;
        }
        workgroupBarrier();
    }

    // Each slot's normalised output and log-sum-exp (natural log), final or partial.
    for (var e = t; e < SLOTS * DV4; e += THREADS) {
        let slot = e / DV4;
        let c = e % DV4;
        if (slot >= work.rows * work.n_heads) {
            continue;
        }
        let row = work.row0 + slot / work.n_heads;
        let h = work.head_base + slot % work.n_heads;
        let sum = row_sum[slot];
        var inv = 0.0;
        var row_lse = neg_inf();
        if (sum >= 0.5) {
            inv = 1.0 / sum;
            row_lse = row_max[slot] + log(sum);
        }
        let o = acc[e] * inv;
        if (work.partial == DIRECT) {
            let base = ((work.q_begin + row) * p.heads + h) * p.head_dim;
            if (c == 0u && (p.flags & 4u) != 0u) {
                lse[(work.q_begin + row) * p.heads + h] = row_lse;
            }
            for (var lane = 0u; lane < 4u; lane++) {
                if (c * 4u + lane < p.head_dim) {
                    out[base + c * 4u + lane] = o[lane];
                }
            }
        } else {
            let prow = work.partial + row - work.row0;
            let base = (prow * p.heads + h) * p.head_dim;
            if (c == 0u) {
                scratch[p.partial_rows * p.heads * p.head_dim + prow * p.heads + h] = row_lse;
            }
            for (var lane = 0u; lane < 4u; lane++) {
                if (c * 4u + lane < p.head_dim) {
                    scratch[base + c * 4u + lane] = o[lane];
                }
            }
        }
    }
}
