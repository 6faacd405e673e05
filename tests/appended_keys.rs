//! `nn.MultiheadAttention(add_bias_kv=True, add_zero_attn=True)`: the keys a module appends
//! after the input's, seen by every query whatever the mask, on every path and precision —
//! checked against the f64 reference (which appends them on its own, independently of the
//! workspace that writes them into the K/V buffers). PyTorch's own answers for these options
//! are checked by `tests/torch_conventions.rs`.

mod common;

use common::{
    assert_close, assert_module_matches_on_both_paths, check_against_reference, check_both_paths,
    gpu, module, options, BOTH_PATHS,
};
use wgpu_mha::{
    reference, AttentionConfig, Error, GpuTensor, KvCache, Mask, MultiHeadAttention, Precision,
    Tensor,
};

fn classic(bias_kv: bool, zero_attn: bool) -> AttentionConfig {
    AttentionConfig::classic(24, 3)
        .unwrap()
        .with_appended_keys(bias_kv, zero_attn)
}

/// Masks over `lk` input keys for a batch of 2 and `lq` queries.
fn masks(lq: usize, lk: usize) -> Vec<Mask> {
    let bits = common::bits(2 * lq * lk, 7);
    let bias: Vec<f32> = (0..lq * lk).map(|i| (i % 5) as f32 * -0.5).collect();
    vec![
        Mask::None,
        Mask::Causal,
        // Batch 1 has no key of its own: only the appended ones remain.
        Mask::KeyPadding(vec![lk, 0]),
        Mask::block([2, 1, lq, lk], &bits).unwrap(),
        Mask::Bias(Tensor::new([lq, lk], bias).unwrap()),
    ]
}

#[test]
fn appended_keys_match_the_reference_on_both_paths() {
    for (bias_kv, zero_attn) in [(true, false), (false, true), (true, true)] {
        let config = classic(bias_kv, zero_attn);
        for (lq, lk) in [(4, 4), (3, 6), (5, 1)] {
            let q = Tensor::random([2, lq, 24], 1);
            let kv = Tensor::random([2, lk, 24], 2);
            for mask in masks(lq, lk) {
                check_both_paths(
                    &format!(
                        "bias_kv {bias_kv} zero_attn {zero_attn} Lq {lq} Lk {lk} {}",
                        mask.kind_name()
                    ),
                    config,
                    &q,
                    &kv,
                    &mask,
                );
            }
            // Self-attention (one input buffer): the appended rows follow the projected ones.
            if lq == lk {
                check_against_reference(
                    "self-attention",
                    config,
                    &q,
                    &q,
                    &q,
                    &Mask::Causal,
                    &options(wgpu_mha::AttentionPath::Auto, false),
                );
            }
        }
    }
}

#[test]
fn with_no_input_keys_only_the_appended_ones_are_attended() {
    // PyTorch attends to bias_k and the zero key even when the key sequence is empty.
    let config = classic(true, true);
    let q = Tensor::random([2, 3, 24], 3);
    let empty = Tensor::zeros([2, 0, 24]);
    for path in BOTH_PATHS {
        let err = check_against_reference(
            "no input keys",
            config,
            &q,
            &empty,
            &empty,
            &Mask::None,
            &options(path, path == wgpu_mha::AttentionPath::MultiPass),
        );
        assert!(err.is_finite());
    }
}

#[test]
fn per_head_modules_and_device_tensors_append_too() {
    let config = AttentionConfig::per_head(16, 6, 10, 2)
        .unwrap()
        .with_appended_keys(true, true);
    let (weights, mha) = module(config, 5);
    let (q, kv) = (Tensor::random([2, 3, 16], 6), Tensor::random([2, 5, 16], 7));
    let want = reference::forward(&config, &weights, &q, &kv, &kv, &Mask::Causal).unwrap();
    let (gq, gkv) = (
        GpuTensor::upload(gpu(), &q).unwrap(),
        GpuTensor::upload(gpu(), &kv).unwrap(),
    );
    let got = mha
        .forward_cross_gpu(&gq, &gkv, &Mask::Causal)
        .unwrap()
        .read(gpu())
        .unwrap();
    assert_close("forward_cross_gpu", got.data(), &want.output);
    // The workspace is reused: a second call with other inputs must not see stale rows.
    let kv2 = Tensor::random([2, 5, 16], 8);
    let want2 = reference::forward(&config, &weights, &q, &kv2, &kv2, &Mask::Causal).unwrap();
    let got2 = mha.forward_cross(&q, &kv2, &Mask::Causal).unwrap();
    assert_close("second call", got2.data(), &want2.output);
}

#[test]
fn f16_modules_append_keys_in_f16() {
    if !gpu().has_f16() {
        eprintln!(
            "no SHADER_F16 on {}: the f16 case is not run",
            gpu().describe()
        );
        return;
    }
    let config = classic(true, true);
    let weights = wgpu_mha::AttentionWeights::random(&config, 9);
    let mha = MultiHeadAttention::with_precision(gpu(), config, &weights, Precision::F16).unwrap();
    let (q, kv) = (
        Tensor::random([2, 4, 24], 10),
        Tensor::random([2, 6, 24], 11),
    );
    let mask = Mask::KeyPadding(vec![6, 0]);
    let want = reference::forward(&config, &weights, &q, &kv, &kv, &mask).unwrap();
    let got = mha.forward(&q, &kv, &kv, &mask).unwrap();
    // f16 storage of Q/K/V: a few parts in a thousand.
    common::assert_within(
        "f16",
        got.data(),
        &want.output,
        common::relative_tolerance(5e-3, &want.output),
    );
}

#[test]
fn more_batches_than_one_dispatch_holds_are_split_and_keep_the_appended_keys() {
    // 8,200 × 8 (batch, head) pairs > 65,535 workgroups along z: split over batches, and every
    // chunk's workspace holds the appended rows for its own batches.
    let (b, h) = (8200, 8);
    let config = AttentionConfig::classic(16, h)
        .unwrap()
        .with_appended_keys(true, true);
    let (weights, mha) = module(config, 12);
    let q = Tensor::random([b, 2, 16], 13);
    let kv = Tensor::random([b, 3, 16], 14);
    let mask = Mask::KeyPadding((0..b).map(|i| i % 4).collect());
    assert_module_matches_on_both_paths("appended keys", &mha, &weights, &q, &kv, &mask);
}

#[test]
fn a_kv_cache_refuses_modules_with_appended_keys() {
    let (_, mha) = module(classic(true, false), 15);
    match KvCache::new(&mha, 1, 8) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("add_bias_kv"), "{what}"),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a cache over appended keys must be refused"),
    }
}

#[test]
fn weights_and_config_must_agree_on_bias_kv() {
    let with = classic(true, false);
    let weights = wgpu_mha::AttentionWeights::random(&with, 16);
    let without = classic(false, false);
    let err = MultiHeadAttention::new(gpu(), without, &weights)
        .err()
        .expect("bias_k without add_bias_kv");
    assert!(err.to_string().contains("bias_k"), "{err}");
    let mut short = weights.clone();
    if let Some(b) = short.bias_kv.as_mut() {
        b.v.pop();
    }
    let err = MultiHeadAttention::new(gpu(), with, &short)
        .err()
        .expect("short bias_v");
    assert!(err.to_string().contains("bias_v"), "{err}");
}
