// flash_attention's Q, K and V as stored floats (QkvElem), element by element: one packed
// buffer bound three times, or one buffer each (at the params' offsets).

@group(0) @binding(1) var<storage, read> q_in: array<QkvElem>;
@group(0) @binding(2) var<storage, read> k_in: array<QkvElem>;
@group(0) @binding(3) var<storage, read> v_in: array<QkvElem>;

// Element d of a Q, K or V row as stored (zero past the head size, for the vec4 padding).
fn row_elem(which: u32, base: u32, d: u32, dim: u32) -> f32 {
    if (d >= dim) {
        return 0.0;
    }
    switch which {
        case Q_ROW: { return f32(q_in[base + d]); }
        case K_ROW: { return f32(k_in[base + d]); }
        default: { return f32(v_in[base + d]); }
    }
}

// Elements d .. d + 3 of the row at `base` as a vec4 (zero past the row's end), or zeros for
// a key past the last one (`live` false).
fn staged_vec4(which: u32, base: u32, d: u32, width: u32, live: bool) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (live) {
        v = vec4<f32>(
            row_elem(which, base, d, width),
            row_elem(which, base, d + 1u, width),
            row_elem(which, base, d + 2u, width),
            row_elem(which, base, d + 3u, width),
        );
    }
    return v;
}

