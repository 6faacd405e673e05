// paged_append_quant: paged_append into a quantized pool (q8_0 / q4_0 blocks, see
// src/kv_dtype.rs: the pool's logical elements as one buffer of two word planes, the quants,
// then the scales from word p.scales). One invocation per block of 32 values of a new
// (token, KV head) row, for K and for V, each quantized as kv_append_quant quantizes
// (kv_append_block.wgsl).

const PER_INVOCATION: u32 = 32u;

// Element `at` of the new keys (`which` 0) or values (1).
fn load(which: u32, at: u32) -> f32 {
    if (which == 0u) {
        return keys[p.k_offset + at];
    }
    return values[p.v_offset + at];
}

fn put(src: u32, k_at: u32, v_at: u32) {
    put_block(0u, src, k_at, p.scales);
    put_block(1u, src, v_at, p.scales);
}
