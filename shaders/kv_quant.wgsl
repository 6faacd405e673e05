// kv_quant: reading llama.cpp's q8_0 / q4_0 blocks from a quantized K/V buffer (see
// src/kv_dtype.rs): two planes of u32 words, the quants of logical elements 0..E (element e in
// byte e, or nibble e) then the scales, element e's f16 scale at half 2·scales + e/32. The host's
// prelude defines KV_BITS (8 or 4); the passes bind the words and call these on what they load.

// The word holding elements e .. e + 3 (e a multiple of 4).
fn quant_word(e: u32) -> u32 {
    return e * KV_BITS / 32u;
}

// The word holding element e's scale, from a plane starting at word `scales`.
fn scale_word(scales: u32, e: u32) -> u32 {
    return scales + e / 64u;
}

// Element e's scale, from its scale word `s` (unpack2x16float needs no SHADER_F16).
fn kv_scale(s: u32, e: u32) -> f32 {
    return unpack2x16float(s)[(e / 32u) & 1u];
}

// The four q8_0 quants of a word: bytes as two's complement, each moved to the top and
// shifted down with its sign.
fn q8x4(q: u32) -> vec4<f32> {
    let b = bitcast<vec4<i32>>(vec4<u32>(q << 24u, q << 16u, q << 8u, q)) >> vec4<u32>(24u);
    return vec4<f32>(b);
}

// The four q4_0 values in nibbles 0..3 (`upper` 0) or 4..7 (1) of a word, q − 8.
fn q4x4(q: u32, upper: u32) -> vec4<f32> {
    let h = q >> (16u * upper);
    let n = vec4<u32>(h, h >> 4u, h >> 8u, h >> 12u) & vec4<u32>(15u);
    return vec4<f32>(n) - 8.0;
}

// Elements e .. e + 3 from their quant word `q` and scale word `s`, as f32.
fn dequant4(q: u32, s: u32, e: u32) -> vec4<f32> {
    return dequant4_at(q, kv_scale(s, e), e);
}

// Elements e .. e + 3 from their quant word `q` and their block's scale `d` (unpacked once
// for many vec4s of a block), as f32.
fn dequant4_at(q: u32, d: f32, e: u32) -> vec4<f32> {
    if (KV_BITS == 8u) {
        return q8x4(q) * d;
    }
    return q4x4(q, (e / 4u) & 1u) * d;
}

// Elements e .. e + 3 from their quant word `q`, unscaled: the quants as f32 (q8_0's signed
// bytes; q4_0's nibbles less 8, by flipping each nibble's top bit and shifting it down with its
// sign), the values once multiplied by their block's scale — for passes that scale a block's
// sums once rather than every value.
fn quant4_raw(q: u32, e: u32) -> vec4<f32> {
    if (KV_BITS == 8u) {
        let b = vec4<u32>(q << 24u, q << 16u, q << 8u, q);
        return vec4<f32>(bitcast<vec4<i32>>(b) >> vec4<u32>(24u));
    }
    let h = (q ^ 0x88888888u) << (16u * (1u - ((e / 4u) & 1u)));
    let n = vec4<u32>(h << 12u, h << 8u, h << 4u, h);
    return vec4<f32>(bitcast<vec4<i32>>(n) >> vec4<u32>(28u));
}
