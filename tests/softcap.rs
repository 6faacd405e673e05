//! Logit soft-capping (Gemma 2's `attn_logit_softcapping`): every scaled score s becomes
//! c · tanh(s / c) before the mask, on the fused path (prefill and decode), the multi-pass path
//! (probabilities too) and a KV cache's steps, for every mask kind, each against the f64
//! reference; the cap binds (scores are scaled up so that |s| ≫ c), so an engine that ignored
//! it would fail. Head sizes 8 and 16, which the rest of the suite compiles anyway.

mod common;

use common::{assert_feature_binds, assert_steps_match_causal_forward, check_both_paths_over};
use wgpu_mha::{AttentionConfig, AttentionWeights, Error, Mask, Tensor};

/// GQA with 4 query heads of 8 over 2 key/value heads, scores scaled ×3 and capped at 2.
fn capped() -> AttentionConfig {
    AttentionConfig::classic(32, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
        .with_scale(3.0)
        .unwrap()
        .with_softcap(2.0)
        .unwrap()
}

fn masks(b: usize, lq: usize, lk: usize) -> Vec<Mask> {
    let bits = common::bits(b * lq * lk, 11);
    let bias: Vec<f32> = (0..lq * lk).map(|e| (e % 7) as f32 * -0.5).collect();
    vec![
        Mask::None,
        Mask::Causal,
        Mask::SlidingWindow(3),
        Mask::KeyPadding(vec![lk, lk - 2]),
        Mask::block([b, 1, lq, lk], &bits).unwrap(),
        Mask::Bias(Tensor::new([1, 1, lq, lk], bias).unwrap()),
    ]
}

#[test]
fn capped_scores_match_the_reference_on_every_path_and_mask() {
    let config = capped();
    let (b, lk) = (2, 13);
    check_both_paths_over("softcap", config, [b, lk], &[13, 1, 2], (20, 30), |lq| {
        masks(b, lq, lk)
    });
    // The cap binds: without it the answer is another one.
    assert_feature_binds("softcap", config, [b, lk], |c, _| c.softcap = None);
}

#[test]
fn a_kv_cache_decodes_capped_scores_like_the_reference() {
    // Per-head layout (d16 queries and keys, d8 values), multi-query.
    let config = AttentionConfig::per_head(24, 16, 8, 4)
        .unwrap()
        .with_kv_heads(1)
        .unwrap()
        .with_scale(1.5)
        .unwrap()
        .with_softcap(1.0)
        .unwrap();
    let weights = AttentionWeights::random(&config, 5);
    let x = Tensor::random([2, 9, 24], 6);
    assert_steps_match_causal_forward("softcap", config, &weights, &x, &[4, 1, 1, 3]);
}

#[test]
fn a_cap_that_is_not_finite_and_positive_is_refused() {
    for cap in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        match AttentionConfig::classic(32, 4).unwrap().with_softcap(cap) {
            Err(Error::Config(m)) => assert!(m.contains("soft-cap"), "{m}"),
            other => panic!("cap {cap}: {other:?}"),
        }
    }
}
