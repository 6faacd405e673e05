// flash_attention: scores + mask + online softmax + P·V in one pass, no [Lq, Lk] buffer.
// One workgroup of 64 threads takes 64 query rows of one (batch, head); each thread owns one
// query row (q and the output accumulator in registers). K/V tiles of KV_TILE keys are staged
// in workgroup memory and shared by the 64 rows. Masked scores are replaced by -1e9 like the
// multi-pass path, so a fully masked row still averages V over all keys.
// Tiles that are masked for every row of the block (causal, key padding) are skipped, but
// only when every row of the block sees at least one key: skipping is then exact, because
// exp(-1e9 - m) is 0 in f32.
// Dispatch: (ceil(Lq / 64), B·H, 1); z offset as in scores.
//
// The host rewrites the next three constants for each module (head sizes are fixed per module).
const HEAD_DIM_QK: u32 = 64u;
const HEAD_DIM_V: u32 = 64u;
const KV_TILE: u32 = 32u;

const BLOCK_Q: u32 = 64u;

struct FlashParams {
    lq: u32,
    lk: u32,
    heads: u32,
    scale: f32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    z_offset: u32,
    kv_stride: u32,   // rows of K/V per (batch, head): Lk, or a KV cache's capacity
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    mask: MaskParams,
}

@group(0) @binding(0) var<uniform> p: FlashParams;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> k_tile: array<f32, KV_TILE * HEAD_DIM_QK>;
var<workgroup> v_tile: array<f32, KV_TILE * HEAD_DIM_V>;

// One past the last tile any row of queries [i0, i1) can see (uniform over the workgroup).
fn tiles_to_visit(b: u32, i0: u32, i1: u32) -> u32 {
    let all_tiles = (p.lk + KV_TILE - 1u) / KV_TILE;
    if (p.mask.kind == MASK_CAUSAL) {
        // Every row sees a key iff the first row does (i0 + offset >= 0).
        if (i32(i0) + p.mask.causal_offset >= 0) {
            let last_key = u32(i32(i1 - 1u) + p.mask.causal_offset);
            return min(all_tiles, last_key / KV_TILE + 1u);
        }
    }
    if (p.mask.kind == MASK_KEY_PADDING) {
        let valid = mask_words[p.mask.batch_base + b];
        if (valid > 0u) {
            return min(all_tiles, (valid + KV_TILE - 1u) / KV_TILE);
        }
    }
    return all_tiles;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let z = wid.y + p.z_offset;
    let b = z / p.heads;
    let h = z % p.heads;
    let i0 = wid.x * BLOCK_Q;
    let i1 = min(p.lq, i0 + BLOCK_Q);
    let i = i0 + lid.x;
    let row_live = i < p.lq;

    var q: array<f32, HEAD_DIM_QK>;
    var acc: array<f32, HEAD_DIM_V>;
    if (row_live) {
        let q_base = p.q_offset + (z * p.lq + i) * HEAD_DIM_QK;
        for (var d = 0u; d < HEAD_DIM_QK; d++) {
            q[d] = qkv[q_base + d];
        }
    }
    var row_max = -3.402823e38;
    var row_sum = 0.0;
    var s: array<f32, KV_TILE>;

    let tiles = tiles_to_visit(b, i0, i1);
    for (var t = 0u; t < tiles; t++) {
        let j0 = t * KV_TILE;
        let keys = min(KV_TILE, p.lk - j0);
        // Stage K and V rows j0 .. j0 + keys (all 64 threads help).
        let k_base = p.k_offset + (z * p.kv_stride + j0) * HEAD_DIM_QK;
        for (var e = lid.x; e < keys * HEAD_DIM_QK; e += BLOCK_Q) {
            k_tile[e] = qkv[k_base + e];
        }
        let v_base = p.v_offset + (z * p.kv_stride + j0) * HEAD_DIM_V;
        for (var e = lid.x; e < keys * HEAD_DIM_V; e += BLOCK_Q) {
            v_tile[e] = qkv[v_base + e];
        }
        workgroupBarrier();
        if (row_live) {
            var tile_max = row_max;
            for (var jj = 0u; jj < keys; jj++) {
                var dot = 0.0;
                for (var d = 0u; d < HEAD_DIM_QK; d++) {
                    dot += q[d] * k_tile[jj * HEAD_DIM_QK + d];
                }
                s[jj] = apply_mask(p.mask, p.scale * dot, b, h, i, j0 + jj);
                tile_max = max(tile_max, s[jj]);
            }
            // Rescale what was accumulated under the old maximum.
            let correction = exp(row_max - tile_max);
            row_sum *= correction;
            for (var d = 0u; d < HEAD_DIM_V; d++) {
                acc[d] *= correction;
            }
            for (var jj = 0u; jj < keys; jj++) {
                let pj = exp(s[jj] - tile_max);
                row_sum += pj;
                for (var d = 0u; d < HEAD_DIM_V; d++) {
                    acc[d] += pj * v_tile[jj * HEAD_DIM_V + d];
                }
            }
            row_max = tile_max;
        }
        workgroupBarrier();
    }
    if (row_live) {
        let inv = 1.0 / row_sum;
        let out_base = (b * p.lq + i) * (p.heads * HEAD_DIM_V) + h * HEAD_DIM_V;
        for (var d = 0u; d < HEAD_DIM_V; d++) {
            out[out_base + d] = acc[d] * inv;
        }
    }
}
