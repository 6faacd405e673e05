//! Both attention paths follow the reference (PyTorch's) semantics on non-finite values:
//! `0·NaN = NaN`, so a NaN value row poisons every query row even where the mask hides it
//! (and the fused path skips its tile); a row whose additive mask is all −inf is 0/0 = NaN.

mod common;

use common::{gpu, options, tolerance};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Mask, MultiHeadAttention, Tensor,
};

/// Runs `query`/`key`/`value` on both paths; each must be NaN exactly where the reference is
/// and within tolerance elsewhere. Returns the reference's NaN count.
fn check(label: &str, config: AttentionConfig, [q, k, v]: [&Tensor; 3], mask: &Mask) -> usize {
    let weights = AttentionWeights::random(&config, 9);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let want = reference::forward(&config, &weights, q, k, v, mask).expect("reference");
    let finite: Vec<f64> = want
        .output
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .collect();
    let tol = tolerance(&finite);
    for path in [AttentionPath::Fused, AttentionPath::MultiPass] {
        let got = mha
            .forward_with(q, k, v, mask, &options(path, false))
            .unwrap_or_else(|e| panic!("{label} {path:?}: {e}"));
        let got = got.output.data();
        let nan_got = got.iter().filter(|x| x.is_nan()).count();
        let nan_want = want.output.iter().filter(|x| x.is_nan()).count();
        for (e, (&g, &w)) in got.iter().zip(&want.output).enumerate() {
            assert_eq!(
                g.is_nan(),
                w.is_nan(),
                "{label} {path:?}: element {e} is {g}, the reference {w} \
                 ({nan_got} NaN vs {nan_want})"
            );
            if !w.is_nan() {
                assert!((g as f64 - w).abs() <= tol, "{label} {path:?}: element {e}");
            }
        }
    }
    want.output.iter().filter(|x| x.is_nan()).count()
}

#[test]
fn nan_in_a_value_row_the_causal_mask_hides_poisons_every_row() {
    // 300 queries: the first blocks of the fused path skip the tile of the last key.
    let config = AttentionConfig::classic(32, 4).expect("config");
    let x = Tensor::random([1, 300, 32], 1);
    let mut v = x.clone();
    v.data_mut()[299 * 32 + 7] = f32::NAN;
    let nan = check("causal", config, [&x, &x, &v], &Mask::Causal);
    assert_eq!(nan, 300 * 32, "the reference poisons every row");
}

#[test]
fn nan_in_a_padded_value_row_poisons_every_row() {
    let config = AttentionConfig::per_head(16, 8, 8, 2).expect("config");
    let x_q = Tensor::random([2, 5, 16], 2);
    let mut x_kv = Tensor::random([2, 5, 16], 3);
    // Batch 0: key 4 is padding (3 valid keys) and holds an infinity.
    x_kv.data_mut()[4 * 16] = f32::INFINITY;
    let nan = check(
        "key padding",
        config,
        [&x_q, &x_kv, &x_kv],
        &Mask::KeyPadding(vec![3, 5]),
    );
    assert_eq!(nan, 5 * 16, "batch 0 is NaN, batch 1 is not");
}

#[test]
fn a_bias_row_of_minus_infinity_is_nan_on_both_paths() {
    let config = AttentionConfig::classic(32, 4).expect("config");
    let x = Tensor::random([1, 6, 32], 4);
    let mut bias = Tensor::random([6, 6], 5);
    bias.data_mut()[2 * 6..3 * 6].fill(f32::NEG_INFINITY);
    let nan = check("bias", config, [&x, &x, &x], &Mask::Bias(bias));
    assert_eq!(nan, 32, "query 2 is NaN, the others are finite");
}
