//! Bad input returns a typed `Err` naming the problem, and nothing reaches the GPU
//! (no workspace is allocated, no pass is dispatched).

mod common;

use wgpu_mha::{
    AttentionConfig, AttentionPath, AttentionWeights, Error, ForwardOptions, Mask, MaskTensor,
    MultiHeadAttention, Tensor,
};

fn classic_module() -> (AttentionConfig, MultiHeadAttention) {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let weights = AttentionWeights::random(&config, 1);
    (
        config,
        MultiHeadAttention::new(common::gpu(), config, &weights).unwrap(),
    )
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

#[test]
fn query_of_wrong_width() {
    let (_, mha) = classic_module();
    let q = Tensor::random([2, 5, 31], 1);
    let kv = Tensor::random([2, 5, 32], 2);
    let err = forward_err(&mha, &q, &kv, &kv, &Mask::None);
    assert!(
        matches!(&err, Error::Shape { what, .. } if what == "query"),
        "{err}"
    );
    assert!(
        err.to_string().contains("31"),
        "message names the width: {err}"
    );
}

#[test]
fn key_of_wrong_rank() {
    let (_, mha) = classic_module();
    let q = Tensor::random([2, 5, 32], 1);
    let k = Tensor::random([10, 32], 2);
    let v = Tensor::random([2, 5, 32], 3);
    let err = forward_err(&mha, &q, &k, &v, &Mask::None);
    assert!(
        matches!(&err, Error::Shape { what, .. } if what == "key"),
        "{err}"
    );
}

#[test]
fn key_and_value_lengths_differ() {
    let (_, mha) = classic_module();
    let q = Tensor::random([2, 5, 32], 1);
    let k = Tensor::random([2, 6, 32], 2);
    let v = Tensor::random([2, 7, 32], 3);
    let err = forward_err(&mha, &q, &k, &v, &Mask::None);
    assert!(
        matches!(&err, Error::Shape { what, .. } if what == "value"),
        "{err}"
    );
}

#[test]
fn batch_mismatch_between_query_and_key() {
    let (_, mha) = classic_module();
    let q = Tensor::random([2, 5, 32], 1);
    let kv = Tensor::random([3, 5, 32], 2);
    let err = forward_err(&mha, &q, &kv, &kv, &Mask::None);
    assert!(
        matches!(&err, Error::Shape { what, .. } if what == "key"),
        "{err}"
    );
}

#[test]
fn mask_not_broadcastable() {
    let (_, mha) = classic_module();
    let x = Tensor::random([2, 5, 32], 1);
    let mask = Mask::Attend(MaskTensor::new([2, 1, 5, 4], vec![1; 40]).unwrap());
    let err = forward_err(&mha, &x, &x, &x, &mask);
    assert!(matches!(err, Error::Mask(_)), "{err}");
    assert!(
        err.to_string().contains("Lk"),
        "message names the dimension: {err}"
    );
}

#[test]
fn mask_of_rank_five() {
    let (_, mha) = classic_module();
    let x = Tensor::random([2, 5, 32], 1);
    let mask = Mask::Block(MaskTensor::new([1, 2, 1, 5, 5], vec![0; 50]).unwrap());
    assert!(matches!(
        forward_err(&mha, &x, &x, &x, &mask),
        Error::Mask(_)
    ));
}

#[test]
fn key_padding_lengths_wrong() {
    let (_, mha) = classic_module();
    let x = Tensor::random([2, 5, 32], 1);
    assert!(matches!(
        forward_err(&mha, &x, &x, &x, &Mask::KeyPadding(vec![5])),
        Error::Mask(_)
    ));
    assert!(matches!(
        forward_err(&mha, &x, &x, &x, &Mask::KeyPadding(vec![5, 6])),
        Error::Mask(_)
    ));
}

#[test]
fn bias_mask_wrong_shape() {
    let (_, mha) = classic_module();
    let x = Tensor::random([2, 5, 32], 1);
    let mask = Mask::Bias(Tensor::random([3, 5, 5], 2));
    assert!(matches!(
        forward_err(&mha, &x, &x, &x, &mask),
        Error::Mask(_)
    ));
}

#[test]
fn mask_data_length_mismatch() {
    let err = MaskTensor::new([2, 3], vec![1; 5]).expect_err("length must match shape");
    assert!(
        matches!(
            err,
            Error::DataLength {
                expected: 6,
                got: 5,
                ..
            }
        ),
        "{err}"
    );
    let err = Tensor::new([2, 3], vec![0.0; 7]).expect_err("length must match shape");
    assert!(
        matches!(
            err,
            Error::DataLength {
                expected: 6,
                got: 7,
                ..
            }
        ),
        "{err}"
    );
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
    assert!(matches!(
        AttentionConfig::classic(32, 0),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        AttentionConfig::per_head(16, 8, 8, 0),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        AttentionConfig::per_head(16, 0, 8, 2),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        AttentionConfig::per_head(0, 8, 8, 2),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        AttentionConfig::classic(0, 1),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        AttentionConfig::classic(32, 4)
            .unwrap()
            .with_scale(f32::NAN),
        Err(Error::Config(_))
    ));
}

#[test]
fn weight_of_the_wrong_shape() {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let mut weights = AttentionWeights::random(&config, 1);
    weights.k = AttentionWeights::random(&AttentionConfig::classic(16, 4).unwrap(), 1).k;
    let err = MultiHeadAttention::new(common::gpu(), config, &weights)
        .err()
        .expect("mis-shaped W_k");
    assert!(
        matches!(&err, Error::Weight { name, .. } if name == "W_k.weight"),
        "{err}"
    );
}

#[test]
fn missing_bias_and_missing_output_projection() {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let mut weights = AttentionWeights::random(&config, 1);
    weights.v.bias = None;
    let err = MultiHeadAttention::new(common::gpu(), config, &weights)
        .err()
        .expect("missing bias");
    assert!(
        matches!(&err, Error::Weight { name, .. } if name == "W_v.bias"),
        "{err}"
    );
    let mut weights = AttentionWeights::random(&config, 1);
    weights.o = None;
    let err = MultiHeadAttention::new(common::gpu(), config, &weights)
        .err()
        .expect("missing W_o");
    assert!(
        matches!(&err, Error::Weight { name, .. } if name == "W_o.weight"),
        "{err}"
    );
}

#[test]
fn per_head_weights_for_a_different_config() {
    let config = AttentionConfig::per_head(24, 8, 12, 3).unwrap();
    let other = AttentionConfig::per_head(24, 8, 10, 3).unwrap();
    let weights = AttentionWeights::random(&other, 1);
    let err = MultiHeadAttention::new(common::gpu(), config, &weights)
        .err()
        .expect("w_v is 30 rows, not 36");
    assert!(
        matches!(&err, Error::Weight { name, .. } if name == "w_v.weight"),
        "{err}"
    );
}

#[test]
fn fused_path_cannot_return_probabilities() {
    let (_, mha) = classic_module();
    let x = Tensor::random([1, 4, 32], 1);
    let options = ForwardOptions {
        return_probs: true,
        path: AttentionPath::Fused,
    };
    let err = mha
        .forward_with(&x, &x, &x, &Mask::None, &options)
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
    assert!(common::max_err(got.data(), &want.output) <= common::tolerance(&want.output));
}
