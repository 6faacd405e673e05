// linear_naive: the baseline the benchmark compares `linear` against. One thread per output
// element, every operand read straight from storage (no tiling, no reuse): Y[M, N] = X·Wᵀ + b.
// Self-contained (needs no prefix). Dispatch: (ceil(N / 16), ceil(M / 16), 1) workgroups of 16×16.

struct NaiveLinearParams {
    m: u32,
    n: u32,
    k: u32,
    has_bias: u32,
}

@group(0) @binding(0) var<uniform> p: NaiveLinearParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let row = gid.y;
    if (row >= p.m || col >= p.n) {
        return;
    }
    var sum = 0.0;
    for (var k = 0u; k < p.k; k++) {
        sum += x[row * p.k + k] * w[col * p.k + k];
    }
    if (p.has_bias != 0u) {
        sum += bias[col];
    }
    y[row * p.n + col] = sum;
}
