//! Bad input returns a typed `Err` naming the problem, and nothing reaches the GPU
//! (no workspace is allocated, no pass is dispatched).

mod common;

use wgpu_mha::{
    AttentionConfig, AttentionPath, AttentionWeights, Error, Mask, MaskTensor, MultiHeadAttention,
    Tensor,
};

fn classic_module() -> (AttentionConfig, MultiHeadAttention) {
    let config = AttentionConfig::classic(32, 4).unwrap();
    (config, common::module(config, 1).1)
}

/// Runs a forward that must fail, checks nothing was allocated, returns the error.
fn forward_err(mha: &MultiHeadAttention, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask) -> Error {
    let before = mha.workspace_bytes();
    let err = mha
        .forward(q, k, v, mask)
        .expect_err("bad input must be rejected");
    assert_eq!(
        mha.workspace_bytes(),
        before,
        "a rejected call allocated GPU buffers: {err}"
    );
    err
}

/// Q, K, V of the given shapes on the classic d_model 32 module: an `Error::Shape` naming
/// `what` ("query", "key" or "value"). Returns the error.
fn shape_err(q: &[usize], k: &[usize], v: &[usize], what: &str) -> Error {
    let (_, mha) = classic_module();
    let t = |shape: &[usize], seed| Tensor::random(shape.to_vec(), seed);
    let err = forward_err(&mha, &t(q, 1), &t(k, 2), &t(v, 3), &Mask::None);
    assert!(
        matches!(&err, Error::Shape { what: w, .. } if w == what),
        "expected a shape error for {what}: {err}"
    );
    err
}

/// `mask` on a [2, 5, 32] self-attention problem: an `Error::Mask`. Returns the error.
fn mask_err(mask: Mask) -> Error {
    let (_, mha) = classic_module();
    let x = Tensor::random([2, 5, 32], 1);
    let err = forward_err(&mha, &x, &x, &x, &mask);
    assert!(matches!(err, Error::Mask(_)), "{err}");
    err
}

#[test]
fn query_of_wrong_width() {
    let err = shape_err(&[2, 5, 31], &[2, 5, 32], &[2, 5, 32], "query");
    assert!(
        err.to_string().contains("31"),
        "message names the width: {err}"
    );
}

#[test]
fn key_of_wrong_rank() {
    shape_err(&[2, 5, 32], &[10, 32], &[2, 5, 32], "key");
}

#[test]
fn key_and_value_lengths_differ() {
    shape_err(&[2, 5, 32], &[2, 6, 32], &[2, 7, 32], "value");
}

#[test]
fn batch_mismatch_between_query_and_key() {
    shape_err(&[2, 5, 32], &[3, 5, 32], &[3, 5, 32], "key");
}

#[test]
fn mask_not_broadcastable() {
    let err = mask_err(Mask::Attend(
        MaskTensor::new([2, 1, 5, 4], vec![1; 40]).unwrap(),
    ));
    assert!(
        err.to_string().contains("Lk"),
        "message names the dimension: {err}"
    );
}

#[test]
fn mask_of_rank_five() {
    mask_err(Mask::Block(
        MaskTensor::new([1, 2, 1, 5, 5], vec![0; 50]).unwrap(),
    ));
}

#[test]
fn key_padding_lengths_wrong() {
    mask_err(Mask::KeyPadding(vec![5]));
    mask_err(Mask::KeyPadding(vec![5, 6]));
}

#[test]
fn bias_mask_wrong_shape() {
    mask_err(Mask::Bias(Tensor::random([3, 5, 5], 2)));
}

/// `result` is an `Error::DataLength` saying `expected` values were expected and `got` given.
fn assert_data_length<T: std::fmt::Debug>(
    result: wgpu_mha::Result<T>,
    expected: usize,
    got: usize,
) {
    let err = result.expect_err("length must match shape");
    assert!(
        matches!(err, Error::DataLength { expected: e, got: g, .. } if (e, g) == (expected, got)),
        "{err}"
    );
}

