// flash_attention: scores + mask + online softmax + P·V in one pass, no [Lq, Lk] buffer.
// One workgroup takes BLOCK_Q = THREADS·ROWS query rows of one (batch, head); each of its
// THREADS threads (8 on CPU adapters, 64 on GPUs) owns ROWS query rows (see `rows_per_thread`), with q
// and the output accumulators in registers as vec4s, so every K/V value read from workgroup
// memory feeds 4·ROWS multiply-adds. K/V tiles of KV_TILE keys (a multiple of KEY_GROUP) are
// staged in workgroup memory, zero-padded to whole vec4s and whole tiles.
// Keys are consumed KEY_GROUP (16, or 8 where a tile of 16 does not fit) at a time: a row's
// scores of a group are GROUP_VECS vec4s, and the online softmax rescales once per group.
// A runtime index into a private array makes llvmpipe gather and scatter per lane on *every*
// access of that array, anywhere in the shader, so the per-row arrays (scores, max, sum,
// correction) are indexed only in loops the compiler unrolls: loops with a constant trip
// count and small bodies. Lavapipe's compiler unrolls a loop over 4 rows of a 16-key group but
// not over 16 rows, so the key group's row loops run in quarters (the functions below, each
// called for rows [0, ROWS/4), [ROWS/4, ROWS/2), ...). Loops that must stay rolled (the mask,
// the carry, the output) work on copies. q and acc are indexed by the head-size vec4 of a
// rolled loop and stay gathered, which is what makes a 16-key group pay: each gather then
// serves twice the keys. At d64 with 16 rows (lavapipe, the pass alone, interleaved runs):
// 8-key groups with their row loops in halves ran 1.6x the speed of the kernel whose loops
// stayed rolled, and 16-key groups in quarters 1.7x that again.
// Masked scores are replaced by -1e9 like the multi-pass path, so a fully masked row still
// averages V over all keys. Keys past Lk in the last tile score -inf and weigh exactly 0.
// Finite scores as low as -f32::MAX (an additive mask of torch.finfo(float32).min) are ordinary
// scores: the running max starts at exactly -f32::MAX, so it is finite from the start and every
// exponent s - max is either -inf - finite or finite - finite, never -inf - (-inf) = NaN; a row
// whose scores are all -f32::MAX is uniform, as torch's f32 softmax gives it (see LOWEST).
// Tiles that are masked for every row of the block (causal, key padding) are skipped, but
// only when every row of the block sees at least one key: skipping is then exact, because
// exp(-1e9 - m) is 0 in f32.
// Long key ranges are split over several dispatches (tiles [tile_begin, tile_end) each): a
// dispatch that is not the last stores each row's running max, sum and accumulator in
// `carry`, and the next one resumes from it. That bounds the work of one invocation (software
// rasterisers cap a shader's loop iterations; desktop drivers reset long-running dispatches).
// Dispatch: (ceil(Lq / BLOCK_Q), B·H, 1) per key range; z offset as in scores.
//
// The host's prelude (src/kernels/flash_attention.rs) defines HEAD_CAP_QK and HEAD_CAP_V, the
// head sizes the registers and tiles are laid out for (the module's own, rounded up to a
// bucket: see `head_cap`; vec4s past the real size p.head_dim_qk / p.head_dim_v are zero, so
// they add nothing to a score and are never written out), KV_TILE (keys per staged tile),
// KEY_GROUP (8 or 16: keys scored at once), ROWS (rows per thread, per device), THREADS (8:
// one SIMD vector of llvmpipe; 64 on GPUs), CARRY_IN and CARRY_OUT, and the element type
// QkvElem of Q/K/V (f32, or f16 in an f16 module; widened to f32 on load).
const BLOCK_Q: u32 = ROWS * THREADS;
const DK4: u32 = (HEAD_CAP_QK + 3u) / 4u;      // vec4s per q/k row held
const DV4: u32 = (HEAD_CAP_V + 3u) / 4u;       // vec4s per v row held
const GROUP_VECS: u32 = KEY_GROUP / 4u;        // a row's scores of one key group, as vec4s
// The running max's start: exactly -f32::MAX (-3.402823e38 would round 2 ulps above it, and
// a score of -f32::MAX would then weigh exp(-4e31) = 0 and leave its row 0/0).
const LOWEST: f32 = -3.4028234663852886e38;

