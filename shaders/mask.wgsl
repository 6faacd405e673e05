// Shared mask rule of scores.wgsl and flash_attention.wgsl (the host prepends it).
// A masked score is *replaced* by -1e9, as the seeds' masked_fill does; the bias kind adds.

const MASKED_SCORE: f32 = -1e9;

const MASK_NONE: u32 = 0u;
const MASK_CAUSAL: u32 = 1u;       // key j visible iff j <= i + (Lk - Lq)
const MASK_KEY_PADDING: u32 = 2u;  // mask_words[b] = number of valid keys
const MASK_KEEP: u32 = 3u;         // one keep byte per element, 4 per word
const MASK_BIAS: u32 = 4u;         // f32 bits, added to the score

struct MaskParams {
    kind: u32,
    causal_offset: i32,       // Lk - Lq (of the whole problem, shifted for a query block)
    base: u32,                // element offset of this chunk's (b = 0, i = 0) in the mask
    batch_base: u32,          // first batch of this chunk (key padding lengths)
    strides: vec4<u32>,       // element strides over (b, h, i, j); 0 where broadcast
}

@group(0) @binding(6) var<storage, read> mask_words: array<u32>;

fn mask_element(m: MaskParams, b: u32, h: u32, i: u32, j: u32) -> u32 {
    return m.base + b * m.strides.x + h * m.strides.y + i * m.strides.z + j * m.strides.w;
}

fn apply_mask(m: MaskParams, score: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    switch m.kind {
        case MASK_CAUSAL: {
            if (i32(j) > i32(i) + m.causal_offset) {
                return MASKED_SCORE;
            }
        }
        case MASK_KEY_PADDING: {
            if (j >= mask_words[m.batch_base + b]) {
                return MASKED_SCORE;
            }
        }
        case MASK_KEEP: {
            let e = mask_element(m, b, h, i, j);
            if (((mask_words[e / 4u] >> ((e % 4u) * 8u)) & 0xffu) == 0u) {
                return MASKED_SCORE;
            }
        }
        case MASK_BIAS: {
            return score + bitcast<f32>(mask_words[mask_element(m, b, h, i, j)]);
        }
        default: {}
    }
    return score;
}
