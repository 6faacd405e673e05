// paged_prefill: the paged pass for blocks of query rows on CPU adapters — flash_attention's
// register tiling over keys and values staged from a pool's pages. Same work list, parameters,
// bindings and outputs as paged_attention (paged_common.wgsl is prepended); an item is one
// sequence's block of rows × the query heads of one KV head × a chunk of keys, and its
// (row, head) pairs are the slots: slot s is row s / n_heads, head s % n_heads, and thread t
// owns slots t + THREADS·r (r < ROWS), with q (pre-scaled) and the accumulators in registers,
// so every K/V vec4 staged in workgroup memory feeds ROWS slots — a GQA group's heads share it.
//
// Per tile of KV_TILE keys the threads look up each key's page, stage K and V as vec4s (zero
// past the chunk's end), then take the keys KEY_GROUP at a time with flash_group.wgsl's
// quarter-unrolled row loops: scores, the mask where the group can be masked (one score per
// iteration of a rolled loop, on a copy), the online softmax, P·V. A hidden key scores −inf
// and the running max starts at LOWEST, so a slot that sees no key ends with a sum below 1/2
// and writes 0 with lse −inf, as paged_attention. The row loops indexing private arrays at run
// time work on copies, as in flash_attention.
// Dispatch: one workgroup per item, over x then y.
// The host's prelude (src/kernels/paged_prefill.rs) defines THREADS, ROWS, KV_TILE, KEY_GROUP,
// DK4 (= DV4) and the pool's element type KvElem; the pool's binding and its reads (pool_vec4:
// paged_rows_vec4.wgsl where every row starts on a vec4, else paged_rows_scalar.wgsl),
// flash_kv_shared.wgsl or, on a CPU adapter whose workgroup is one subgroup of 8, flash_kv_subgroup.wgsl
// (group_keys, group_values) and flash_group.wgsl are prepended.

const DV4: u32 = DK4;

@group(0) @binding(1) var<storage, read> q: array<f32>;   // see PagedParams::q_offset

var<workgroup> k_tile: array<vec4<f32>, KV_TILE * DK4>;
var<workgroup> v_tile: array<vec4<f32>, KV_TILE * DV4>;
var<workgroup> key_row: array<u32, KV_TILE>;   // each staged key's K row in the pool