struct FlashParams {
    q: RowStrides, // where each tensor's rows lie (rows.wgsl); K's and V's heads are
    k: RowStrides, // key/value heads, and their rows are counted from key_base
    v: RowStrides,
    o: RowStrides,
    lq: u32,
    lk: u32,
    heads: u32,
    scale: f32,
    z_offset: u32,
    tile_begin: u32,  // key tiles this dispatch covers: [tile_begin, tile_end)
    tile_end: u32,
    carry_flags: u32, // CARRY_IN: resume from `carry`; CARRY_OUT: store to `carry`, not `out`
    kv_group: u32,    // query heads per key/value head (1, or H / H_kv for GQA/MQA)
    key_base: u32,    // the key in row 0 of the bound K/V (a KV cache's chunk start)
    head_dim_qk: u32, // the module's head sizes (at most HEAD_CAP_QK, HEAD_CAP_V)
    head_dim_v: u32,
    sinks: u32,       // 1: each head's softmax starts from its sink logit (gpt-oss)
    sink_base: u32,   // where those logits lie in `carry` (one per query head)
    k_scales: u32,    // a quantized K's and V's scales plane, in words (kv_quant.wgsl)
    v_scales: u32,
}

// Carried floats per query row: max, sum, and the accumulator's vec4s of the real head size.
fn carry_stride() -> u32 {
    return 2u + 4u * ((p.head_dim_v + 3u) / 4u);
}

@group(0) @binding(0) var<uniform> p: FlashParams;
// Q, K and V, bindings 1-3: declared with their loads by flash_rows_float.wgsl or
// flash_rows_quant.wgsl (the host appends one).
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
// Carried state; with sinks, also one logit per query head at p.sink_base (folded in here so
// that the pass binds 6 storage buffers, what the crate asks of a device).
@group(0) @binding(5) var<storage, read_write> carry: array<f32>;

var<workgroup> k_tile: array<vec4<f32>, KV_TILE * DK4>;
var<workgroup> v_tile: array<vec4<f32>, KV_TILE * DV4>;

// One past the last tile any row of queries [i0, i1) can see (uniform over the workgroup).
fn tiles_to_visit(b: u32, i0: u32, i1: u32) -> u32 {
    let all_tiles = (p.lk + KV_TILE - 1u) / KV_TILE;
    // A sliding window is causal too: no key past the diagonal.
    if (mask.kind == MASK_CAUSAL || mask.kind == MASK_SLIDING_WINDOW || mask.kind == MASK_CAUSAL_KEEP) {
        // Every row sees a key iff the first row does (i0 + offset >= 0); with padding, iff
        // each row's keys hold a real one.
        // A chunk may leave a padded row no real key its window check sees: all tiles then.
        let padded = mask.kind == MASK_CAUSAL_KEEP
            && (mask.chunk > 0u || !every_row_sees_a_real_key(b, i0, i1));
        if (i32(i0) + mask.causal_offset >= 0 && !padded) {
            let last_key = u32(i32(i1 - 1u) + mask.causal_offset);
            return min(all_tiles, last_key / KV_TILE + 1u);
        }
    }
    if (mask.kind == MASK_KEY_PADDING) {
        let valid = mask_words[mask.batch_base + b];
        if (valid > 0u) {
            return min(all_tiles, (valid + KV_TILE - 1u) / KV_TILE);
        }
    }
    return all_tiles;
}

// MASK_CAUSAL_KEEP: whether every row of [i0, i1) (with i0 + offset >= 0) sees a real key
// among its keys (i + offset - window, i + offset]. A row that sees none averages V over all Lk
// keys (every score -1e9), so its block must skip no tile. One sweep over the block's keys,
// tracking the last real one; plain causal stops at the first real key. Top-left aligned with
// Lq > Lk, a diagonal lies past the last key: keys from Lk on do not exist (never real).
fn every_row_sees_a_real_key(b: u32, i0: u32, i1: u32) -> bool {
    let first = i32(i0) + mask.causal_offset;
    if (mask.window == 0u) {
        // Each row sees every key the row before it sees: the first row decides.
        for (var j = 0; j <= min(first, i32(p.lk) - 1); j++) {
            if (key_kept(b, u32(j))) {
                return true;
            }
        }
        return false;
    }
    let w = i32(mask.window);
    let last = i32(i1 - 1u) + mask.causal_offset;
    var last_real = -2147483647;  // none yet: at most j - w for every j >= 0
    for (var j = max(0, first - w + 1); j <= last; j++) {
        if (u32(j) < p.lk && key_kept(b, u32(j))) {
            last_real = j;
        }
        // Row j - offset's newest key is j: it sees a real one iff the last is within w.
        if (j >= first && last_real <= j - w) {
            return false;
        }
    }
    return true;
}

