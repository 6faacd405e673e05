// The pool's rows as whole vec4s, where the head size is a multiple of 4 (so every row starts
// on one): one load per vec4 instead of four, each a loop over the lanes on llvmpipe.

@group(0) @binding(2) var<storage, read> pool: array<vec4<KvElem>>;   // [pages, 2, ...]

// Vec4 c of the pool row starting at element `base`, zero where `live` is false (a key past
// the chunk).
fn pool_vec4(base: u32, c: u32, live: bool) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(pool[base / 4u + c]), live);
}

// A float pool has no scales (the quantized rows' pool_scale / pool_vec4_at, for passes that
// read a block's vec4s together).
fn pool_scale(base: u32, c: u32) -> f32 {
    return 1.0;
}

fn pool_vec4_at(base: u32, c: u32, d: f32) -> vec4<f32> {
    return vec4<f32>(pool[base / 4u + c]);
}
