// kv_append_quant: kv_append into a quantized chunk: each invocation takes one block of 32
// values of a new row (from the projection's scratch, QkvElem), finds its scale as llama.cpp
// does — q8_0: d = amax / 127, q = round(x / d); q4_0: d = max / −8 (max: the value of largest
// magnitude), q = min(15, floor(x / d + 8.5)) — dividing by the scale as stored (f16), and
// writes its quant words and its half of a scale word (see src/kv_dtype.rs for the planes).
// Two blocks share a scale word and may be written by two invocations (of this dispatch, or
// of a row another step wrote), so the halves are set with atomics; quant words are a block's
// own. The host's prelude defines QkvElem and KV_BITS.
// Dispatch: ceil(blocks · count · width / 32 / 64) workgroups of 64, over x then y.

struct AppendParams {
    blocks: u32,      // B · H_kv
    count: u32,       // rows copied per block
    width: u32,       // elements per row (the head size, whole blocks of 32)
    src_offset: u32,  // element of the scratch's block 0, row 0
    src_stride: u32,
    src_first: u32,
    dst_stride: u32,  // rows per block of the chunk (its keys)
    dst_first: u32,
    groups_x: u32,
    dst_scales: u32,  // word where the chunk's scales plane starts
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: AppendParams;
@group(0) @binding(1) var<storage, read> src: array<QkvElem>;
@group(0) @binding(4) var<storage, read_write> dst: array<atomic<u32>>;

const F16_MAX: f32 = 65504.0;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let idx = (wid.y * p.groups_x + wid.x) * 64u + lid.x;
    let per_row = p.width / 32u;
    if (idx >= p.blocks * p.count * per_row) {
        return;
    }
    let g = idx % per_row;
    let row = (idx / per_row) % p.count;
    let block = idx / (per_row * p.count);
    let src_at = p.src_offset + (block * p.src_stride + p.src_first + row) * p.width + 32u * g;
    let e = (block * p.dst_stride + p.dst_first + row) * p.width + 32u * g;

    // The scale: of the largest magnitude (q8_0), or of the value of largest magnitude with
    // its sign (q4_0), as the f16 it is stored as.
    var big = 0.0;
    for (var i = 0u; i < 32u; i++) {
        let x = f32(src[src_at + i]);
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
    let scale_at = p.dst_scales + e / 64u;
    atomicAnd(&dst[scale_at], 0xffffu << (16u * (1u - half)));
    atomicOr(&dst[scale_at], bits << (16u * half));

    // The quants, a word at a time: 4 bytes (q8_0) or 8 nibbles (q4_0) of consecutive values.
    let per_word = 32u / KV_BITS;
    let first_word = e * KV_BITS / 32u;
    for (var w = 0u; w < 32u / per_word; w++) {
        var word = 0u;
        for (var i = 0u; i < per_word; i++) {
            let x = f32(src[src_at + w * per_word + i]) * inv;
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
        atomicStore(&dst[first_word + w], word);
    }
}
