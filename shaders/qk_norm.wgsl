// qk_norm: normalises rows of head-split Q or K in place, before RoPE (Qwen3, Gemma 3, OLMo 2,
// StableLM, Cohere). One workgroup normalises one group of values: a head's row of head_dim
// (per-head norms), or all heads' rows of one token (OLMo 2's norm over the whole projection):
//   RMSNorm    x · w / sqrt(mean(x²) + eps)
//   LayerNorm  (x − mean(x)) · w / sqrt(var(x) + eps)
// with w = weight[e] + weight_offset (Gemma's 1 + w), weight indexed by the head's element e,
// or by head·head_dim + e when it holds a weight per head; then + bias[·] (same index) when
// has_bias (Persimmon's LayerNorm). Sums are in f32, as transformers
// casts to float32.
// The host prepends a prelude defining the element type QkvElem (f32, or f16 in an f16 module),
// and group_pass.wgsl (the entry point, WG, workgroup_sum).
// Dispatch: one workgroup of 64 per group, spread over x then y.

struct NormParams {
    groups: u32,          // groups normalised: B · n · heads / heads_per_group
    heads: u32,           // heads of this segment (query heads, or key/value heads)
    heads_per_group: u32, // 1 (per head) or heads (the whole projection)
    n: u32,               // rows per (batch, head) normalised
    stride: u32,          // rows per (batch, head) in the buffer
    first: u32,           // first normalised row within each (batch, head)
    head_dim: u32,
    offset: u32,          // element offset of the segment in its buffer
    per_head_weight: u32, // 1: weight holds heads · head_dim values
    layer_norm: u32,      // 1: subtract the mean (LayerNorm); 0: RMSNorm
    eps: f32,
    weight_offset: f32,
    groups_x: u32,
    has_bias: u32,        // 1: add bias (indexed as weight)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: NormParams;
@group(0) @binding(1) var<storage, read_write> x: array<QkvElem>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>; // the weight again when has_bias = 0

// Element e of the group (e < heads_per_group · head_dim) of batch b, row i, first head h0.
fn at(b: u32, h0: u32, i: u32, e: u32) -> u32 {
    let h = h0 + e / p.head_dim;
    return p.offset + ((b * p.heads + h) * p.stride + p.first + i) * p.head_dim + e % p.head_dim;
}

fn group_count() -> u32 {
    return p.groups;
}

// Normalises group g: row i of batch b, heads h0.. (group_pass.wgsl calls it).
fn group_pass(g: u32, lid: u32) {
    let per_batch_head = p.heads / p.heads_per_group;
    let i = g % p.n;
    let bh = g / p.n;
    let b = bh / per_batch_head;
    let h0 = (bh % per_batch_head) * p.heads_per_group;
    let len = p.heads_per_group * p.head_dim;
    var mean = 0.0;
    if (p.layer_norm == 1u) {
        var s = 0.0;
        for (var e = lid; e < len; e += WG) {
            s += f32(x[at(b, h0, i, e)]);
        }
        mean = workgroup_sum(lid, s) / f32(len);
    }
    var sq = 0.0;
    for (var e = lid; e < len; e += WG) {
        let d = f32(x[at(b, h0, i, e)]) - mean;
        sq += d * d;
    }
    let inv = inverseSqrt(workgroup_sum(lid, sq) / f32(len) + p.eps);
    for (var e = lid; e < len; e += WG) {
        var w_index = e % p.head_dim;
        if (p.per_head_weight == 1u) {
            w_index = (h0 + e / p.head_dim) * p.head_dim + e % p.head_dim;
        }
        let w = weight[w_index] + p.weight_offset;
        var add = 0.0;
        if (p.has_bias == 1u) {
            add = bias[w_index];
        }
        let k = at(b, h0, i, e);
        x[k] = QkvElem((f32(x[k]) - mean) * inv * w + add);
    }
}
