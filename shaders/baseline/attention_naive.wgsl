// attention_naive: the baseline multi-pass attention core the benchmark compares against.
// Three entry points over the same bindings, each one thread per output and no reuse:
//   scores_main:  S[z, i, j] = scale · Σ_d Q[z, i, d] · K[z, j, d]   (no mask: timing baseline)
//   softmax_main: one thread per row of S, three sweeps (max, sum, normalise), in place
//   av_main:      O[b, i, h·dv + d] = Σ_j P[z, i, j] · V[z, j, d]
// Q, K, V are head-split [B·H, L, d] at element offsets into `qkv`. Self-contained.
// Dispatch: scores (ceil(Lk/16), ceil(Lq/16), B·H); softmax (ceil(B·H·Lq/64), 1, 1);
// av (ceil(dv/16), ceil(Lq/16), B·H).

struct NaiveAttnParams {
    lq: u32,
    lk: u32,
    dk: u32,
    dv: u32,
    heads: u32,
    rows: u32,      // B·H·Lq
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: NaiveAttnParams;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(4) var<storage, read_write> s: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(16, 16, 1)
fn scores_main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let i = gid.y;
    let z = gid.z;
    if (i >= p.lq || j >= p.lk) {
        return;
    }
    var dot = 0.0;
    for (var d = 0u; d < p.dk; d++) {
        dot += qkv[p.q_offset + (z * p.lq + i) * p.dk + d] * qkv[p.k_offset + (z * p.lk + j) * p.dk + d];
    }
    s[(z * p.lq + i) * p.lk + j] = p.scale * dot;
}

@compute @workgroup_size(64, 1, 1)
fn softmax_main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.lk;
    var m = -3.402823e38;
    for (var j = 0u; j < p.lk; j++) {
        m = max(m, s[base + j]);
    }
    var sum = 0.0;
    for (var j = 0u; j < p.lk; j++) {
        sum += exp(s[base + j] - m);
    }
    for (var j = 0u; j < p.lk; j++) {
        s[base + j] = exp(s[base + j] - m) / sum;
    }
}

@compute @workgroup_size(16, 16, 1)
fn av_main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let d = gid.x;
    let i = gid.y;
    let z = gid.z;
    if (i >= p.lq || d >= p.dv) {
        return;
    }
    var sum = 0.0;
    for (var j = 0u; j < p.lk; j++) {
        sum += s[(z * p.lq + i) * p.lk + j] * qkv[p.v_offset + (z * p.lk + j) * p.dv + d];
    }
    let b = z / p.heads;
    let h = z % p.heads;
    out[(b * p.lq + i) * (p.heads * p.dv) + h * p.dv + d] = sum;
}
