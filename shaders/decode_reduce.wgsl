// decode_reduce: combines decode_attention's per-split (max, sum, accumulator) of each query
// row, in split order: M = max m_s, L = Σ l_s·exp(m_s − M), O = Σ acc_s·exp(m_s − M) / L,
// written at the output's row strides (the combined layout [B, Lq, H·dv] in a module). A row whose every score was -inf
// (an additive mask) has L < 1 (a finite score, even -f32::MAX, adds exp(0) = 1 at its split's
// max, which is finite: it starts at -f32::MAX, and so does M): its softmax is 0/0, NaN, as
// PyTorch returns.
// Dispatch: one workgroup of 64 per query row, spread over x then y.
// Nothing is specialised: the head size comes with the parameters, so one pipeline serves all.

struct ReduceParams {
    o: RowStrides, // where the output rows lie (rows.wgsl)
    rows: u32,      // B · H · Lq
    lq: u32,
    heads: u32,
    splits: u32,
    groups_x: u32,
    head_dim_v: u32,
    sinks: u32,     // 1: each head's sink logit joins the denominator (gpt-oss)
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: ReduceParams;
@group(0) @binding(1) var<storage, read> partials: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read> sinks: array<f32>;

// A quiet NaN. WGSL rejects NaN constants, so the bits are made a runtime value.
fn nan() -> f32 {
    return bitcast<f32>(0x7fc00000u | (p.rows & 0u));
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.y * p.groups_x + wid.x;   // (b · H + h) · Lq + i
    if (row >= p.rows) {
        return;
    }
    // Floats per (row, split): max, sum, the accumulator's vec4s (as decode_params.wgsl).
    let part_stride = 2u + 4u * ((p.head_dim_v + 3u) / 4u);
    let first = row * p.splits * part_stride;
    let h = (row / p.lq) % p.heads;
    // A sink is one more split: max its logit, sum exp(0) = 1, accumulator 0.
    var m = -3.4028234663852886e38;  // exactly -f32::MAX, as the splits' maxima start
    var sink = m;
    if (p.sinks == 1u) {
        sink = sinks[h];
        m = sink;
    }
    for (var s = 0u; s < p.splits; s++) {
        m = max(m, partials[first + s * part_stride]);
    }
    var l = select(0.0, exp(sink - m), p.sinks == 1u);
    for (var s = 0u; s < p.splits; s++) {
        let base = first + s * part_stride;
        l += partials[base + 1u] * exp(partials[base] - m);
    }
    // Tested on the sum, not the max: a row of -f32::MAX scores keeps max -f32::MAX and is
    // uniform; -inf ones add exp(-inf), 0 (or next to it where fast math rounds).
    let inv = select(1.0 / l, nan(), l < 0.5);
    let i = row % p.lq;
    let b = row / p.lq / p.heads;
    let out_base = row_start(p.o, b, h, i);
    for (var d = lid.x; d < p.head_dim_v; d += 64u) {
        var o = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let base = first + s * part_stride;
            o += partials[base + 2u + d] * exp(partials[base] - m);
        }
        out[out_base + d] = o * inv;
    }
}
