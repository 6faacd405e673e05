//! Attention sinks (gpt-oss): a learned logit per query head that joins the softmax's
//! denominator only — on the fused path (prefill, a key range split over dispatches, and
//! decode), the multi-pass path (its probabilities then sum to less than 1) and a KV cache's
//! steps, each against the f64 reference; and a row whose keys are all masked gives 0, not
//! NaN, as transformers' sink column makes it.

mod common;

use common::{
    assert_feature_binds, assert_module_matches_on_both_paths, assert_steps_match_causal_forward,
    check_against_reference, check_both_paths_over, options,
};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Mask, MultiHeadAttention, Tensor,
};

/// GQA, 4 query heads of 16 over 2 key/value heads, with sinks.
fn config() -> AttentionConfig {
    AttentionConfig::classic(64, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
        .with_sinks()
        .unwrap()
}

#[test]
fn sinks_match_the_reference_on_every_path_and_mask() {
    let config = config();
    let (b, lk) = (2, 11);
    check_both_paths_over("sinks", config, [b, lk], &[11, 1, 3], (20, 30), |lq| {
        let bits = common::bits(b * lq * lk, 5);
        vec![
            Mask::Causal,
            Mask::SlidingWindow(4),
            Mask::KeyPadding(vec![lk, lk - 3]),
            Mask::block([b, 1, lq, lk], &bits).unwrap(),
        ]
    });
    // The sinks change the answer: without them the reference differs.
    let with = assert_feature_binds("sinks", config, [b, lk], |c, w| {
        c.sinks = false;
        w.sinks = None;
    });
    // The probabilities leave the sink's share out.
    let row: f64 = with.probs[..lk].iter().sum();
    assert!(row < 1.0 - 1e-3, "{row}");
}

#[test]
fn a_kv_cache_decodes_with_sinks_like_the_full_forward() {
    let config = config();
    let weights = AttentionWeights::random(&config, 5);
    let x = Tensor::random([2, 9, 64], 6);
    assert_steps_match_causal_forward("sinks", config, &weights, &x, &[4, 1, 1, 3]);
}

#[test]
fn a_row_with_every_key_masked_by_minus_infinity_is_zero_with_a_sink() {
    // An additive -inf mask over every key: without a sink 0/0 = NaN (PyTorch's answer); with
    // one the sink takes the whole weight and the attention output is 0.
    let config = config();
    let weights = AttentionWeights::random(&config, 8);
    let mha = MultiHeadAttention::new(common::gpu(), config, &weights).unwrap();
    let x = Tensor::random([1, 3, 64], 9);
    let bias = Mask::Bias(Tensor::new([1, 1, 3, 3], vec![f32::NEG_INFINITY; 9]).unwrap());
    let want = reference::forward(&config, &weights, &x, &x, &x, &bias).unwrap();
    assert!(want.output.iter().all(|v| v.is_finite()));
    assert_module_matches_on_both_paths("all keys masked", &mha, &weights, &x, &x, &bias);
}

#[test]
fn a_key_range_split_over_dispatches_carries_the_sink_once() {
    // 4000 keys: on a CPU adapter the fused pass splits them into key ranges (about 3,400
    // keys a dispatch at d16); the sink enters the first range's state only.
    let config = AttentionConfig::classic(32, 2)
        .unwrap()
        .with_sinks()
        .unwrap();
    let q = Tensor::random([1, 9, 32], 1);
    let kv = Tensor::random([1, 4000, 32], 2);
    let fused = options(AttentionPath::Fused, false);
    check_against_reference("4000 keys", config, &q, &kv, &kv, &Mask::None, &fused);
}
