// The decode passes' Q, K and V rows element by element, for rows that may start anywhere or
// end inside a vec4; elements past a row's end read as zero. No loop over the elements: the
// host counts loop iterations against the 65,535 a software rasteriser allows.

@group(0) @binding(1) var<storage, read> q_in: array<QkvElem>;
@group(0) @binding(2) var<storage, read> k_in: array<QkvElem>;
@group(0) @binding(3) var<storage, read> v_in: array<QkvElem>;

// Vec4 c of the key row starting at element `base`.
fn key4(base: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    let i = base + 4u * c;
    if (4u * c < p.head_dim_qk) { v.x = f32(k_in[i]); }
    if (4u * c + 1u < p.head_dim_qk) { v.y = f32(k_in[i + 1u]); }
    if (4u * c + 2u < p.head_dim_qk) { v.z = f32(k_in[i + 2u]); }
    if (4u * c + 3u < p.head_dim_qk) { v.w = f32(k_in[i + 3u]); }
    return v;
}

// Vec4 c of the value row starting at element `base`.
fn value4(base: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    let i = base + 4u * c;
    if (4u * c < p.head_dim_v) { v.x = f32(v_in[i]); }
    if (4u * c + 1u < p.head_dim_v) { v.y = f32(v_in[i + 1u]); }
    if (4u * c + 2u < p.head_dim_v) { v.z = f32(v_in[i + 2u]); }
    if (4u * c + 3u < p.head_dim_v) { v.w = f32(v_in[i + 3u]); }
    return v;
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
