//! Shared test helpers: one GPU per test binary, and the comparisons every test uses.
#![allow(dead_code)]

use std::sync::OnceLock;

use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, ForwardOptions, Gpu, Mask, MultiHeadAttention,
    Tensor,
};

/// The test GPU (WGPU_BACKEND / WGPU_ADAPTER_NAME honoured). No adapter is a failure, never a
/// silent skip: the message says how to get a software Vulkan device.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new() {
        Ok(gpu) => gpu,
        Err(e) => panic!("GPU tests need an adapter: {e}"),
    })
}

/// The tolerance: max abs error ≤ 1e-5·(1 + max|ref|).
pub fn tolerance(reference: &[f64]) -> f64 {
    1e-5 * (1.0 + reference.iter().fold(0.0f64, |m, v| m.max(v.abs())))
}

/// max |got − want| (NaN if anything is NaN).
pub fn max_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, |m: f64, d| {
            if d.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(d)
            }
        })
}

/// Runs one problem on the GPU with `options` and checks output (and probabilities when
/// requested) against the f64 reference. Returns the output error.
pub fn check_against_reference(
    label: &str,
    config: AttentionConfig,
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    mask: &Mask,
    options: &ForwardOptions,
) -> f64 {
    let weights = AttentionWeights::random(&config, 42);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let got = mha
        .forward_with(query, key, value, mask, options)
        .unwrap_or_else(|e| panic!("{label}: forward failed: {e}"));
    let want = reference::forward(&config, &weights, query, key, value, mask).expect("reference");
    assert_eq!(
        got.output.shape(),
        want.shape.as_slice(),
        "{label}: output shape"
    );
    let err = max_err(got.output.data(), &want.output);
    let tol = tolerance(&want.output);
    assert!(
        err <= tol,
        "{label}: max error {err:.3e} > {tol:.3e} ({:?} path)",
        got.path
    );
    if let Some(probs) = &got.probs {
        let perr = max_err(probs.data(), &want.probs);
        assert!(perr <= 1e-5, "{label}: probability error {perr:.3e}");
    }
    err
}
