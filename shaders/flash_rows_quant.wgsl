// flash_attention's Q as stored floats (QkvElem) and K and V as q8_0 / q4_0 blocks
// (kv_quant.wgsl): a staged vec4 of K or V is one quant word and one scale word. Head sizes are
// whole blocks (the host checks), so a vec4 lies inside a row or past its end.

@group(0) @binding(1) var<storage, read> q_in: array<QkvElem>;
@group(0) @binding(2) var<storage, read> k_in: array<u32>;
@group(0) @binding(3) var<storage, read> v_in: array<u32>;

// Elements d .. d + 3 of the row at `base` as a vec4 (zero past the row's end), or zeros for
// a key past the last one (`live` false).
fn staged_vec4(which: u32, base: u32, d: u32, width: u32, live: bool) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (live && d < width) {
        let e = base + d;
        switch which {
            case Q_ROW: {
                // Whole blocks: the four elements are all inside the row (no per-element test,
                // no dynamic component index, which GL's compiler unrolls slowly).
                v = vec4<f32>(f32(q_in[e]), f32(q_in[e + 1u]), f32(q_in[e + 2u]), f32(q_in[e + 3u]));
            }
            case K_ROW: { v = dequant4(k_in[quant_word(e)], k_in[scale_word(p.k_scales, e)], e); }
            default: { v = dequant4(v_in[quant_word(e)], v_in[scale_word(p.v_scales, e)], e); }
        }
    }
    return v;
}
