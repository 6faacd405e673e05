//! End to end: both seed modules, many shapes and every mask kind, on both attention paths,
//! against the f64 CPU reference (tolerance 1e-5·(1 + max|ref|)).

mod common;

use common::{check_against_reference, max_err, module, options, BOTH_PATHS};
use wgpu_mha::{
    model::weights::SplitMix64, AttentionConfig, AttentionPath, Mask, MaskTensor, Tensor,
};

/// How the three inputs relate.
#[derive(Clone, Copy, Debug)]
enum Inputs {
    /// query = key = value (self-attention, fused QKV GEMM)
    Same,
    /// key = value (seed 001's x_k_v)
    SharedKv,
    /// three different tensors
    Distinct,
}
use Inputs::{Distinct, Same, SharedKv};

struct Case {
    label: &'static str,
    config: AttentionConfig,
    /// (batch, Lq, Lk)
    dims: (usize, usize, usize),
    inputs: Inputs,
    mask: Mask,
    input_scale: f32,
}

fn random_bytes(n: usize, seed: u64, p_set: f32) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| (rng.uniform(0.0, 1.0) < p_set) as u8)
        .collect()
}

fn classic(d: usize, h: usize) -> AttentionConfig {
    AttentionConfig::classic(d, h).expect("valid classic config")
}
fn per_head(e: usize, qk: usize, v: usize, h: usize) -> AttentionConfig {
    AttentionConfig::per_head(e, qk, v, h).expect("valid per-head config")
}
fn attend(shape: &[usize], keep: Vec<u8>) -> Mask {
    Mask::Attend(MaskTensor::new(shape, keep).expect("attend mask"))
}
fn block(shape: &[usize], blocked: Vec<u8>) -> Mask {
    Mask::Block(MaskTensor::new(shape, blocked).expect("block mask"))
}
fn case(
    label: &'static str,
    config: AttentionConfig,
    dims: (usize, usize, usize),
    inputs: Inputs,
    mask: Mask,
) -> Case {
    Case {
        label,
        config,
        dims,
        inputs,
        mask,
        input_scale: 1.0,
    }
}

/// The configurations: label, module, (batch, Lq, Lk), how Q/K/V relate, mask.
#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let pad = Mask::KeyPadding;
    let scaled = |case: Case| Case { input_scale: 30.0, ..case };
    vec![
        // Classic shapes (seed 000).
        case("classic d64 h8 self none", classic(64, 8), (2, 16, 16), Same, Mask::None),
        case("classic d72 h3 (d_k 24) self causal", classic(72, 3), (1, 9, 9), Same, Mask::Causal),
        case("classic d32 h4 lq<lk causal", classic(32, 4), (2, 5, 11), Distinct, Mask::Causal),
        case("classic d32 h4 lq>lk causal (rows with no key)", classic(32, 4), (2, 11, 5), Distinct, Mask::Causal),
        case("classic d48 h4 lq=1", classic(48, 4), (3, 1, 13), Distinct, Mask::None),
        case("classic d48 h4 lk=1", classic(48, 4), (2, 7, 1), Distinct, Mask::None),
        case("classic d48 h4 lq=lk=1", classic(48, 4), (4, 1, 1), Same, Mask::None),
        case("classic d32 h2 padding", classic(32, 2), (3, 6, 6), Same, pad(vec![6, 3, 1])),
        case("classic d32 h2 padding with empty sequence", classic(32, 2), (2, 5, 7), SharedKv, pad(vec![0, 7])),
        case("classic d40 h5 attend [B,1,Lq,Lk]", classic(40, 5), (2, 6, 9), Distinct,
            attend(&[2, 1, 6, 9], random_bytes(2 * 6 * 9, 1, 0.6))),
        case("classic d40 h5 attend [B,H,Lq,Lk] per head", classic(40, 5), (2, 4, 7), Distinct,
            attend(&[2, 5, 4, 7], random_bytes(2 * 5 * 4 * 7, 2, 0.5))),
        case("classic d32 h4 attend [B,1,1,Lk] padding-style", classic(32, 4), (3, 5, 6), SharedKv,
            attend(&[3, 1, 1, 6], vec![1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0])),
        case("classic d32 h4 attend [1,1,Lq,Lk] all zero (every row masked)", classic(32, 4), (2, 4, 6), Distinct,
            attend(&[1, 1, 4, 6], vec![0; 24])),
        case("classic d32 h4 attend rank 2 [Lq,Lk] with a fully masked row", classic(32, 4), (2, 3, 4), Distinct,
            attend(&[3, 4], vec![1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0])),
        case("classic d24 h3 attend rank 1 [Lk]", classic(24, 3), (2, 5, 8), Distinct,
            attend(&[8], vec![1, 1, 0, 1, 0, 1, 1, 1])),
        case("classic d24 h3 block rank 3 [B,Lq,Lk]", classic(24, 3), (2, 5, 8), Distinct,
            block(&[2, 5, 8], random_bytes(80, 3, 0.3))),
        case("classic d32 h4 additive bias [1,H,Lq,Lk]", classic(32, 4), (2, 6, 6), Same,
            Mask::Bias(Tensor::random([1, 4, 6, 6], 4).scaled(3.0))),
        case("classic d128 h8 b4 longer", classic(128, 8), (4, 33, 47), Distinct, Mask::None),
        case("classic d96 h1 single head", classic(96, 1), (1, 20, 20), Same, Mask::Causal),
        case("classic d100 h4 (d_k 25) odd widths", classic(100, 4), (2, 13, 70), Distinct, Mask::None),
        // Per-head shapes (seed 001).
        case("per-head e72 qk16 v24 h3 cross", per_head(72, 16, 24, 3), (2, 5, 7), SharedKv, Mask::None),
        case("per-head e16 qk8 v4 h2 self causal", per_head(16, 8, 4, 2), (1, 9, 9), Same, Mask::Causal),
        case("per-head e32 qk12 v20 h4 lq>lk", per_head(32, 12, 20, 4), (2, 9, 4), SharedKv, Mask::None),
        case("per-head e32 qk12 v20 h4 lq=1", per_head(32, 12, 20, 4), (4, 1, 9), SharedKv, Mask::None),
        case("per-head e20 qk4 v12 h3 lk=1", per_head(20, 4, 12, 3), (2, 5, 1), SharedKv, Mask::None),
        case("per-head e24 qk6 v10 h2 block [B,Lq,Lk] (seed polarity)", per_head(24, 6, 10, 2), (3, 4, 6), SharedKv,
            block(&[3, 4, 6], random_bytes(72, 5, 0.35))),
        case("per-head e24 qk6 v10 h2 block with a fully masked row", per_head(24, 6, 10, 2), (1, 3, 5), SharedKv,
            block(&[1, 3, 5], vec![0, 1, 0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1])),
        case("per-head e24 qk6 v10 h2 padding", per_head(24, 6, 10, 2), (2, 6, 6), SharedKv, pad(vec![2, 6])),
        case("per-head e24 qk6 v10 h2 attend polarity [B,1,Lq,Lk]", per_head(24, 6, 10, 2), (2, 3, 4), SharedKv,
            attend(&[2, 1, 3, 4], random_bytes(24, 6, 0.7))),
        case("per-head e40 qk16 v8 h5 bias [Lq,Lk]", per_head(40, 16, 8, 5), (2, 4, 5), SharedKv,
            Mask::Bias(Tensor::random([4, 5], 7))),
        case("per-head e128 qk256 v512 h8 (seed size)", per_head(128, 256, 512, 8), (1, 6, 10), SharedKv, Mask::None),
        case("per-head e33 qk7 v9 h3 distinct k/v", per_head(33, 7, 9, 3), (2, 6, 5), Distinct, Mask::Causal),
        case("per-head without bias, scale override",
            per_head(16, 8, 8, 2).with_bias(false).with_scale(0.3).unwrap(), (2, 4, 6), SharedKv, Mask::None),
        // Inputs ×30: large scores.
        scaled(case("classic d32 h4 inputs x30 causal", classic(32, 4), (2, 6, 6), Same, Mask::Causal)),
        scaled(case("per-head e24 qk8 v8 h3 inputs x30", per_head(24, 8, 8, 3), (2, 6, 6), Same, Mask::None)),
    ]
}

