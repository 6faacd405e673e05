//! Defined behaviour for edge inputs, following what the seeds' PyTorch code does:
//! * batch 0 or Lq = 0 → an empty output of the right shape;
//! * Lk = 0 → softmax over nothing is empty and `P·V` sums nothing: the attention output is 0, so
//!   the classic module returns `W_o.bias` and the per-head module zeros;
//! * NaN or ±Inf in the inputs propagate like PyTorch (same NaN/Inf positions as the f64 reference);
//! * huge magnitudes (×1e4) stay finite and match the reference (softmax subtracts the max).

mod common;

use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, ForwardOptions, Mask,
    MultiHeadAttention, Tensor,
};

fn module(config: AttentionConfig) -> (AttentionWeights, MultiHeadAttention) {
    common::module(config, 5)
}

/// The multi-pass path (with probabilities) and the fused path.
fn both_paths() -> [ForwardOptions; 2] {
    [
        common::options(AttentionPath::MultiPass, true),
        common::options(AttentionPath::Fused, false),
    ]
}

#[test]
fn empty_batch_and_empty_queries_give_empty_outputs() {
    let (_, mha) = module(AttentionConfig::classic(16, 2).unwrap());
    for (b, lq, lk) in [(0, 4, 4), (2, 0, 5), (0, 0, 0)] {
        let q = Tensor::zeros([b, lq, 16]);
        let kv = Tensor::zeros([b, lk, 16]);
        for options in both_paths() {
            let out = mha
                .forward_with(&q, &kv, &kv, &Mask::None, &options)
                .unwrap();
            assert_eq!(out.output.shape(), &[b, lq, 16]);
            assert!(out.output.is_empty());
        }
    }
}

#[test]
fn no_keys_gives_the_output_bias_like_pytorch() {
    // torch: softmax over an empty last dim is empty; empty @ V is zeros; W_o(0) = W_o.bias.
    let (weights, mha) = module(AttentionConfig::classic(16, 2).unwrap());
    let q = Tensor::random([2, 3, 16], 1);
    let kv = Tensor::zeros([2, 0, 16]);
    let out = mha.forward(&q, &kv, &kv, &Mask::None).unwrap();
    let bias = weights.o.as_ref().unwrap().bias.as_ref().unwrap();
    for row in out.data().chunks(16) {
        assert_eq!(row, bias.as_slice());
    }
    let (_, per_head) = module(AttentionConfig::per_head(8, 4, 6, 2).unwrap());
    let out = per_head
        .forward_cross(
            &Tensor::random([1, 2, 8], 1),
            &Tensor::zeros([1, 0, 8]),
            &Mask::None,
        )
        .unwrap();
    assert_eq!(out.shape(), &[1, 2, 12]);
    assert!(out.data().iter().all(|&v| v == 0.0));
}

/// Same NaN positions, same infinities, finite values within tolerance.
fn assert_matches_with_nonfinite(label: &str, got: &[f32], want: &[f64]) {
    let finite: Vec<f64> = want.iter().cloned().filter(|v| v.is_finite()).collect();
    let tol = common::tolerance(&finite);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(
                g.is_nan(),
                "{label}: element {i} is {g}, PyTorch semantics give NaN"
            );
        } else if w.is_infinite() {
            assert_eq!(g as f64, w, "{label}: element {i}");
        } else {
            assert!(
                (g as f64 - w).abs() <= tol,
                "{label}: element {i}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn nan_and_inf_propagate_like_the_reference() {
    for config in [
        AttentionConfig::classic(16, 2).unwrap(),
        AttentionConfig::per_head(12, 4, 6, 3).unwrap(),
    ] {
        let (weights, mha) = module(config);
        for poison in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            // Poison one query value (its row goes NaN/Inf) and, separately, one key value
            // (every query that attends to it is affected).
            let mut q = Tensor::random([2, 4, config.model_dim], 1);
            q.data_mut()[config.model_dim + 3] = poison;
            let kv = Tensor::random([2, 5, config.model_dim], 2);
            let mut kv_poisoned = kv.clone();
            kv_poisoned.data_mut()[5 * config.model_dim + 2] = poison;
            for (what, q, kv) in [
                ("query", &q, &kv),
                (
                    "key/value",
                    &Tensor::random([2, 4, config.model_dim], 1),
                    &kv_poisoned,
                ),
            ] {
                let want = reference::forward(&config, &weights, q, kv, kv, &Mask::Causal).unwrap();
                assert!(
                    want.output.iter().any(|v| !v.is_finite()),
                    "the poison must reach the output"
                );
                for options in both_paths() {
                    let got = mha
                        .forward_with(q, kv, kv, &Mask::Causal, &options)
                        .unwrap();
                    let label = format!("{poison} in {what}, {:?}", options.path);
                    assert_matches_with_nonfinite(&label, got.output.data(), &want.output);
                }
            }
        }
    }
}

#[test]
fn huge_magnitudes_stay_finite_and_match() {
    let config = AttentionConfig::classic(16, 2).unwrap();
    let (weights, mha) = module(config);
    let x = Tensor::random([2, 6, 16], 3).scaled(1e4);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    for options in both_paths() {
        let got = mha
            .forward_with(&x, &x, &x, &Mask::Causal, &options)
            .unwrap();
        assert!(
            got.output.data().iter().all(|v| v.is_finite()),
            "{:?}: non-finite output",
            options.path
        );
        // Scores reach ~1e8; f32 keeps ~7 digits, so compare relative to the output's size.
        let err = common::max_err(got.output.data(), &want.output);
        let scale = want.max_abs();
        assert!(
            err <= 1e-4 * scale,
            "{:?}: error {err:.3e} vs magnitude {scale:.3e}",
            options.path
        );
    }
}
