//! q/k normalisation before RoPE — per-head RMSNorm with one weight (Qwen3) or Gemma's `1 + w`,
//! per-head LayerNorm with a weight per head (StableLM, Cohere), RMSNorm over the whole
//! projection (OLMo 2), per-head LayerNorm with a bias (Persimmon) — on the fused path
//! (prefill and decode), the multi-pass path and a KV cache's steps, each against the f64
//! reference; and the norm changes the answer, so an engine that skipped it would fail. And
//! OLMo's clip_qkv, the other pass on the projections.

mod common;

use common::{
    assert_feature_binds, assert_module_matches_on_both_paths, assert_steps_match_causal_forward,
    check_both_paths_over,
};
use wgpu_mha::model::qk_norm::{NormKind, NormScope, QkNorm, QkNormWeights};
use wgpu_mha::model::rope::{Rope, RopeScaling};
use wgpu_mha::{reference, AttentionConfig, AttentionWeights, Mask, MultiHeadAttention, Tensor};

fn norms() -> [(&'static str, QkNorm); 4] {
    let rms = QkNorm::rms_per_head(1e-6);
    [
        ("rms per head", rms),
        (
            "gemma rms 1 + w",
            QkNorm {
                weight_offset: 1.0,
                ..rms
            },
        ),
        (
            "layer norm per head",
            QkNorm {
                kind: NormKind::Layer,
                eps: 1e-5,
                ..rms
            },
        ),
        (
            "rms over the projection",
            QkNorm {
                scope: NormScope::Whole,
                ..rms
            },
        ),
    ]
}

/// GQA, 4 query heads of 16 over 2 key/value heads, half of each head rotated.
fn config(norm: QkNorm) -> AttentionConfig {
    let rope = Rope {
        theta: 10_000.0,
        rotary_dims: 8,
        interleaved: false,
        scaling: RopeScaling::None,
    };
    AttentionConfig::classic(64, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
        .with_qk_norm(norm)
        .unwrap()
        .with_rope(rope)
        .unwrap()
}

#[test]
fn normalised_queries_and_keys_match_the_reference_on_every_path() {
    let (b, lk) = (2, 11);
    for (name, norm) in norms() {
        let config = config(norm);
        check_both_paths_over(name, config, [b, lk], &[11, 1, 3], (20, 30), |_| {
            vec![Mask::Causal, Mask::KeyPadding(vec![lk, lk - 3])]
        });
        // The norm changes the answer: without it the reference differs.
        assert_feature_binds(name, config, [b, lk], |c, w| {
            c.qk_norm = None;
            w.qk_norm = None;
        });
    }
}

#[test]
fn a_kv_cache_decodes_normalised_keys_like_the_full_forward() {
    for (name, norm) in norms() {
        let config = config(norm);
        let mut weights = AttentionWeights::random(&config, 5);
        if norm.scope == NormScope::PerHead && norm.kind == NormKind::Rms {
            // Qwen3's layout: one [head_dim] weight shared by every head.
            let w = weights.qk_norm.as_ref().unwrap();
            weights.qk_norm = Some(QkNormWeights::new(w.q[..16].to_vec(), w.k[..16].to_vec()));
        }
        let x = Tensor::random([2, 9, 64], 6);
        assert_steps_match_causal_forward(name, config, &weights, &x, &[4, 1, 1, 3]);
    }
}

/// Persimmon's LayerNorm with a bias, one `[head_dim]` weight and bias shared by the heads:
/// every path and a KV cache's steps against the f64 reference; the bias changes the answer,
/// and a bias of the wrong length is refused.
#[test]
fn a_layer_norm_with_bias_matches_the_reference_on_every_path() {
    let config = config(QkNorm {
        kind: NormKind::Layer,
        eps: 1e-5,
        ..QkNorm::rms_per_head(0.0)
    });
    let mut weights = AttentionWeights::random(&config, 8);
    let w = weights.qk_norm.clone().unwrap();
    let bias = |seed| Tensor::random([16], seed).into_data();
    let biased = QkNormWeights {
        q_bias: bias(9),
        k_bias: bias(10),
        ..QkNormWeights::new(w.q[..16].to_vec(), w.k[..16].to_vec())
    };
    weights.qk_norm = Some(biased.clone());
    let mha = MultiHeadAttention::new(common::gpu(), config, &weights).expect("module");
    let (b, lk) = (2, 9);
    let kv = Tensor::random([b, lk, 64], 11);
    for lq in [9, 1] {
        let q = Tensor::random([b, lq, 64], 12 + lq as u64);
        for mask in [Mask::Causal, Mask::KeyPadding(vec![lk, lk - 3])] {
            let label = format!("biased Lq {lq} {}", mask.kind_name());
            assert_module_matches_on_both_paths(&label, &mha, &weights, &q, &kv, &mask);
        }
    }
    let x = Tensor::random([b, lk, 64], 13);
    assert_steps_match_causal_forward("biased", config, &weights, &x, &[4, 1, 4]);
    let unbiased = AttentionWeights {
        qk_norm: Some(QkNormWeights::new(biased.q.clone(), biased.k.clone())),
        ..weights.clone()
    };
    let with = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let without = reference::forward(&config, &unbiased, &x, &x, &x, &Mask::Causal).unwrap();
    assert!(common::max_err_f64(&with.output, &without.output) > 1e-2);
    weights.qk_norm.as_mut().unwrap().k_bias.truncate(15);
    let err = weights.check(&config).unwrap_err().to_string();
    assert!(err.contains("k_norm.bias"), "{err}");
}

#[test]
fn norm_weights_of_the_wrong_length_are_refused() {
    let config = config(QkNorm::rms_per_head(1e-6));
    let mut weights = AttentionWeights::random(&config, 1);
    weights.qk_norm.as_mut().unwrap().k.truncate(15);
    let err = weights.check(&config).unwrap_err().to_string();
    assert!(err.contains("k_norm.weight"), "{err}");
    weights.qk_norm = None;
    assert!(weights.check(&config).is_err());
}

#[test]
fn clip_qkv_clamps_the_projections_on_every_path() {
    // OLMo's clip_qkv at 0.3: the random projections reach ±1, so the clamp binds.
    let config = AttentionConfig::classic(64, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
        .with_clip_qkv(0.3)
        .unwrap();
    check_both_paths_over("clip", config, [2, 9], &[9, 1], (40, 41), |_| {
        vec![Mask::Causal]
    });
    let weights = AttentionWeights::random(&config, 6);
    let x = Tensor::random([2, 9, 64], 7);
    assert_steps_match_causal_forward("clip", config, &weights, &x, &[5, 1, 3]);
    assert_feature_binds("clip", config, [2, 9], |c, _| c.clip_qkv = None);
    assert!(AttentionConfig::classic(64, 4)
        .unwrap()
        .with_clip_qkv(0.0)
        .is_err());
}