// Whether the mask can change any score of keys j .. j + KEY_GROUP - 1 for rows [i0, i1) (uniform over the
// workgroup). Where it cannot, the key group skips the mask code (see the tile loop): most of
// a causal block's groups lie wholly below the diagonal.
fn group_needs_mask(b: u32, i0: u32, i1: u32, j: u32) -> bool {
    let first_key = i32(j);
    let last_key = first_key + i32(KEY_GROUP) - 1;
    // A soft-cap, ALiBi or a temperature changes every score; a chunk's start is per row.
    if (mask.softcap > 0.0 || mask.alibi_heads > 0u || mask.temp_floor_scale > 0.0 || mask.chunk > 0u) {
        return true;
    }
    switch mask.kind {
        case MASK_NONE: {
            return false;
        }
        case MASK_CAUSAL: {
            // Row i sees key k iff k <= i + offset: the first row sees the least.
            return last_key > i32(i0) + mask.causal_offset;
        }
        case MASK_SLIDING_WINDOW: {
            // ... and k > i + offset - window: the last row sees the least far back.
            let oldest = i32(i1 - 1u) + mask.causal_offset - i32(mask.window);
            return last_key > i32(i0) + mask.causal_offset || first_key <= oldest;
        }
        case MASK_KEY_PADDING: {
            return j + KEY_GROUP > mask_words[mask.batch_base + b];
        }
        case MASK_CAUSAL_KEEP: {
            // Causal (or windowed) as above, and then only a padded key of the group masks.
            if (last_key > i32(i0) + mask.causal_offset) {
                return true;
            }
            if (mask.window > 0u && first_key <= i32(i1 - 1u) + mask.causal_offset - i32(mask.window)) {
                return true;
            }
            // Called for whole groups only (a partial one is masked anyway): keys in range.
            for (var k = 0u; k < KEY_GROUP; k++) {
                if (!key_kept(b, j + k)) {
                    return true;
                }
            }
            return false;
        }
        default: {
            return true;
        }
    }
}

// Which buffer a row is read from (a literal at every call, so the switch folds away).
const Q_ROW: u32 = 0u;
const K_ROW: u32 = 1u;
const V_ROW: u32 = 2u;

// A quiet NaN. WGSL rejects NaN constants, so the bits are made a runtime value.
fn nan() -> f32 {
    return bitcast<f32>(0x7fc00000u | (p.lk & 0u));
}

// Marks in v_tile[c] (free after the tile loop) the components of the V vec4s that hold a
// non-finite value at any key of tiles [t0, t1) of (batch, head) z: 0·V is NaN there, as
// PyTorch computes it. Tested on the bits (an exponent of all ones), which no fast-math folding
// touches. Threads split the keys; every write stores the same 1.0, so racing writes agree.
// Control flow is uniform, since t0 and t1 are. The flags are read where the output (or the
// carry) is written: a per-vec4 array of flags held here instead cost lavapipe 28 s of compile
// at v = 512 (its copies unroll), against nothing measurable this way.
fn mark_skipped_non_finite(z: u32, t0: u32, t1: u32, thread: u32) {
    for (var c = thread; c < DV4; c += THREADS) {
        v_tile[c] = vec4<f32>(0.0);
    }
    workgroupBarrier();
    let exponent = vec4<u32>(0x7f800000u);
    for (var j = t0 * KV_TILE + thread; j < min(t1 * KV_TILE, p.lk); j += THREADS) {
        let base = row_start(p.v, z / p.heads, (z % p.heads) / p.kv_group, j - p.key_base);
        for (var c = 0u; c < (p.head_dim_v + 3u) / 4u; c++) {
            let bits = bitcast<vec4<u32>>(staged_vec4(V_ROW, base, 4u * c, p.head_dim_v, true));
            let bad = (bits & exponent) == exponent;
            for (var e = 0u; e < 4u; e++) {
                if (bad[e]) {
                    v_tile[c][e] = 1.0;
                }
            }
        }
    }
    workgroupBarrier();
}

// Head-size vec4 c of a row's result, NaN in the components marked by mark_skipped_non_finite
// when `poisoned` (uniform: whether any tile was skipped).
fn poison(o: vec4<f32>, c: u32, poisoned: bool) -> vec4<f32> {
    if (poisoned) {
        return select(o, vec4<f32>(nan()), v_tile[c] != vec4<f32>(0.0));
    }
    return o;
}

