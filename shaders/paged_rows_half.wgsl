// An f16 pool's rows as whole vec4s, each read as two u32 words (four halves) and unpacked,
// where the head size is a multiple of 4. On llvmpipe every lane-wide load is a loop over the
// lanes, one scalar per component: a vec4<f16> is four 16-bit loads, a vec2<u32> two 32-bit
// ones, so this halves the loads of an f16 pool. `bench --only serve --config serve:div=4`,
// lavapipe on a 2-core EPYC, 2026-12-07: the f16 mixed decode 0.41x -> 0.56-0.61x the read
// probe (a chunk of 16 halves as two vec4<u32> loads measured the same, within noise).

@group(0) @binding(2) var<storage, read> pool: array<vec2<u32>>;   // [pages, 2, ...] of f16 pairs

fn unpack_half4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// Vec4 c of the pool row starting at element `base`, zero where `live` is false (a key past
// the chunk).
fn pool_vec4(base: u32, c: u32, live: bool) -> vec4<f32> {
    return select(vec4<f32>(0.0), unpack_half4(pool[base / 4u + c]), live);
}

// The decode body's chunks (see paged_rows_vec4.wgsl): only where they start.
alias PoolChunk = u32;

fn pool_chunk(base: u32, c0: u32) -> PoolChunk {
    return base / 4u + c0;
}

fn chunk_vec4(ch: PoolChunk, i: u32) -> vec4<f32> {
    return unpack_half4(pool[ch + i]);
}

fn pool_scale(base: u32, c: u32) -> f32 {
    return 1.0;
}
