// The decode passes' K and V rows from q8_0 / q4_0 blocks (kv_quant.wgsl; Q's element by
// element: decode_rows_query.wgsl). Head sizes are whole blocks (the host checks), so a vec4
// or a block lies inside a row or past its end. The words are bound as vec4s: on llvmpipe a load costs about
// the same whatever its width, and one vec4 of words is 16 q8_0 values (32 of q4_0) where a
// vec4<f16> is 4 (decode_lane_keys reads whole blocks, key32).

@group(0) @binding(2) var<storage, read> k_in: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> v_in: array<vec4<u32>>;

// Q's elements (decode_rows_query.wgsl): K and V are read by words.
fn row_elem(which: u32, i: u32) -> f32 {
    return f32(q_in[i]);
}

fn k_word(i: u32) -> u32 {
    return k_in[i / 4u][i % 4u];
}

fn v_word(i: u32) -> u32 {
    return v_in[i / 4u][i % 4u];
}

// Vec4 c of the key row starting at element `base`.
fn key4(base: u32, c: u32) -> vec4<f32> {
    if (4u * c >= p.head_dim_qk) {
        return vec4<f32>(0.0);
    }
    let e = base + 4u * c;
    return dequant4(k_word(quant_word(e)), k_word(scale_word(p.k_scales, e)), e);
}

// Vec4 c of the value row starting at element `base`.
fn value4(base: u32, c: u32) -> vec4<f32> {
    if (4u * c >= p.head_dim_v) {
        return vec4<f32>(0.0);
    }
    let e = base + 4u * c;
    return dequant4(v_word(quant_word(e)), v_word(scale_word(p.v_scales, e)), e);
}

// Vec4s c0 .. c0 + 7 of the key row at `base` (c0 a multiple of 8: one block), unscaled,
// and the block's scale: one or two vec4s of words and one scale word.
fn key32(base: u32, c0: u32) -> Block32 {
    if (4u * c0 >= p.head_dim_qk) {
        return Block32();
    }
    let e = base + 4u * c0;
    let at = e * KV_BITS / 128u;
    return block32(k_in[at], k_in[at + KV_BITS / 8u], kv_scale(k_word(scale_word(p.k_scales, e)), e));
}

// Vec4s c0 .. c0 + 7 of the value row at `base`, as key32.
fn value32(base: u32, c0: u32) -> Block32 {
    if (4u * c0 >= p.head_dim_v) {
        return Block32();
    }
    let e = base + 4u * c0;
    let at = e * KV_BITS / 128u;
    return block32(v_in[at], v_in[at + KV_BITS / 8u], kv_scale(v_word(scale_word(p.v_scales, e)), e));
}

// A block from its words — q8_0: `a` and `b`, 16 values each; q4_0: `a` alone — and its scale.
fn block32(a: vec4<u32>, b: vec4<u32>, d: f32) -> Block32 {
    if (KV_BITS == 8u) {
        return Block32(
            array<vec4<f32>, 4>(q8x4(a.x), q8x4(a.y), q8x4(a.z), q8x4(a.w)),
            array<vec4<f32>, 4>(q8x4(b.x), q8x4(b.y), q8x4(b.z), q8x4(b.w)),
            d,
        );
    }
    return Block32(
        array<vec4<f32>, 4>(q4x4(a.x, 0u), q4x4(a.x, 1u), q4x4(a.y, 0u), q4x4(a.y, 1u)),
        array<vec4<f32>, 4>(q4x4(a.z, 0u), q4x4(a.z, 1u), q4x4(a.w, 0u), q4x4(a.w, 1u)),
        d,
    );
}
