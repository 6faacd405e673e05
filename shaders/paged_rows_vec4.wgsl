// The pool's rows as whole vec4s, where the head size is a multiple of 4 (so every row starts
// on one): one load per vec4 instead of four, each a loop over the lanes on llvmpipe.

@group(0) @binding(2) var<storage, read> pool: array<vec4<KvElem>>;   // [pages, 2, ...]

// Vec4 c of the pool row starting at element `base`, zero where `live` is false (a key past
// the chunk).
fn pool_vec4(base: u32, c: u32, live: bool) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(pool[base / 4u + c]), live);
}

// The decode body's chunks of vec4s c0 .. c0 + 3 (see paged_rows_quant.wgsl): here only where
// they start, each vec4 loaded by chunk_vec4; a float pool has no scales.
alias PoolChunk = u32;

fn pool_chunk(base: u32, c0: u32) -> PoolChunk {
    return base / 4u + c0;
}

fn chunk_vec4(ch: PoolChunk, i: u32) -> vec4<f32> {
    return vec4<f32>(pool[ch + i]);
}

fn pool_scale(base: u32, c: u32) -> f32 {
    return 1.0;
}
