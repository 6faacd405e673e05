// Shared mask rule of scores.wgsl and flash_attention.wgsl (the host prepends it, after a
// prelude defining MASKED_SCORE and the MASK_* kinds from src/kernels/mask.rs).
// A masked score is *replaced* by MASKED_SCORE (-1e9), as the seeds' masked_fill does; the
// bias kind adds.
//   MASK_CAUSAL       key j visible iff j <= i + (Lk - Lq)
//   MASK_SLIDING_WINDOW  causal, and at most `window` keys back: i + off - window < j <= i + off
//   MASK_KEY_PADDING  mask_words[b] = number of valid keys
//   MASK_KEEP         one keep byte per element, 4 per word
//   MASK_BIAS         f32 bits, added to the score
//   MASK_CAUSAL_KEEP  causal (window > 0: sliding) and one keep byte per (b, j): a padded batch
// Before any of them a soft-cap (Gemma 2's attn_logit_softcapping), when `softcap` > 0, turns
// the scaled score s into softcap · tanh(s / softcap), and ALiBi, when `alibi_heads` > 0, adds
// slope(h) · (j − i′), i′ = i + causal_offset the query's position (≤ 0 on the keys a causal
// query sees, so the biases that matter stay small). Llama 4's temperature tuning, when
// temp_floor_scale > 0, multiplies the scaled score by ln(1 + floor((i′ + 1) / floor_scale)) ·
// attn_scale + 1 (transformers scales q, the same product); a chunk (> 0) on MASK_CAUSAL or
// MASK_CAUSAL_KEEP also hides the keys outside the query's chunk: j / chunk ≠ i′ / chunk.

struct MaskParams {
    kind: u32,
    causal_offset: i32,       // Lk - Lq (of the whole problem, shifted for a query block)
    base: u32,                // element offset of this chunk's (b = 0, i = 0) in the mask
    batch_base: u32,          // first batch of this chunk (key padding lengths)
    strides: vec4<u32>,       // element strides over (b, h, i, j); 0 where broadcast
    window: u32,              // MASK_SLIDING_WINDOW: keys a query sees, itself included
    softcap: f32,             // 0: scores are not capped
    alibi_max_bias: f32,
    alibi_heads: u32,         // query heads the slopes are spread over; 0: no ALiBi
    chunk: u32,               // causal kinds: only keys of the query's chunk of positions; 0: none
    temp_floor_scale: f32,    // Llama 4's temperature tuning; 0: none
    temp_attn_scale: f32,
    _pad: u32,
}

@group(0) @binding(6) var<storage, read> mask_words: array<u32>;
@group(0) @binding(7) var<uniform> mask: MaskParams;

fn mask_element(b: u32, h: u32, i: u32, j: u32) -> u32 {
    return mask.base + b * mask.strides.x + h * mask.strides.y + i * mask.strides.z + j * mask.strides.w;
}

// MASK_CAUSAL_KEEP: whether key j of batch b is a real token (its keep byte is nonzero).
fn key_kept(b: u32, j: u32) -> bool {
    let e = mask_element(b, 0u, 0u, j);
    return ((mask_words[e / 4u] >> ((e % 4u) * 8u)) & 0xffu) != 0u;
}

// tanh's argument is clamped: tanh(±15) is ±1 in f32, and a driver's tanh of a huge value
// may be NaN (exp overflow in (e^2x − 1) / (e^2x + 1)).
fn soft_cap(s: f32) -> f32 {
    if (mask.softcap > 0.0) {
        return mask.softcap * tanh(clamp(s / mask.softcap, -15.0, 15.0));
    }
    return s;
}

// Head h's slope, as AttentionConfig's alibi_slope: p = the largest power of two <= heads.
fn alibi_slope(h: u32) -> f32 {
    let p = 1u << firstLeadingBit(mask.alibi_heads);
    if (h < p) {
        return exp2(-mask.alibi_max_bias * f32(h + 1u) / f32(p));
    }
    return exp2(-mask.alibi_max_bias * f32(2u * (h - p) + 1u) / f32(2u * p));
}

// Whether key j lies outside the chunk of the query at position `last` (>= j: causal first).
fn other_chunk(last: i32, j: u32) -> bool {
    return mask.chunk > 0u && last >= 0 && j / mask.chunk != u32(last) / mask.chunk;
}

fn temperature(i: u32) -> f32 {
    let p = f32(max(i32(i) + mask.causal_offset, 0));
    return log(1.0 + floor((p + 1.0) / mask.temp_floor_scale)) * mask.temp_attn_scale + 1.0;
}

fn apply_mask(scaled: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    var tuned = scaled;
    if (mask.temp_floor_scale > 0.0) {
        tuned = scaled * temperature(i);
    }
    var score = soft_cap(tuned);
    if (mask.alibi_heads > 0u) {
        score += alibi_slope(h) * f32(i32(j) - (i32(i) + mask.causal_offset));
    }
    switch mask.kind {
        case MASK_CAUSAL: {
            let last = i32(i) + mask.causal_offset;
            if (i32(j) > last || other_chunk(last, j)) {
                return MASKED_SCORE;
            }
        }
        case MASK_SLIDING_WINDOW: {
            let last = i32(i) + mask.causal_offset;
            if (i32(j) > last || i32(j) <= last - i32(mask.window)) {
                return MASKED_SCORE;
            }
        }
        case MASK_KEY_PADDING: {
            if (j >= mask_words[mask.batch_base + b]) {
                return MASKED_SCORE;
            }
        }
        case MASK_KEEP: {
            let e = mask_element(b, h, i, j);
            if (((mask_words[e / 4u] >> ((e % 4u) * 8u)) & 0xffu) == 0u) {
                return MASKED_SCORE;
            }
        }
        case MASK_CAUSAL_KEEP: {
            let last = i32(i) + mask.causal_offset;
            let too_old = mask.window > 0u && i32(j) <= last - i32(mask.window);
            if (i32(j) > last || too_old || other_chunk(last, j) || !key_kept(b, j)) {
                return MASKED_SCORE;
            }
        }
        case MASK_BIAS: {
            return score + bitcast<f32>(mask_words[mask_element(b, h, i, j)]);
        }
        default: {}
    }
    return score;
}