// -inf, made a runtime value (WGSL rejects infinite constants).
fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u | (p.lk & 0u));
}

// Row i's scaled score of key j with the mask applied. A key past Lk (`exists` false, in the
// last tile) gets -inf, so it weighs exactly 0 (a row's max is at least LOWEST, finite) without
// counting as masked, even in a row whose real scores are all -f32::MAX.
fn masked_score(scaled: f32, b: u32, h: u32, i: u32, j: u32, exists: bool) -> f32 {
    if (!exists) {
        return neg_inf();
    }
    if (mask.kind == MASK_NONE && mask.softcap == 0.0 && mask.alibi_heads == 0u && mask.temp_floor_scale == 0.0) {
        return scaled;
    }
    return apply_mask(scaled, b, h, i, j);
}

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let z = wid.y + p.z_offset;
    let b = z / p.heads;
    let h = z % p.heads;
    let i0 = wid.x * BLOCK_Q;
    let i1 = min(p.lq, i0 + BLOCK_Q);
    let lane = kv_lane(lid.x);  // for group_keys and group_values
    // The vec4s of the real head sizes (past them q, K and V are zero): a runtime trip count,
    // which also keeps Mesa's GLSL compiler from unrolling the head-size loops at compile time
    // (fully unrolled at d128 they took it minutes per pipeline).
    let qk_vecs = (p.head_dim_qk + 3u) / 4u;
    let v_vecs = (p.head_dim_v + 3u) / 4u;

    // Thread lid.x owns rows i0 + lid.x + THREADS·r (r < ROWS). q is held pre-scaled, so the
    // dot products are the scaled scores. Its rows' state (q_regs, acc, scores, row_max, row_sum,
    // correction) is flash_group.wgsl's private arrays.
    // A sink is a key of value zero every query sees: the online softmax starts from it
    // (max = its logit, sum = exp(0) = 1) in the first key range; later ranges carry it.
    var start_max = LOWEST;
    var start_sum = 0.0;
    if (p.sinks == 1u) {
        start_max = carry[p.sink_base + h];
        start_sum = 1.0;
    }
    for (var r = 0u; r < ROWS; r++) {
        row_max[r] = start_max;
        row_sum[r] = start_sum;
    }
    for (var r = 0u; r < ROWS; r++) {
        let i = i0 + lid.x + THREADS * r;
        if (i < p.lq) {
            let q_base = row_start(p.q, z / p.heads, z % p.heads, i);
            for (var c = 0u; c < qk_vecs; c++) {
                q_regs[r][c] = p.scale * staged_vec4(Q_ROW, q_base, 4u * c, p.head_dim_qk, true);
            }
        }
    }

    if ((p.carry_flags & CARRY_IN) != 0u) {
        // Through copies: this loop stays rolled (see the header).
        var carried_max = row_max;
        var carried_sum = row_sum;
        for (var r = 0u; r < ROWS; r++) {
            let i = i0 + lid.x + THREADS * r;
            if (i < p.lq) {
                let base = (z * p.lq + i) * carry_stride();
                carried_max[r] = carry[base];
                carried_sum[r] = carry[base + 1u];
                for (var c = 0u; c < (p.head_dim_v + 3u) / 4u; c++) {
                    let e = base + 2u + 4u * c;
                    acc[r][c] = vec4<f32>(carry[e], carry[e + 1u], carry[e + 2u], carry[e + 3u]);
                }
            }
        }
        row_max = carried_max;
        row_sum = carried_sum;
    }

    // Rows r >= live_rows of every thread are past Lq in this block (uniform: small Lq, decode).
    let live_rows = (i1 - i0 + THREADS - 1u) / THREADS;
    let tiles = min(p.tile_end, tiles_to_visit(b, i0, i1));
    for (var t = p.tile_begin; t < tiles; t++) {
        let j0 = t * KV_TILE;
        let keys = min(KV_TILE, p.lk - j0);
        // Stage K and V rows j0 .. j0 + keys as vec4s (all threads help); rows past the last
        // key are zeroed so a padded key's P·V term is exactly 0 even if stale data were NaN.
        for (var e = lid.x; e < KV_TILE * DK4; e += THREADS) {
            let key = e / DK4;
            let base = row_start(p.k, z / p.heads, (z % p.heads) / p.kv_group, j0 + key - p.key_base);
            k_tile[e] = staged_vec4(K_ROW, base, 4u * (e % DK4), p.head_dim_qk, key < keys);
        }
        for (var e = lid.x; e < KV_TILE * DV4; e += THREADS) {
            let key = e / DV4;
            let base = row_start(p.v, z / p.heads, (z % p.heads) / p.kv_group, j0 + key - p.key_base);
            v_tile[e] = staged_vec4(V_ROW, base, 4u * (e % DV4), p.head_dim_v, key < keys);
        }
        workgroupBarrier();
        // Key groups (see the header): s holds each owned row's scores of keys
        // jg .. jg + KEY_GROUP - 1, then their weights exp(s - max).
        for (var jg = 0u; jg < keys; jg += KEY_GROUP) {
            scores = GroupScores();
            for (var c = 0u; c < qk_vecs; c++) {
                let k = group_keys(jg, c, lane);
                add_group_dots_all(live_rows, c, k);
            }
            // Masked only where the mask or the end of the keys can touch the group: one uniform
            // branch per group, outside the unrolled row loops (a branch per row and key quad
            // cost lavapipe a third of the pass at d64, two thirds at d16). The scores are
            // already scaled: q was, on load (a loop over the rows here would stay rolled).
            let left = keys - jg;  // keys of this group that exist (at least 1)
            if (left < KEY_GROUP || group_needs_mask(b, i0, i1, j0 + jg)) {
                // Through a copy: this loop stays rolled (see the header). One score per
                // iteration, so the mask rule is compiled once, not once per row and key.
                var masked = scores;
                for (var e = 0u; e < ROWS * KEY_GROUP; e++) {
                    let r = e / KEY_GROUP;
                    let j = e % KEY_GROUP;
                    // Rows past Lq (results discarded) evaluate the mask at the last row, in range.
                    let i = min(i0 + lid.x + THREADS * r, p.lq - 1u);
                    masked[r][j / 4u][j % 4u] = masked_score(masked[r][j / 4u][j % 4u], b, h, i, j0 + jg + j, j < left);
                }
                scores = masked;
            }
            // Online softmax over the group: rescale what was accumulated under the old max.
            group_softmax_all();
            // P·V: each V vec4 feeds ROWS rows.
            for (var c = 0u; c < v_vecs; c++) {
                let v = group_values(jg, c, lane);
                add_group_values_all(live_rows, c, v);
            }
        }
        workgroupBarrier();
    }
    // Tiles skipped above hold keys masked for every row of the block: their weights are exactly
    // 0, but PyTorch's 0·V still turns a non-finite V into NaN in every row.
    let all_tiles = min(p.tile_end, (p.lk + KV_TILE - 1u) / KV_TILE);
    let poisoned = tiles < all_tiles;
    if (poisoned) {
        mark_skipped_non_finite(z, max(tiles, p.tile_begin), all_tiles, lid.x);
    }
    // Through copies from here on: these loops stay rolled (see the header).
    var final_max = row_max;
    var final_sum = row_sum;
    if ((p.carry_flags & CARRY_OUT) != 0u) {
        for (var r = 0u; r < ROWS; r++) {
            let i = i0 + lid.x + THREADS * r;
            if (i < p.lq) {
                let base = (z * p.lq + i) * carry_stride();
                carry[base] = final_max[r];
                carry[base + 1u] = final_sum[r];
                for (var c = 0u; c < (p.head_dim_v + 3u) / 4u; c++) {
                    let e = base + 2u + 4u * c;
                    let a = poison(acc[r][c], c, poisoned);
                    carry[e] = a.x;
                    carry[e + 1u] = a.y;
                    carry[e + 2u] = a.z;
                    carry[e + 3u] = a.w;
                }
            }
        }
        return;
    }
    for (var r = 0u; r < ROWS; r++) {
        let i = i0 + lid.x + THREADS * r;
        if (i < p.lq) {
            // Every score of the row was -inf (an additive mask) iff its sum stayed below 1: a
            // finite score (even -f32::MAX) at the row's finite max adds exp(0) = 1, a sink
            // starts the sum at 1, and -inf scores add exp(-inf - finite), 0 (or, where fast math
            // keeps no exact exp(-inf), next to it). The softmax is then 0/0, NaN, as PyTorch's.
            let inv = select(1.0 / final_sum[r], nan(), final_sum[r] < 0.5);
            let out_base = row_start(p.o, b, h, i);
            for (var c = 0u; c < v_vecs; c++) {
                let o = poison(acc[r][c] * inv, c, poisoned);
                for (var e = 0u; e < 4u; e++) {
                    if (4u * c + e < p.head_dim_v) {
                        out[out_base + 4u * c + e] = o[e];
                    }
                }
            }
        }
    }
}
