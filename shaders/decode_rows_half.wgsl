// The decode passes' f16 Q, K and V rows as whole vec4s, each read as two u32 words (four halves)
// and unpacked, where every row starts on a vec4 (decode_rows_vec4.wgsl's condition). On
// llvmpipe every lane-wide load is a loop over the lanes, one scalar per component: a vec4<f16>
// is four 16-bit loads, a vec2<u32> two 32-bit ones (the paged pool's reads do the same:
// paged_rows_half.wgsl).

@group(0) @binding(1) var<storage, read> q_in: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> k_in: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> v_in: array<vec2<u32>>;

fn unpack_half4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// Vec4 c of the key row starting at element `base`, zero past the row's end (the vec4s that
// pad the head size up to its bucket read the next row, or past the buffer, and are dropped).
fn key4(base: u32, c: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), unpack_half4(k_in[base / 4u + c]), 4u * c < p.head_dim_qk);
}

// Vec4 c of the value row starting at element `base`, zero past the row's end.
fn value4(base: u32, c: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), unpack_half4(v_in[base / 4u + c]), 4u * c < p.head_dim_v);
}

// Vec4 c of the query row starting at element `base`, zero past the row's end.
fn query4(base: u32, c: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), unpack_half4(q_in[base / 4u + c]), 4u * c < p.head_dim_qk);
}
