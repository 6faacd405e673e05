// The pool's rows from q8_0 / q4_0 blocks (kv_quant.wgsl; the pool's logical elements as one
// buffer of two word planes, see src/kv_dtype.rs): one word load per vec4 of a q8_0 row (per
// two of a q4_0 row) and one per block's scale, instead of a float load per element. Head
// sizes are whole blocks (the host checks), so a vec4 never crosses a row's end.

@group(0) @binding(2) var<storage, read> pool: array<u32>;   // [pages, 2, ...] in blocks

// Where the pool's scales plane starts: the pool's own uniform (it depends on the pool's page
// count, which a plan does not know).
struct PoolFormat {
    scales: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(0) @binding(7) var<uniform> pool_format: PoolFormat;

// Vec4 c of the pool row starting at element `base`, zero where `live` is false (a key past
// the chunk; `base` is still a row of the pool).
fn pool_vec4(base: u32, c: u32, live: bool) -> vec4<f32> {
    let e = base + 4u * c;
    let x = dequant4(pool[quant_word(e)], pool[scale_word(pool_format.scales, e)], e);
    return select(vec4<f32>(0.0), x, live);
}

// The scale of the block holding vec4 c of the row at element `base`: what pool_vec4_at takes
// for the vec4s of that block (a row's vec4s 8k .. 8k + 7), unpacked once for them.
fn pool_scale(base: u32, c: u32) -> f32 {
    let e = base + 4u * c;
    return unpack2x16float(pool[scale_word(pool_format.scales, e)])[(e / 32u) & 1u];
}

// Vec4 c of the pool row at element `base`, of a block whose scale is `d` (pool_scale).
fn pool_vec4_at(base: u32, c: u32, d: f32) -> vec4<f32> {
    let e = base + 4u * c;
    return dequant4_at(pool[quant_word(e)], d, e);
}
