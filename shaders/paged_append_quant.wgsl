// paged_append_quant: paged_append into a quantized pool (q8_0 / q4_0 blocks, see
// src/kv_dtype.rs: the pool's logical elements as one buffer of two word planes, the quants,
// then the scales from word `scales`). One invocation per block of 32 values of a new
// (token, KV head) row, for K and for V: it finds the block's scale as llama.cpp does — q8_0:
// d = amax / 127, q = round(x / d); q4_0: d = max / −8 (max: the value of largest magnitude),
// q = min(15, floor(x / d + 8.5)) — dividing by the scale as stored (f16), as
// kv_append_quant.wgsl does, and writes the block's quant words and its half of a scale word.
// Two blocks share a scale word and may be written by two invocations (of this dispatch, or
// of a row another append wrote), so the halves are set with atomics; quant words are a
// block's own. The host's prelude defines KV_BITS (8 or 4).
// Dispatch: ceil(total_new · H_kv · D / 32 / 64) workgroups of 64, over x then y.

struct PagedAppendParams {
    tokens: u32,
    kv_heads: u32,
    head_dim: u32,     // whole blocks of 32
    page_size: u32,
    hnd: u32,          // 1: pages are [2, H_kv, page_size, D]; 0: [2, page_size, H_kv, D]
    groups_x: u32,
    k_offset: u32,     // the new token t's head h of keys at k_offset + t · row_stride +
    v_offset: u32,     // h · head_stride (of values at v_offset + …)
    row_stride: u32,
    head_stride: u32,
    scales: u32,       // the word where the pool's scales plane starts
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: PagedAppendParams;
@group(0) @binding(1) var<storage, read> keys: array<f32>;
@group(0) @binding(2) var<storage, read> values: array<f32>;
@group(0) @binding(3) var<storage, read> slots: array<i32>;
@group(0) @binding(4) var<storage, read_write> pool: array<atomic<u32>>;

const F16_MAX: f32 = 65504.0;

// Quantizes the block of 32 f32 values at `src_at` of K (`which` 0) or V (1) into the block
// of the pool's logical element `e`.
fn put_block(which: u32, src_at: u32, e: u32) {
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
    let scale_at = p.scales + e / 64u;
    atomicAnd(&pool[scale_at], 0xffffu << (16u * (1u - half)));
    atomicOr(&pool[scale_at], bits << (16u * half));

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
        atomicStore(&pool[first_word + w], word);
    }
}

// Element `at` of the new keys (`which` 0) or values (1).
fn load(which: u32, at: u32) -> f32 {
    if (which == 0u) {
        return keys[p.k_offset + at];
    }
    return values[p.v_offset + at];
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let idx = (wid.y * p.groups_x + wid.x) * 64u + lid.x;
    let per_row = p.head_dim / 32u;
    if (idx >= p.tokens * p.kv_heads * per_row) {
        return;
    }
    let g = idx % per_row;
    let kvh = (idx / per_row) % p.kv_heads;
    let token = idx / (per_row * p.kv_heads);
    let slot = slots[token];
    if (slot < 0) {
        return;
    }
    let page = u32(slot) / p.page_size;
    let offset = u32(slot) % p.page_size;
    var at: u32;
    if (p.hnd == 1u) {
        at = ((page * 2u) * p.kv_heads + kvh) * p.page_size * p.head_dim + offset * p.head_dim;
    } else {
        at = ((page * 2u) * p.page_size + offset) * p.kv_heads * p.head_dim + kvh * p.head_dim;
    }
    at += 32u * g;
    let values_at = p.page_size * p.kv_heads * p.head_dim;
    let src = token * p.row_stride + kvh * p.head_stride + 32u * g;
    put_block(0u, src, at);
    put_block(1u, src, at + values_at);
}
