// The float decode rows (decode_rows_vec4.wgsl or decode_rows_scalar.wgsl, which come first)
// read as decode_lane_keys reads a quantized row (decode_rows_quant.wgsl's key32 / value32): a
// block of 32 values at a time, with scale 1.

// Vec4s c0 .. c0 + 7 of the key row at `base`, as decode_lane_keys reads them (a block of 32
// values: scale 1 for floats; vec4s past the row's end are zero).
fn key32(base: u32, c0: u32) -> Block32 {
    return Block32(
        array<vec4<f32>, 4>(key4(base, c0), key4(base, c0 + 1u), key4(base, c0 + 2u), key4(base, c0 + 3u)),
        array<vec4<f32>, 4>(key4(base, c0 + 4u), key4(base, c0 + 5u), key4(base, c0 + 6u), key4(base, c0 + 7u)),
        1.0,
    );
}

// Vec4s c0 .. c0 + 7 of the value row at `base`.
fn value32(base: u32, c0: u32) -> Block32 {
    return Block32(
        array<vec4<f32>, 4>(value4(base, c0), value4(base, c0 + 1u), value4(base, c0 + 2u), value4(base, c0 + 3u)),
        array<vec4<f32>, 4>(value4(base, c0 + 4u), value4(base, c0 + 5u), value4(base, c0 + 6u), value4(base, c0 + 7u)),
        1.0,
    );
}
