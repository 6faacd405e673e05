// mla_rows: a row pass of multi-head latent attention's pre-stage (DeepSeek-V2/V3): copies `n`
// values of each row of `src` (rows `in_stride` wide, from column `in_offset`) into `dst` (rows
// `out_stride` wide, from column `out_offset`), RMS-normalised with `weight` when `normalise`
// is 1: w · x / sqrt(mean(x²) + eps), the sum in f32 as transformers casts to float32
// (q_a_layernorm, kv_a_layernorm); else copied as they are (the shared RoPE key).
// The host puts group_pass.wgsl (the entry point, WG, workgroup_sum) before this body.
// Dispatch: one workgroup of 64 per row, spread over x then y.

struct RowParams {
    rows: u32,
    n: u32,
    in_stride: u32,
    in_offset: u32,
    out_stride: u32,
    out_offset: u32,
    normalise: u32,
    groups_x: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: RowParams;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;

fn group_count() -> u32 {
    return p.rows;
}

// Row `row`'s slice (group_pass.wgsl calls it).
fn group_pass(row: u32, lid: u32) {
    let at_in = row * p.in_stride + p.in_offset;
    let at_out = row * p.out_stride + p.out_offset;
    var scale = 1.0;
    if (p.normalise == 1u) {
        var sq = 0.0;
        for (var e = lid; e < p.n; e += WG) {
            let v = src[at_in + e];
            sq += v * v;
        }
        scale = inverseSqrt(workgroup_sum(lid, sq) / f32(p.n) + p.eps);
    }
    for (var e = lid; e < p.n; e += WG) {
        var v = src[at_in + e];
        if (p.normalise == 1u) {
            v = weight[e] * (v * scale);
        }
        dst[at_out + e] = v;
    }
}
