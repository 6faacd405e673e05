//! Grouped-query and multi-query attention (`kv_heads` < `heads`): query head `h` reads
//! key/value head `h / (heads / kv_heads)`. Checked against an independent invariant — the same
//! module as multi-head attention with each key/value head's projection rows repeated for its
//! group (what transformers' `repeat_kv` does) — on both paths, in f16, with appended keys, and
//! decoding with a KV cache that stores only the key/value heads.

mod common;

use common::{assert_close, assert_within, gpu, options, relative_tolerance, BOTH_PATHS};
use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, KvCache, Linear, Mask, MultiHeadAttention,
    Precision, Tensor,
};

/// `layer` with the rows (and biases) of each of its `kv_heads` heads of `head_dim` repeated
/// for the `group` query heads that read it.
fn repeat_heads(layer: &Linear, kv_heads: usize, head_dim: usize, group: usize) -> Linear {
    let width = layer.in_features;
    let mut weight = Vec::new();
    let mut bias = layer.bias.as_ref().map(|_| Vec::new());
    for h in 0..kv_heads * group {
        let g = h / group;
        weight.extend_from_slice(&layer.weight[g * head_dim * width..(g + 1) * head_dim * width]);
        if let (Some(out), Some(b)) = (bias.as_mut(), layer.bias.as_ref()) {
            out.extend_from_slice(&b[g * head_dim..(g + 1) * head_dim]);
        }
    }
    Linear {
        out_features: kv_heads * group * head_dim,
        in_features: width,
        weight,
        bias,
    }
}

/// The multi-head module that computes what the grouped one does.
fn as_multi_head(c: &AttentionConfig, w: &AttentionWeights) -> (AttentionConfig, AttentionWeights) {
    let mha = c.with_kv_heads(c.heads).unwrap();
    let g = c.kv_group();
    let weights = AttentionWeights {
        k: repeat_heads(&w.k, c.kv_heads, c.qk_head_dim, g),
        v: repeat_heads(&w.v, c.kv_heads, c.v_head_dim, g),
        bias_kv: w.bias_kv.as_ref().map(|b| wgpu_mha::BiasKv {
            k: repeat_rows(&b.k, c.kv_heads, c.qk_head_dim, g),
            v: repeat_rows(&b.v, c.kv_heads, c.v_head_dim, g),
        }),
        ..w.clone()
    };
    (mha, weights)
}

fn repeat_rows(values: &[f32], kv_heads: usize, head_dim: usize, group: usize) -> Vec<f32> {
    (0..kv_heads * group)
        .flat_map(|h| values[(h / group) * head_dim..][..head_dim].iter().copied())
        .collect()
}

fn configs() -> Vec<AttentionConfig> {
    let per_head = |h: usize, kv: usize| {
        AttentionConfig::per_head(24, 6, 10, h)
            .unwrap()
            .with_kv_heads(kv)
            .unwrap()
    };
    vec![
        // GQA with an output projection, MQA, GQA of groups of 3, and plain MHA.
        AttentionConfig::classic(32, 4)
            .unwrap()
            .with_kv_heads(2)
            .unwrap(),
        per_head(4, 1),
        per_head(6, 2),
        per_head(3, 3),
    ]
}

#[test]
fn grouped_queries_equal_multi_head_attention_with_repeated_key_value_heads() {
    for config in configs() {
        let weights = AttentionWeights::random(&config, 1);
        let (mha_config, mha_weights) = as_multi_head(&config, &weights);
        let module = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
        let e = config.model_dim;
        let (q, kv) = (Tensor::random([2, 5, e], 2), Tensor::random([2, 7, e], 3));
        for mask in [Mask::Causal, Mask::KeyPadding(vec![7, 3])] {
            let want = reference::forward(&mha_config, &mha_weights, &q, &kv, &kv, &mask).unwrap();
            // The reference's own grouping agrees with the repeated heads.
            let grouped = reference::forward(&config, &weights, &q, &kv, &kv, &mask).unwrap();
            assert_eq!(grouped.output, want.output, "{config:?}");
            for path in BOTH_PATHS {
                let multi_pass = path == wgpu_mha::AttentionPath::MultiPass;
                let got = module
                    .forward_with(&q, &kv, &kv, &mask, &options(path, multi_pass))
                    .unwrap();
                let label = format!("H {} H_kv {} {path:?}", config.heads, config.kv_heads);
                assert_close(&label, got.output.data(), &want.output);
                if let Some(p) = got.probs {
                    assert_within(&label, p.data(), &want.probs, 1e-5);
                }
            }
        }
    }
}

