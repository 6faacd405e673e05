// linear: Y = X · Wᵀ + b (PyTorch nn.Linear, W stored [out, in] row-major).
// Rows of X are (batch, position) pairs; the output column n is scattered straight into the
// head-split layout [B, H, L, d] of its segment, so split_heads costs nothing. Up to three
// segments (Q | K | V of a fused QKV projection) share one dispatch. A plain [M, N] output is
// one segment with a single head of width N.
// Dispatch: (ceil(N / 64), ceil(M / 64), 1) workgroups of 16×16. The host's prelude defines
// the element types WElem of W and YElem of Y (f32, or f16 in an f16 module; X and the bias
// are f32, and accumulation is f32 either way).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<WElem>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<YElem>;

fn load_a(batch: u32, row: u32, k: u32) -> f32 {
    return x[p.x_offset + row * p.k + k];
}

fn load_b(batch: u32, k: u32, col: u32) -> f32 {
    return f32(w[p.w_offset + col * p.k + k]);
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.y * TILE_M;
    let col0 = wid.x * TILE_N;
    let acc = gemm_tile(lid, 0u, row0, col0, p.m, p.n, p.k_begin, p.k_end);
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + lid.x * 4u + j;
            if (row < p.m && col < p.n) {
                var v = acc[i][j];
                let at = dst_index(row, col);
                if (p.k_begin != 0u) {
                    v += f32(y[at]);
                } else if (p.has_bias != 0u) {
                    v += bias[p.bias_offset + col];
                }
                y[at] = YElem(v);
            }
        }
    }
}
