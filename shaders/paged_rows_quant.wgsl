// The pool's rows from q8_0 / q4_0 blocks (kv_quant.wgsl; the pool's logical elements as one
// buffer of two word planes, see src/kv_dtype.rs). Head sizes are whole blocks (the host
// checks), so a vec4 never crosses a row's end, a row starts on a block, and both planes start
// on a vec4 of words (the quants plane at word 0, the scales at E/4 or E/8 words, E a multiple
// of 64): the pool is bound as vec4s of words, so that one load brings a chunk of 16 q8_0
// values (or a block of 32 q4_0 ones). On llvmpipe a load costs about as much whether it brings
// a word or a vec4 (each is a gather over the lanes), so the decode body's loads per key are a
// quarter of a float pool's.

@group(0) @binding(2) var<storage, read> pool: array<vec4<u32>>;   // [pages, 2, ...] in blocks

// Where the pool's scales plane starts: the pool's own uniform (it depends on the pool's page
// count, which a plan does not know).
struct PoolFormat {
    scales: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(0) @binding(7) var<uniform> pool_format: PoolFormat;

// Word w of the pool.
fn pool_word(w: u32) -> u32 {
    return pool[w >> 2u][w & 3u];
}

// Vec4 c of the pool row starting at element `base`, zero where `live` is false (a key past
// the chunk; `base` is still a row of the pool).
fn pool_vec4(base: u32, c: u32, live: bool) -> vec4<f32> {
    let e = base + 4u * c;
    let x = dequant4(pool_word(quant_word(e)), pool_word(scale_word(pool_format.scales, e)), e);
    return select(vec4<f32>(0.0), x, live);
}

// What the decode body reads vec4s c0 .. c0 + 3 of a row from (c0 a multiple of 4: 16 values
// of one block): their quant words, q8_0's four, q4_0's two (in x, y).
alias PoolChunk = vec4<u32>;

// The chunk of vec4s c0 .. c0 + 3 of the pool row at element `base`: one load.
fn pool_chunk(base: u32, c0: u32) -> PoolChunk {
    let w = quant_word(base + 4u * c0);
    let v = pool[w >> 2u];
    if (KV_BITS == 8u) {
        return v;
    }
    return select(v, v.zwzw, (w & 2u) != 0u);
}

// Vec4 c0 + i of the chunk `ch` (i a constant wherever called), unscaled: times its block's
// pool_scale, the values.
fn chunk_vec4(ch: PoolChunk, i: u32) -> vec4<f32> {
    if (KV_BITS == 8u) {
        return quant4_raw(ch[i], 0u);
    }
    return quant4_raw(ch[i / 2u], 4u * i);
}

// The scale of the block holding vec4 c of the row at element `base`: what chunk_vec4's
// values of that block (a row's vec4s 8k .. 8k + 7) are multiplied by, unpacked once for them.
fn pool_scale(base: u32, c: u32) -> f32 {
    let e = base + 4u * c;
    return unpack2x16float(pool_word(scale_word(pool_format.scales, e)))[(e / 32u) & 1u];
}