#[test]
fn mask_data_length_mismatch() {
    assert_data_length(MaskTensor::new([2, 3], vec![1; 5]), 6, 5);
    assert_data_length(Tensor::new([2, 3], vec![0.0; 7]), 6, 7);
}

#[test]
fn d_model_not_divisible_by_heads() {
    let err = AttentionConfig::classic(30, 4).expect_err("30 % 4 != 0");
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(
        err.to_string().contains("30") && err.to_string().contains('4'),
        "{err}"
    );
}

#[test]
fn zero_heads_and_zero_sizes() {
    for (label, config) in [
        ("classic 0 heads", AttentionConfig::classic(32, 0)),
        ("per-head 0 heads", AttentionConfig::per_head(16, 8, 8, 0)),
        (
            "per-head q_k_size 0",
            AttentionConfig::per_head(16, 0, 8, 2),
        ),
        ("per-head emb_size 0", AttentionConfig::per_head(0, 8, 8, 2)),
        ("classic d_model 0", AttentionConfig::classic(0, 1)),
        (
            "NaN scale",
            AttentionConfig::classic(32, 4)
                .unwrap()
                .with_scale(f32::NAN),
        ),
    ] {
        assert!(
            matches!(config, Err(Error::Config(_))),
            "{label}: {config:?}"
        );
    }
}

/// Building a module of `config` from `weights` fails with an `Error::Weight` naming `tensor`.
fn assert_weight_refused(config: AttentionConfig, weights: &AttentionWeights, tensor: &str) {
    let err = MultiHeadAttention::new(common::gpu(), config, weights)
        .err()
        .unwrap_or_else(|| panic!("weights with a bad {tensor} were accepted"));
    assert!(
        matches!(&err, Error::Weight { name, .. } if name == tensor),
        "expected a weight error for {tensor}: {err}"
    );
}

#[test]
fn weight_of_the_wrong_shape() {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let mut weights = AttentionWeights::random(&config, 1);
    weights.k = AttentionWeights::random(&AttentionConfig::classic(16, 4).unwrap(), 1).k;
    assert_weight_refused(config, &weights, "W_k.weight");
}

#[test]
fn missing_bias_and_missing_output_projection() {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let mut weights = AttentionWeights::random(&config, 1);
    weights.v.bias = None;
    assert_weight_refused(config, &weights, "W_v.bias");
    let mut weights = AttentionWeights::random(&config, 1);
    weights.o = None;
    assert_weight_refused(config, &weights, "W_o.weight");
}

#[test]
fn per_head_weights_for_a_different_config() {
    // w_v is 30 rows, not 36.
    let config = AttentionConfig::per_head(24, 8, 12, 3).unwrap();
    let other = AttentionConfig::per_head(24, 8, 10, 3).unwrap();
    assert_weight_refused(config, &AttentionWeights::random(&other, 1), "w_v.weight");
}

#[test]
fn fused_path_cannot_return_probabilities() {
    let (_, mha) = classic_module();
    let x = Tensor::random([1, 4, 32], 1);
    let err = mha
        .forward_with(
            &x,
            &x,
            &x,
            &Mask::None,
            &common::options(AttentionPath::Fused, true),
        )
        .expect_err("contradictory options");
    assert!(matches!(err, Error::Misuse(_)), "{err}");
    assert_eq!(mha.workspace_bytes(), 0);
}

#[test]
fn the_module_still_works_after_rejections() {
    let (config, mha) = classic_module();
    let bad = Tensor::random([2, 5, 31], 1);
    let x = Tensor::random([2, 5, 32], 2);
    assert!(mha.forward(&bad, &x, &x, &Mask::None).is_err());
    let weights = AttentionWeights::random(&config, 1);
    let got = mha.forward(&x, &x, &x, &Mask::Causal).unwrap();
    let want = wgpu_mha::reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    common::assert_close("after rejections", got.data(), &want.output);
}
