// av_combine: O[b, i, h·dv + d] = Σ_j P[b, h, i, j] · V[b, h, j, d].
// P is [B, H, Lq, Lk]; V and the output are read and written at their row strides (rows.wgsl):
// in a module, V head-split [B, H, Lk, dv] and the output straight into the combined layout
// [B, Lq, H·dv], so combine_heads costs nothing.
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

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let z = wid.z + p.z_offset;
    let row0 = wid.y * TILE_M;
    let col0 = wid.x * TILE_N;
    let acc = gemm_tile(lid, z, row0, col0, p.lq, p.head_dim, p.k_begin, p.k_end);
    let b = z / p.heads;
    let h = z % p.heads;
    for (var r = 0u; r < 4u; r++) {
        let i = row0 + lid.y * 4u + r;
        for (var c = 0u; c < 4u; c++) {
            let d = col0 + lid.x * 4u + c;
            if (i < p.lq && d < p.head_dim) {
                let at = row_start(p.o, b, h, i) + d;
                if (p.k_begin != 0u) {
                    out[at] += acc[r][c];
                } else {
                    out[at] = acc[r][c];
                }
            }
        }
    }
}