#[test]
fn grouped_queries_in_f16_and_with_appended_keys() {
    let config = AttentionConfig::classic(32, 4)
        .unwrap()
        .with_kv_heads(1)
        .unwrap();
    let x = Tensor::random([2, 6, 32], 4);
    if gpu().has_f16() {
        let weights = AttentionWeights::random(&config, 5);
        let (mc, mw) = as_multi_head(&config, &weights);
        let want = reference::forward(&mc, &mw, &x, &x, &x, &Mask::Causal).unwrap();
        let module =
            MultiHeadAttention::with_precision(gpu(), config, &weights, Precision::F16).unwrap();
        let got = module.forward(&x, &x, &x, &Mask::Causal).unwrap();
        assert_within(
            "f16",
            got.data(),
            &want.output,
            relative_tolerance(5e-3, &want.output),
        );
    }
    let appended = config.with_appended_keys(true, true);
    let weights = AttentionWeights::random(&appended, 6);
    let (mc, mw) = as_multi_head(&appended, &weights);
    let want = reference::forward(&mc, &mw, &x, &x, &x, &Mask::Causal).unwrap();
    let module = MultiHeadAttention::new(gpu(), appended, &weights).unwrap();
    for path in BOTH_PATHS {
        let got = module
            .forward_with(&x, &x, &x, &Mask::Causal, &options(path, false))
            .unwrap();
        assert_close(
            &format!("appended {path:?}"),
            got.output.data(),
            &want.output,
        );
    }
}

#[test]
fn a_kv_cache_of_key_value_heads_decodes_like_the_full_forward() {
    for config in configs() {
        let weights = AttentionWeights::random(&config, 7);
        let module = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
        let x = Tensor::random([2, 6, config.model_dim], 8);
        let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
        let w = config.output_dim();
        for path in BOTH_PATHS {
            let mut cache = KvCache::with_path(&module, 2, 6, path).unwrap();
            for (pos, n) in [(0, 3), (3, 1), (4, 1), (5, 1)] {
                let rows: Vec<f32> = (0..2)
                    .flat_map(|b| {
                        x.data()[(b * 6 + pos) * config.model_dim..][..n * config.model_dim]
                            .to_vec()
                    })
                    .collect();
                let step = module
                    .forward_step(
                        &mut cache,
                        &Tensor::new([2, n, config.model_dim], rows).unwrap(),
                    )
                    .unwrap();
                let r: Vec<f64> = (0..2)
                    .flat_map(|b| want.output[(b * 6 + pos) * w..][..n * w].to_vec())
                    .collect();
                assert_close(
                    &format!(
                        "H {} H_kv {} {path:?} at {pos}",
                        config.heads, config.kv_heads
                    ),
                    step.data(),
                    &r,
                );
            }
        }
    }
}

#[test]
fn key_value_heads_must_divide_the_query_heads() {
    let c = AttentionConfig::classic(32, 4).unwrap();
    for bad in [0, 3, 8] {
        assert!(c.with_kv_heads(bad).is_err(), "kv_heads {bad}");
    }
    // Weights shaped for multi-head attention do not fit a grouped config.
    let mha_weights = AttentionWeights::random(&c, 9);
    let err = MultiHeadAttention::new(gpu(), c.with_kv_heads(2).unwrap(), &mha_weights)
        .err()
        .expect("W_k has the rows of 4 heads, not 2");
    assert!(err.to_string().contains("W_k"), "{err}");
}
