// The decode passes' rows element by element, for the rows files whose K and V are not read as
// whole float vec4s (decode_rows_scalar.wgsl, decode_rows_quant.wgsl): rows that may start
// anywhere or end inside a vec4; elements past a row's end read as zero. Q's rows are read so
// by both; the rows file defines row_elem(which, i), element i of Q (`which` 0), K (1) or
// V (2), `which` a constant at every call.

@group(0) @binding(1) var<storage, read> q_in: array<QkvElem>;

// Vec4 c of the row of `which` starting at element `base`, zero past its `len` elements.
fn row4(which: u32, base: u32, c: u32, len: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    let i = base + 4u * c;
    if (4u * c < len) { v.x = row_elem(which, i); }
    if (4u * c + 1u < len) { v.y = row_elem(which, i + 1u); }
    if (4u * c + 2u < len) { v.z = row_elem(which, i + 2u); }
    if (4u * c + 3u < len) { v.w = row_elem(which, i + 3u); }
    return v;
}

// Vec4 c of the query row starting at element `base`, zero past the row's end.
fn query4(base: u32, c: u32) -> vec4<f32> {
    return row4(0u, base, c, p.head_dim_qk);
}
