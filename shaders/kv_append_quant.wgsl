// kv_append_quant: kv_append into a quantized chunk: each invocation takes one block of 32
// values of a new row (from the projection's scratch, QkvElem) and quantizes it into the
// chunk's planes (kv_append_block.wgsl; the scales from word p.dst_scales).

const PER_INVOCATION: u32 = 32u;

fn load(which: u32, at: u32) -> f32 {
    return f32(src[at]);
}

fn put(src_at: u32, e: u32) {
    put_block(0u, src_at, e, p.dst_scales);
}
