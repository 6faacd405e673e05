// scores: S[b, h, i, j] = mask(scale · Q[b, h, i, :] · K[b, h, j, :]), S laid out [B, H, Lq, Lk].
// Q and K are read at their row strides (rows.wgsl: the module's head-split [B, H, L, d] at an
// element offset, or a caller's layout); one packed buffer bound twice, or one each.
// The entry point is gemm_heads.wgsl's (on gemm_tile.wgsl), which the host puts before this body.
// Dispatch: (ceil(Lk / 64), ceil(Lq / 64), B·H) workgroups of 16×16; z is offset by
// p.z_offset so a problem with more than 65535 (batch, head) pairs can be split.

struct ScoresParams {
    q: RowStrides, // where Q's and K's rows lie (rows.wgsl; K's heads are key heads)
    k: RowStrides,
    lq: u32,
    lk: u32,
    head_dim: u32,
    heads: u32,
    scale: f32,
    z_offset: u32,
    k_begin: u32,     // the head_dim range of this dispatch: [k_begin, k_end); a range not
    k_end: u32,       // starting at 0 adds to the stored partial dot products, and the one
                      // ending at head_dim scales and masks the total
    kv_group: u32,    // query heads per key head (1, or H / H_kv for GQA/MQA)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: ScoresParams;
@group(0) @binding(1) var<storage, read> q_in: array<f32>;
@group(0) @binding(2) var<storage, read> k_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;

fn load_a(z: u32, i: u32, d: u32) -> f32 {
    return q_in[row_start(p.q, z / p.heads, z % p.heads, i) + d];
}

fn load_b(z: u32, d: u32, j: u32) -> f32 {
    return k_in[row_start(p.k, z / p.heads, (z % p.heads) / p.kv_group, j) + d];
}

fn out_cols() -> u32 {
    return p.lk;
}

// S[b, h, i, j] (gemm_heads.wgsl calls it inside the output).
fn epilogue(z: u32, b: u32, h: u32, i: u32, j: u32, acc: f32) {
    let at = (z * p.lq + i) * p.lk + j;
    var dot = acc;
    if (p.k_begin != 0u) {
        dot += scores[at];
    }
    if (p.k_end == p.head_dim) {
        scores[at] = apply_mask(p.scale * dot, b, h, i, j);
    } else {
        scores[at] = dot;
    }
}