/// Every case on `path` against the f64 reference (probabilities too when `return_probs`).
fn run_all(path: AttentionPath, return_probs: bool) {
    let options = options(path, return_probs);
    for case in cases() {
        let (c, (batch, lq, lk)) = (&case.config, case.dims);
        let query = Tensor::random([batch, lq, c.model_dim], 100).scaled(case.input_scale);
        let key = Tensor::random([batch, lk, c.key_dim], 200).scaled(case.input_scale);
        let value = Tensor::random([batch, lk, c.value_dim], 300).scaled(case.input_scale);
        let label = format!("{} [{path:?}]", case.label);
        let (key, value) = match case.inputs {
            Same => {
                assert_eq!(lq, lk, "{label}: self-attention needs Lq = Lk");
                (&query, &query)
            }
            SharedKv => (&key, &key),
            Distinct => (&key, &value),
        };
        check_against_reference(&label, *c, &query, key, value, &case.mask, &options);
    }
}

#[test]
fn multi_pass_path_with_probabilities_matches_reference() {
    run_all(AttentionPath::MultiPass, true);
}

#[test]
fn fused_path_matches_reference() {
    run_all(AttentionPath::Fused, false);
}

#[test]
fn fully_masked_row_returns_mean_of_values() {
    // Per-head module (no W_o): a query whose keys are all masked gets the plain mean of the
    // projected values, on both paths, and never NaN.
    let config = per_head(8, 4, 4, 1);
    let (weights, mha) = module(config, 9);
    let x_q = Tensor::random([1, 2, 8], 1);
    let x_kv = Tensor::random([1, 5, 8], 2);
    let mask = block(&[1, 2, 5], vec![1, 1, 1, 1, 1, 0, 0, 1, 1, 1]);
    let v = wgpu_mha::reference::linear(
        &x_kv.data().iter().map(|&x| x as f64).collect::<Vec<_>>(),
        5,
        &weights.v,
    );
    let mean: Vec<f64> = (0..4)
        .map(|d| (0..5).map(|j| v[j * 4 + d]).sum::<f64>() / 5.0)
        .collect();
    for path in BOTH_PATHS {
        let out = mha
            .forward_with(&x_q, &x_kv, &x_kv, &mask, &options(path, false))
            .unwrap()
            .output;
        let row0 = &out.data()[..4];
        assert!(
            row0.iter().all(|v| v.is_finite()),
            "{path:?}: NaN in a fully masked row"
        );
        let err = max_err(row0, &mean);
        assert!(
            err < 1e-5,
            "{path:?}: fully masked row is not the mean of V (error {err})"
        );
    }
}
