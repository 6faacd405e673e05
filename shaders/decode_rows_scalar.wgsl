// decode_attention's K and V rows element by element, for rows that may start anywhere or
// end inside a vec4; elements past a row's end read as zero.

@group(0) @binding(2) var<storage, read> k_in: array<QkvElem>;
@group(0) @binding(3) var<storage, read> v_in: array<QkvElem>;

// Vec4 c of the key row starting at element `base`.
fn key4(base: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) {
        if (4u * c + e < HEAD_DIM_QK) {
            v[e] = f32(k_in[base + 4u * c + e]);
        }
    }
    return v;
}

// Vec4 c of the value row starting at element `base`.
fn value4(base: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) {
        if (4u * c + e < HEAD_DIM_V) {
            v[e] = f32(v_in[base + 4u * c + e]);
        }
    }
    return v;
}
