//! The pass rule of case files cannot be gamed and is fair to NaN: a file's declared
//! `err_f32_vs_f64` is capped, and NaN that PyTorch would propagate matches NaN at exactly
//! the same positions.

mod common;

use common::gpu;
use wgpu_mha::{Case, ForwardOptions};

const CASE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/classic_b2_l6_d32_h4_causal.safetensors"
);

#[test]
fn a_declared_error_cannot_make_any_answer_pass() {
    let mut case = Case::from_file(CASE).expect("fixture");
    case.err_f32_vs_f64 = Some(1e308);
    assert!(case.bound_capped());
    assert_eq!(case.bound(), case.bound_cap());
    assert!(
        case.bound().is_finite() && case.bound() < 0.1,
        "{}",
        case.bound()
    );
    // The real answer still passes under the cap.
    let options = ForwardOptions::default();
    assert!(case.run(gpu(), &options).expect("runs").passed());
    // A wrong expected answer no longer does.
    case.out_f64.iter_mut().for_each(|v| *v += 1.0);
    let result = case.run(gpu(), &options).expect("runs");
    assert!(
        !result.passed(),
        "err {} bound {}",
        result.max_abs_err,
        result.bound
    );
    // An honest declared error is used as it is.
    case.err_f32_vs_f64 = Some(1e-7);
    assert!(!case.bound_capped());
    assert_eq!(case.bound(), 1e-5);
}

#[test]
fn nan_expected_where_the_output_is_nan_matches() {
    let mut case = Case::from_file(CASE).expect("fixture");
    // A NaN in one query row of batch 1: PyTorch's output is NaN in exactly that row.
    let d = case.config.model_dim;
    let (lq, row) = (case.query.shape()[1], 2);
    case.query.data_mut()[(lq + row) * d + 5] = f32::NAN;
    let want = case.reference().expect("reference");
    let nan_rows = want
        .output
        .chunks(d)
        .filter(|r| r.iter().any(|v| v.is_nan()))
        .count();
    assert_eq!(nan_rows, 1, "the reference propagates NaN to one row");
    case.out_f64 = want.output.clone();
    case.err_f32_vs_f64 = None;
    let result = case.run(gpu(), &ForwardOptions::default()).expect("runs");
    assert!(
        result.passed(),
        "err {} bound {}",
        result.max_abs_err,
        result.bound
    );
    // NaN where a finite value is expected, or a finite value where NaN is, fails.
    let mut got = result.forward.output.data().to_vec();
    let nan_at = got.iter().position(|v| v.is_nan()).expect("a NaN output");
    got[nan_at] = 0.0;
    assert!(case.max_abs_err(&got).is_nan());
    let mut got = result.forward.output.data().to_vec();
    got[0] = f32::NAN;
    assert!(case.max_abs_err(&got).is_nan());
    // And a wrong length never passes.
    assert!(case.max_abs_err(&got[1..]).is_nan());
}
