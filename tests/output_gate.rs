//! Qwen3-Next's output gate (`AttentionConfig::with_output_gate`): the combined heads times
//! sigmoid(W_g·x + b_g) of the query input, before W_o — and BitNet's output norm
//! (`with_output_norm`: an RMSNorm of each token's combined heads) — on the fused path
//! (prefill and decode shapes), the multi-pass path and a KV cache's steps, against the f64
//! reference; each binds, and a config or weights without one of the pair are refused.

mod common;

use common::{
    assert_feature_binds, assert_steps_match_causal_forward, assert_steps_match_on_both_paths,
    check_both_paths_over, gpu,
};
use wgpu_mha::{AttentionConfig, AttentionWeights, Error, Mask, MultiHeadAttention, Tensor};

fn gated() -> AttentionConfig {
    AttentionConfig::classic(32, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
        .with_output_gate()
        .unwrap()
}

fn normed() -> AttentionConfig {
    AttentionConfig::classic(32, 4)
        .unwrap()
        .with_output_norm(1e-5)
        .unwrap()
}

#[test]
fn normed_outputs_match_the_reference_on_every_path_and_in_a_cache() {
    let config = normed();
    check_both_paths_over("norm", config, [2, 9], &[9, 1], (40, 41), |_| {
        vec![Mask::Causal]
    });
    let weights = AttentionWeights::random(&config, 7);
    let x = Tensor::random([2, 9, 32], 8);
    assert_steps_match_causal_forward("norm", config, &weights, &x, &[5, 1, 3]);
    assert_feature_binds("norm", config, [2, 9], |c, w| {
        c.output_norm = None;
        w.output_norm = None;
    });
    let short = AttentionWeights {
        output_norm: Some(vec![1.0; 31]),
        ..weights
    };
    let err = MultiHeadAttention::new(gpu(), config, &short)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("output_norm"), "{err}");
}

#[test]
fn gated_outputs_match_the_reference_on_every_path() {
    let config = gated();
    let (b, lk) = (2, 13);
    check_both_paths_over("gate", config, [b, lk], &[13, 1, 2], (20, 30), |_| {
        vec![Mask::None, Mask::Causal, Mask::KeyPadding(vec![lk, lk - 3])]
    });
    // The gate binds: without it the answer is another one.
    assert_feature_binds("gate", config, [b, lk], |c, w| {
        c.output_gate = false;
        w.gate = None;
    });
}

#[test]
fn a_kv_cache_decodes_gated_outputs_like_the_reference() {
    let config = gated();
    let weights = AttentionWeights::random(&config, 5);
    let x = Tensor::random([2, 9, 32], 6);
    assert_steps_match_on_both_paths("gate", config, &weights, &x, &[4, 1, 1, 3]);
}

#[test]
fn a_gate_needs_its_weights_and_an_output_projection() {
    let per_head = AttentionConfig::per_head(24, 16, 8, 4).unwrap();
    assert!(matches!(per_head.with_output_gate(), Err(Error::Config(_))));
    let config = gated();
    let weights = AttentionWeights::random(&config, 1);
    let missing = AttentionWeights {
        gate: None,
        ..weights.clone()
    };
    let err = MultiHeadAttention::new(gpu(), config, &missing)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("W_g"), "{err}");
    let plain = AttentionConfig {
        output_gate: false,
        ..config
    };
    let err = MultiHeadAttention::new(gpu(), plain, &weights)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("W_g"), "{err}");
}