// Whether the mask can change any score of keys j .. j + KEY_GROUP − 1 for the block's rows at
// positions [pos0, pos_last] (uniform over the workgroup).
fn group_needs_mask(j: u32, pos0: u32, pos_last: u32) -> bool {
    if (p.softcap > 0.0 || (p.flags & 2u) != 0u) {
        return true;
    }
    if (p.causal == 1u && j + KEY_GROUP - 1u > pos0) {
        return true;
    }
    return p.window_left != NO_WINDOW && j + p.window_left < pos_last;
}

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let work = plan_item(wid);
    if (!work.live) {
        return; // uniform across the workgroup: every barrier below is skipped by all threads
    }
    let slots = work.n_heads * work.rows;
    // The block's rows are among the sequence's last tokens.
    let pos0 = work.kv_len - work.q_len + work.row0;
    let pos_last = pos0 + work.rows - 1u;
    let lane = kv_lane(lid.x);  // for group_keys and group_values
    // The vec4s of the real head size (past it q, K and V are zero): a runtime trip count, which
    // also keeps Mesa's GLSL compiler from unrolling the head-size loops (see flash_attention).
    let head_vecs = (p.head_dim + 3u) / 4u;

    // The slots' state (q_regs, acc, scores, row_max, row_sum, correction) is flash_group.wgsl's
    // private arrays.
    // Through copies: this loop stays rolled. A sink starts its head's softmax on the first
    // chunk (max = its logit, sum = exp(0) = 1).
    var start_max: array<f32, ROWS>;
    var start_sum: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        let slot = lid.x + THREADS * r;
        start_max[r] = LOWEST;
        start_sum[r] = 0.0;
        if (slot < slots) {
            let head = work.head_base + slot % work.n_heads;
            if ((p.flags & 1u) != 0u && work.first_chunk == 1u) {
                start_max[r] = bitcast<f32>(plan[p.heads_at + head]);
                start_sum[r] = 1.0;
            }
            let q_at = p.q_offset + (work.q_begin + work.row0 + slot / work.n_heads) * p.q_row + head * p.q_head;
            for (var c = 0u; c < head_vecs; c++) {
                var x = vec4<f32>(0.0);
                for (var e = 0u; e < 4u; e++) {
                    if (4u * c + e < p.head_dim) {
                        x[e] = q[q_at + 4u * c + e];
                    }
                }
                q_regs[r][c] = p.scale * x;
            }
        }
    }
    row_max = start_max;
    row_sum = start_sum;

    // Slots r >= live_rows of every thread are past the item's (uniform).
    let live_rows = (slots + THREADS - 1u) / THREADS;
    let v_stride = p.page_size * p.kv_heads * p.head_dim;
    for (var j0 = work.key_begin; j0 < work.key_end; j0 += KV_TILE) {
        let keys = min(KV_TILE, work.key_end - j0);
        for (var e = lid.x; e < keys; e += THREADS) {
            let j = j0 + e;
            let page = plan[p.indices_at + work.page_begin + (j >> p.page_shift)];
            key_row[e] = pool_index(page, 0u, j & (p.page_size - 1u), work.kvh, 0u);
        }
        workgroupBarrier();
        for (var e = lid.x; e < KV_TILE * DK4; e += THREADS) {
            let key = e / DK4;
            let live = key < keys;
            let base = key_row[min(key, keys - 1u)];
            k_tile[e] = pool_vec4(base, e % DK4, live);
            v_tile[e] = pool_vec4(base + v_stride, e % DK4, live);
        }
        workgroupBarrier();
        for (var jg = 0u; jg < keys; jg += KEY_GROUP) {
            scores = GroupScores();
            for (var c = 0u; c < head_vecs; c++) {
                let k = group_keys(jg, c, lane);
                add_group_dots_all(live_rows, c, k);
            }
            let left = keys - jg;  // keys of this group that exist (at least 1)
            if (left < KEY_GROUP || group_needs_mask(j0 + jg, pos0, pos_last)) {
                // Through a copy: this loop stays rolled, one score per iteration.
                var masked = scores;
                for (var e = 0u; e < ROWS * KEY_GROUP; e++) {
                    let r = e / KEY_GROUP;
                    let jj = e % KEY_GROUP;
                    let slot = min(lid.x + THREADS * r, slots - 1u);
                    let pos = pos0 + slot / work.n_heads;
                    let key = j0 + jg + jj;
                    var score = masked[r][jj / 4u][jj % 4u];
                    if (p.softcap > 0.0) {
                        score = p.softcap * tanh(score / p.softcap);
                    }
                    if ((p.flags & 2u) != 0u) {
                        let slope = bitcast<f32>(plan[p.heads_at + p.heads + work.head_base + slot % work.n_heads]);
                        score += slope * (f32(key) - f32(pos));
                    }
                    var visible = jj < left;
                    if (p.causal == 1u) {
                        visible = visible && key <= pos;
                    }
                    if (p.window_left != NO_WINDOW) {
                        visible = visible && key + p.window_left >= pos;
                    }
                    masked[r][jj / 4u][jj % 4u] = select(neg_inf(), score, visible);
                }
                scores = masked;
            }
            group_softmax_all();
            for (var c = 0u; c < head_vecs; c++) {
                let v = group_values(jg, c, lane);
                add_group_values_all(live_rows, c, v);
            }
        }
        workgroupBarrier();
    }

    // Through copies from here on: these loops stay rolled.
    let final_max = row_max;
    let final_sum = row_sum;
    for (var r = 0u; r < ROWS; r++) {
        let slot = lid.x + THREADS * r;
        if (slot < slots) {
            let head = work.head_base + slot % work.n_heads;
            let out_row = work.q_begin + work.row0 + slot / work.n_heads;
            var inv = 0.0;
            var row_lse = neg_inf();
            if (final_sum[r] >= 0.5) {
                inv = 1.0 / final_sum[r];
                row_lse = final_max[r] + log(final_sum[r]);
            }
            var base: u32;
            if (work.partial == DIRECT) {
                base = (out_row * p.heads + head) * p.head_dim;
            } else {
                base = ((work.partial + slot / work.n_heads) * p.heads + head) * p.head_dim;
            }
            for (var c = 0u; c < head_vecs; c++) {
                let o = acc[r][c] * inv;
                for (var e = 0u; e < 4u; e++) {
                    if (4u * c + e < p.head_dim) {
                        if (work.partial == DIRECT) {
                            out[base + 4u * c + e] = o[e];
                        } else {
                            scratch[base + 4u * c + e] = o[e];
                        }
                    }
                }
            }
            if (work.partial == DIRECT) {
                if ((p.flags & 4u) != 0u) {
                    lse[out_row * p.heads + head] = row_lse;
                }
            } else {
                let at = p.partial_rows * p.heads * p.head_dim + (work.partial + slot / work.n_heads) * p.heads;
                scratch[at + head] = row_lse;
            }
        }
    }
}
