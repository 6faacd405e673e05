//! Mesa's llvmpipe (lavapipe, GL) silently stops a shader invocation's loops after 65,535
//! iterations in total. Every kernel whose loops grow with a problem size bounds them there:
//! the GEMM K, the `scores` head dimension and the `av_combine` keys are split over dispatches
//! that add to each other's partial sums; the vec4 GEMMs and the softmax refuse what they
//! cannot walk. At the first sizes past each cap the answer is right or a clean error, on
//! every adapter.

mod common;

use common::{assert_close, gpu, options};
use wgpu_mha::kernels::linear::{LinearVariant, SOFTWARE_VEC4_K};
use wgpu_mha::kernels::softmax::SOFTWARE_MAX_COLS;
use wgpu_mha::kernels::standalone::{self, LinearKernel};
use wgpu_mha::kernels::{is_software, SOFTWARE_GEMM_DEPTH};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Error, Mask, MultiHeadAttention,
    Tensor,
};

/// Cross-attention of `config` at (Lq, Lk) on `path`, checked against the f64 reference
/// (output, and probabilities when asked for).
fn check(label: &str, config: AttentionConfig, (lq, lk): (usize, usize), path: AttentionPath) {
    let weights = AttentionWeights::random(&config, 3);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let x_q = Tensor::random([1, lq, config.model_dim], 4);
    let x_kv = Tensor::random([1, lk, config.key_dim], 5);
    let probs = path == AttentionPath::MultiPass;
    let out = mha
        .forward_with(&x_q, &x_kv, &x_kv, &Mask::None, &options(path, probs))
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let want =
        reference::forward(&config, &weights, &x_q, &x_kv, &x_kv, &Mask::None).expect("reference");
    assert_close(label, out.output.data(), &want.output);
    if let Some(p) = out.probs {
        assert_close(&format!("{label} probabilities"), p.data(), &want.probs);
    }
}

#[test]
fn projections_past_the_gemm_depth_cap() {
    // One key of model width K: the Q/K/V projections' K is the width.
    // K % 4 != 0 runs the scalar GEMM: just past one dispatch, and past llvmpipe's own cap
    // (wrong before the split); then vec4-eligible but too deep for its one loop (wrong from
    // K = 262,144 before).
    let depth = SOFTWARE_GEMM_DEPTH as usize;
    for k in [depth + 3, 4 * depth + 3, 4 * SOFTWARE_VEC4_K as usize] {
        let config = AttentionConfig::per_head(k, 2, 3, 1).expect("config");
        check(&format!("K = {k}"), config, (2, 3), AttentionPath::Auto);
    }
}

#[test]
fn vec4_gemms_refuse_a_k_too_deep_for_one_dispatch() {
    let k = SOFTWARE_VEC4_K as usize + 4;
    let (x, w) = (vec![0.5f32; 2 * k], vec![0.25f32; 3 * k]);
    let got = standalone::linear(
        gpu(),
        (&x, &w, None),
        (2, 3, k),
        LinearKernel::Variant(LinearVariant::Vec4),
    );
    match (is_software(gpu()), got) {
        (true, Err(Error::Unsupported { what, .. })) => assert!(what.contains("65,535"), "{what}"),
        (false, Ok(y)) => assert!(y.iter().all(|&v| (v - 0.125 * k as f32).abs() < 1e-2)),
        (_, other) => panic!("{:?}", other.map(|y| y.len())),
    }
    // The pick never runs it: the scalar GEMM splits K instead.
    let y = standalone::linear(gpu(), (&x, &w, None), (2, 3, k), LinearKernel::Auto).unwrap();
    assert!(
        y.iter().all(|&v| (v - 0.125 * k as f32).abs() < 1e-2),
        "{:?}",
        &y[..3]
    );
}

#[test]
fn scores_past_the_head_dim_cap() {
    // q/k heads too wide for the fused tile: the multi-pass core, whose scores walk dk.
    let dk = 4 * SOFTWARE_GEMM_DEPTH as usize + 5;
    let config = AttentionConfig::per_head(2, dk, 3, 1).expect("config");
    check(&format!("dk = {dk}"), config, (3, 4), AttentionPath::Auto);
}

#[test]
fn probabilities_times_values_past_the_key_cap() {
    // av_combine's depth is Lk; the fused path splits its own key ranges.
    let lk = 4 * SOFTWARE_GEMM_DEPTH as usize + 7;
    let config = AttentionConfig::per_head(4, 4, 8, 1).expect("config");
    for path in [AttentionPath::MultiPass, AttentionPath::Fused] {
        check(&format!("Lk = {lk} {path:?}"), config, (3, lk), path);
    }
}

#[test]
fn softmax_rows_past_the_cap_are_refused_on_software() {
    let config = AttentionConfig::per_head(2, 2, 2, 1).expect("config");
    let weights = AttentionWeights::random(&config, 3);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let lk = SOFTWARE_MAX_COLS + 1;
    let x_q = Tensor::random([1, 1, 2], 4);
    let x_kv = Tensor::random([1, lk, 2], 5);
    let probs = options(AttentionPath::Auto, true);
    match (
        is_software(gpu()),
        mha.forward_with(&x_q, &x_kv, &x_kv, &Mask::None, &probs),
    ) {
        (true, Err(Error::Unsupported { what, .. })) => assert!(what.contains("softmax"), "{what}"),
        (false, Ok(out)) => assert_eq!(out.output.shape(), &[1, 1, 2]),
        (_, other) => panic!("{:?}", other.map(|o| o.path)),
    }
    // Without probabilities the fused path takes the same keys.
    check(
        &format!("Lk = {lk} fused"),
        config,
        (1, lk),
        AttentionPath::Auto,
    );
}
