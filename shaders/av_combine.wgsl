// av_combine: O[b, i, h·dv + d] = Σ_j P[b, h, i, j] · V[b, h, j, d].
// P is [B, H, Lq, Lk]; V and the output are read and written at their row strides (rows.wgsl):
// in a module, V head-split [B, H, Lk, dv] and the output straight into the combined layout
// [B, Lq, H·dv], so combine_heads costs nothing.
// The entry point is gemm_heads.wgsl's (on gemm_tile.wgsl), which the host puts before this body.
// Dispatch: (ceil(dv / 64), ceil(Lq / 64), B·H) workgroups of 16×16 (z offset as in scores).

struct AvParams {
    v: RowStrides, // where V's rows (value heads) and the output's rows lie (rows.wgsl)
    o: RowStrides,
    lq: u32,
    lk: u32,
    head_dim: u32,   // dv
    heads: u32,
    z_offset: u32,
    k_begin: u32,     // the keys of this dispatch: [k_begin, k_end); a range not starting
    k_end: u32,       // at 0 adds to the stored output
    kv_group: u32,    // query heads per value head (1, or H / H_kv for GQA/MQA)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    _pad3: u32,
}

@group(0) @binding(0) var<uniform> p: AvParams;
@group(0) @binding(1) var<storage, read> probs: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn load_a(z: u32, i: u32, j: u32) -> f32 {
    return probs[(z * p.lq + i) * p.lk + j];
}

fn load_b(z: u32, j: u32, d: u32) -> f32 {
    return v[row_start(p.v, z / p.heads, (z % p.heads) / p.kv_group, j) + d];
}

fn out_cols() -> u32 {
    return p.head_dim;
}

// O[b, i, h·dv + d] (gemm_heads.wgsl calls it inside the output).
fn epilogue(z: u32, b: u32, h: u32, i: u32, d: u32, acc: f32) {
    let at = row_start(p.o, b, h, i) + d;
    if (p.k_begin != 0u) {
        out[at] += acc;
    } else {
        out[at] = acc;
    }
}
