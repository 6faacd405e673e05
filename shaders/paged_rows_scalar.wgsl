// The pool's rows element by element, for head sizes that are not whole vec4s.

@group(0) @binding(2) var<storage, read> pool: array<KvElem>;   // [pages, 2, ...]

// Vec4 c of the pool row starting at element `base`, zero past the head size or where `live`
// is false (a key past the chunk).
fn pool_vec4(base: u32, c: u32, live: bool) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    if (live) {
        let at = base + 4u * c;
        if (4u * c + 3u < p.head_dim) {
            x = vec4<f32>(f32(pool[at]), f32(pool[at + 1u]), f32(pool[at + 2u]), f32(pool[at + 3u]));
        } else {
            for (var e = 0u; e < 4u; e++) {
                if (4u * c + e < p.head_dim) {
                    x[e] = f32(pool[at + e]);
                }
            }
        }
    }
    return x;
}
