//! Qwen3-Next's output gate (`AttentionConfig::with_output_gate`): the combined heads times
//! sigmoid(W_g·x + b_g) of the query input, before W_o — and BitNet's output norm
//! (`with_output_norm`: an RMSNorm of each token's combined heads) — on the fused path
//! (prefill and decode shapes), the multi-pass path and a KV cache's steps, against the f64
//! reference; each binds, and a config or weights without one of the pair are refused.

mod common;

use common::{
    assert_close, assert_steps_match_on_both_paths, check_against_reference, check_both_paths, gpu,
    options, BOTH_PATHS,
};
use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Error, KvCache, Mask, MultiHeadAttention, Tensor,
};

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
    let (b, lk) = (2, 9);
    for lq in [9, 1] {
        let q = Tensor::random([b, lq, 32], 40 + lq as u64);
        let kv = Tensor::random([b, lk, 32], 41);
        for path in BOTH_PATHS {
            let label = format!("norm Lq {lq} {path:?}");
            check_against_reference(
                &label,
                config,
                &q,
                &kv,
                &kv,
                &Mask::Causal,
                &options(path, false),
            );
        }
    }
    let weights = AttentionWeights::random(&config, 7);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let x = Tensor::random([2, 9, 32], 8);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let mut cache = KvCache::new(&mha, 2, 9).unwrap();
    for (pos, n) in [(0, 5), (5, 1), (6, 3)] {
        let rows: Vec<f32> = (0..2)
            .flat_map(|b| x.data()[(b * 9 + pos) * 32..(b * 9 + pos + n) * 32].to_vec())
            .collect();
        let step = mha
            .forward_step(&mut cache, &Tensor::new([2, n, 32], rows).unwrap())
            .unwrap();
        let r: Vec<f64> = (0..2)
            .flat_map(|b| want.output[(b * 9 + pos) * 32..(b * 9 + pos + n) * 32].to_vec())
            .collect();
        assert_close(&format!("norm step at {pos}"), step.data(), &r);
    }
    let plain = AttentionConfig {
        output_norm: None,
        ..config
    };
    let unnormed = AttentionWeights {
        output_norm: None,
        ..weights.clone()
    };
    let without = reference::forward(&plain, &unnormed, &x, &x, &x, &Mask::Causal).unwrap();
    assert!(common::max_err_f64(&want.output, &without.output) > 1e-2);
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
    for lq in [13, 1, 2] {
        let q = Tensor::random([b, lq, 32], 20 + lq as u64);
        let kv = Tensor::random([b, lk, 32], 30);
        for mask in [Mask::None, Mask::Causal, Mask::KeyPadding(vec![lk, lk - 3])] {
            check_both_paths(
                &format!("Lq {lq} {}", mask.kind_name()),
                config,
                &q,
                &kv,
                &mask,
            );
        }
    }
    // The gate binds: without it the answer is another one.
    let weights = AttentionWeights::random(&config, 42);
    let x = Tensor::random([b, lk, 32], 3);
    let plain = AttentionConfig {
        output_gate: false,
        ..config
    };
    let ungated = AttentionWeights {
        gate: None,
        ..weights.clone()
    };
    let with = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let without = reference::forward(&plain, &ungated, &x, &x, &x, &Mask::Causal).unwrap();
    assert!(common::max_err_f64(&with.output, &without.output) > 1e-2);
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
