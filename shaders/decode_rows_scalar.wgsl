// The decode passes' Q, K and V rows element by element (decode_rows_query.wgsl's row4), for
// rows that may start anywhere or end inside a vec4. No loop over the elements: the host counts
// loop iterations against the 65,535 a software rasteriser allows.

@group(0) @binding(2) var<storage, read> k_in: array<QkvElem>;
@group(0) @binding(3) var<storage, read> v_in: array<QkvElem>;

// Element i of Q (`which` 0), K (1) or V (2).
fn row_elem(which: u32, i: u32) -> f32 {
    switch which {
        case 0u: { return f32(q_in[i]); }
        case 1u: { return f32(k_in[i]); }
        default: { return f32(v_in[i]); }
    }
}

// Vec4 c of the key row starting at element `base`.
fn key4(base: u32, c: u32) -> vec4<f32> {
    return row4(1u, base, c, p.head_dim_qk);
}

// Vec4 c of the value row starting at element `base`.
fn value4(base: u32, c: u32) -> vec4<f32> {
    return row4(2u, base, c, p.head_dim_v);
}
