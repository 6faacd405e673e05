// The decode passes' Q rows element by element, and K and V rows from q8_0 / q4_0 blocks
// (kv_quant.wgsl): one word load per vec4 of a q8_0 row (per two of a q4_0 row) and one per
// block's scale, instead of a float load per element. Head sizes are whole blocks (the host
// checks), so a vec4 is inside the row or past its end, never across it.

@group(0) @binding(1) var<storage, read> q_in: array<QkvElem>;
@group(0) @binding(2) var<storage, read> k_in: array<u32>;
@group(0) @binding(3) var<storage, read> v_in: array<u32>;

// Vec4 c of the key row starting at element `base`.
fn key4(base: u32, c: u32) -> vec4<f32> {
    if (4u * c >= p.head_dim_qk) {
        return vec4<f32>(0.0);
    }
    let e = base + 4u * c;
    return dequant4(k_in[quant_word(e)], k_in[scale_word(p.k_scales, e)], e);
}

// Vec4 c of the value row starting at element `base`.
fn value4(base: u32, c: u32) -> vec4<f32> {
    if (4u * c >= p.head_dim_v) {
        return vec4<f32>(0.0);
    }
    let e = base + 4u * c;
    return dequant4(v_in[quant_word(e)], v_in[scale_word(p.v_scales, e)], e);
}

// Vec4 c of the query row starting at element `base`, zero past the row's end.
fn query4(base: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    let i = base + 4u * c;
    if (4u * c < p.head_dim_qk) { v.x = f32(q_in[i]); }
    if (4u * c + 1u < p.head_dim_qk) { v.y = f32(q_in[i + 1u]); }
    if (4u * c + 2u < p.head_dim_qk) { v.z = f32(q_in[i + 2u]); }
    if (4u * c + 3u < p.head_dim_qk) { v.w = f32(q_in[i + 3u]); }
    return v;
}
