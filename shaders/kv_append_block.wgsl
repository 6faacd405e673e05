// kv_append_block: what kv_append_quant and paged_append_quant share — quantizing a block of
// 32 new values into a quantized destination's two word planes (q8_0 / q4_0 blocks, see
// src/kv_dtype.rs: the quants, then the scales). It finds the block's scale as llama.cpp does
// — q8_0: d = amax / 127, q = round(x / d); q4_0: d = max / −8 (max: the value of largest
// magnitude), q = min(15, floor(x / d + 8.5)) — dividing by the scale as stored (f16), and
// writes the block's quant words and its half of a scale word. Two blocks share a scale word
// and may be written by two invocations (of one dispatch, or of a row another append wrote),
// so the halves are set with atomics; quant words are a block's own.
// The pass's body defines load(which, at), its new value `at` of keys (`which` 0) or values
// (1); the host's prelude defines KV_BITS (8 or 4).

@group(0) @binding(4) var<storage, read_write> quant: array<atomic<u32>>;

const F16_MAX: f32 = 65504.0;

// Quantizes the 32 values load(which, src_at + i) into the block of logical element `e` of
// the planes whose scales start at word `scales`.
fn put_block(which: u32, src_at: u32, e: u32, scales: u32) {
    // The scale: of the largest magnitude (q8_0), or of the value of largest magnitude with its
    // sign (q4_0), as the f16 it is stored as.
    var big = 0.0;
    for (var i = 0u; i < 32u; i++) {
        let x = load(which, src_at + i);
        if (abs(x) > abs(big)) {
            big = x;
        }
    }
    var d = abs(big) / 127.0;
    if (KV_BITS == 4u) {
        d = big / -8.0;
    }
    let stored = unpack2x16float(pack2x16float(vec2<f32>(clamp(d, -F16_MAX, F16_MAX), 0.0))).x;
    var inv = 0.0;
    if (stored != 0.0) {
        inv = 1.0 / stored;
    }
    let bits = pack2x16float(vec2<f32>(stored, 0.0)) & 0xffffu;
    let half = (e / 32u) & 1u;
    let scale_at = scales + e / 64u;
    atomicAnd(&quant[scale_at], 0xffffu << (16u * (1u - half)));
    atomicOr(&quant[scale_at], bits << (16u * half));

    // The quants, a word at a time: 4 bytes (q8_0) or 8 nibbles (q4_0) of consecutive values.
    let per_word = 32u / KV_BITS;
    let first_word = e * KV_BITS / 32u;
    for (var w = 0u; w < 32u / per_word; w++) {
        var word = 0u;
        for (var i = 0u; i < per_word; i++) {
            let x = load(which, src_at + w * per_word + i) * inv;
            var q: u32;
            if (KV_BITS == 8u) {
                // Half away from zero (llama.cpp's roundf), as a byte of two's complement.
                let r = clamp(sign(x) * floor(abs(x) + 0.5), -127.0, 127.0);
                q = bitcast<u32>(i32(r)) & 0xffu;
            } else {
                q = u32(clamp(floor(x + 8.5), 0.0, 15.0));
            }
            word |= q << (KV_BITS * i);
        }
        atomicStore(&quant[first_word + w], word);
    }
}
