// The decode passes' Q, K and V rows as whole vec4s: one load per vec4 instead of four, where
// the host has checked that every row starts on a vec4 (head sizes and offsets multiples of 4).

@group(0) @binding(1) var<storage, read> q_in: array<vec4<QkvElem>>;
@group(0) @binding(2) var<storage, read> k_in: array<vec4<QkvElem>>;
@group(0) @binding(3) var<storage, read> v_in: array<vec4<QkvElem>>;

// Vec4 c of the key row starting at element `base`, zero past the row's end (the vec4s that
// pad the head size up to its bucket read the next row, or past the buffer, and are dropped).
fn key4(base: u32, c: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(k_in[base / 4u + c]), 4u * c < p.head_dim_qk);
}

// Vec4 c of the value row starting at element `base`, zero past the row's end.
fn value4(base: u32, c: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(v_in[base / 4u + c]), 4u * c < p.head_dim_v);
}

// Vec4 c of the query row starting at element `base`, zero past the row's end (where a
// lane's share of the head overhangs it, so that the key it meets there adds nothing).
fn query4(base: u32, c: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(q_in[base / 4u + c]), 4u * c < p.head_dim_qk);
}
