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
