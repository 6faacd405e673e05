//! Additive masks with finite values as low as −f32::MAX (`torch.finfo(float32).min`,
//! transformers' "masked" value), −1e38 and −1e30, whole rows and mixed with ordinary scores
//! and −inf, on every path: decode (both bodies: the lane-keys one on lavapipe, the shared-key
//! one on GL and with `WGPU_MHA_KERNELS=gpu`, and their reduce), flash, multi-pass with
//! probabilities, the module's forward and `KvCache` steps, device-tensor SDPA, f32 and f16
//! storage. Each against the f64 reference, which adds the bias in f32 as PyTorch does (a row of
//! such values is then uniform over its keys, not NaN); a row whose values are all −inf stays
//! NaN.

mod common;

use common::{gpu, module, relative_tolerance, sdpa_bhld};
use wgpu_mha::reference;
use wgpu_mha::{
    AttentionConfig, AttentionPath, ForwardOptions, KvCache, Mask, SdpaOptions, StepOptions, Tensor,
};

const MIN: f32 = -f32::MAX;
const NEG_INF: f32 = f32::NEG_INFINITY;

/// Bias row `r` of `lk` keys, by kind (`r % 10`): whole rows of −f32::MAX, −1e38, −1e30; those
/// mixed with ordinary scores (partial rows); −inf beside −f32::MAX (uniform over the latter);
/// −2e38 beside −1e38 (the latter win: f32 rounding keeps a 1e38 gap); ordinary values with a
/// few −1e38; a row of −inf (NaN); an ordinary row; and a row of −1e10, uniform in f32 (whose
/// rounding loses the scores) but not in exact f64 addition.
fn bias_row(r: usize, lk: usize, seed: u64) -> Vec<f32> {
    let ordinary = Tensor::random([lk], seed + r as u64).data().to_vec();
    (0..lk)
        .map(|j| match r % 10 {
            0 => MIN,
            1 => -1e38,
            2 => -1e30,
            3 => [MIN, ordinary[j]][j % 2],
            4 => [MIN, NEG_INF, MIN][j % 3],
            5 => [-2e38, -1e38, MIN][j % 3],
            6 => [ordinary[j], -1e38, -1e30][j % 3],
            7 => NEG_INF,
            8 => ordinary[j],
            _ => -1e10,
        })
        .collect()
}

/// A `[B, 1, Lq, Lk]` bias whose rows run through every kind of [`bias_row`].
fn bias(batch: usize, lq: usize, lk: usize, seed: u64) -> Mask {
    let data = (0..batch * lq)
        .flat_map(|r| bias_row(r + seed as usize, lk, seed))
        .collect();
    Mask::Bias(Tensor::new([batch, 1, lq, lk], data).expect("bias"))
}

/// NaN exactly where the reference is NaN (a row of −inf), within `tol` elsewhere; and at least
/// one finite row of finfo-min kind was checked.
fn assert_matches(label: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{label}: length");
    for (e, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{label}: element {e} is {g}, the reference NaN");
        } else {
            let err = (g as f64 - w).abs();
            assert!(err <= tol, "{label}: element {e} is {g}, the reference {w}");
        }
    }
}

/// The finite part of a reference result, for the tolerance.
fn finite(x: &[f64]) -> Vec<f64> {
    x.iter().copied().filter(|v| v.is_finite()).collect()
}

/// One device-tensor call (`[2, 2, Lq, 7]` keys, head size 8) against the reference core.
fn sdpa_case(label: &str, lq: usize, f16: bool, options: SdpaOptions) {
    let run = sdpa_bhld(label, [2, 2, lq, 7, 8], f16, &options);
    assert!(
        run.want.iter().any(|x| x.is_finite()),
        "{label}: finite rows"
    );
    let relative = if f16 { 2e-3 } else { 1e-5 };
    let tol = relative_tolerance(relative, &finite(&run.want));
    assert_matches(label, &run.got, &run.want, tol);
    if let Some((got, want)) = run.probs {
        assert_matches(&format!("{label} probs"), &got, &want, 1e-5);
    }
}

#[test]
fn device_tensor_sdpa_on_every_path_gives_torchs_finite_answer() {
    // Decode: 8 query rows per head; flash: 9; multi-pass with probabilities.
    for (label, lq, path, probs) in [
        ("decode", 8, AttentionPath::Fused, false),
        ("flash", 9, AttentionPath::Fused, false),
        ("multi-pass", 9, AttentionPath::MultiPass, true),
    ] {
        let options = SdpaOptions {
            mask: bias(2, lq, 7, 4),
            path,
            return_probs: probs,
            ..Default::default()
        };
        sdpa_case(label, lq, false, options.clone());
        if gpu().has_f16() && !probs {
            sdpa_case(&format!("{label} f16"), lq, true, options);
        }
    }
}

#[test]
fn soft_cap_alibi_and_sinks_beside_finfo_min() {
    // Score terms added before the bias: a capped score or an ALiBi slope vanishes next to
    // −f32::MAX exactly as in f32; a sink keeps a row of −inf at 0 (no NaN) and joins the
    // denominator of a row of −f32::MAX, whose scores it then outweighs.
    for (lq, path, sinks) in [
        (8, AttentionPath::Fused, None),
        (9, AttentionPath::Fused, Some(vec![0.3, -0.5])),
        (9, AttentionPath::MultiPass, Some(vec![0.3, -0.5])),
    ] {
        let options = SdpaOptions {
            mask: bias(2, lq, 7, 4),
            path,
            softcap: Some(0.8),
            alibi_max_bias: Some(8.0),
            sinks,
            ..Default::default()
        };
        sdpa_case(&format!("score terms lq {lq}"), lq, false, options);
    }
}

#[test]
fn the_module_and_a_kv_cache_give_torchs_finite_answer() {
    let config = AttentionConfig::classic(16, 2).expect("config");
    let (weights, mha) = module(config, 5);
    let (b, l) = (2, 9);
    let x = Tensor::random([b, l, 16], 6);
    let mask = bias(b, l, l, 7);
    let want = reference::forward(&config, &weights, &x, &x, &x, &mask).expect("reference");
    let tol = relative_tolerance(1e-5, &finite(&want.output));
    for path in [AttentionPath::Fused, AttentionPath::MultiPass] {
        let options = ForwardOptions {
            path,
            return_probs: path == AttentionPath::MultiPass,
            positions: None,
        };
        let got = mha
            .forward_with(&x, &x, &x, &mask, &options)
            .unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert_matches(
            &format!("module {path:?}"),
            got.output.data(),
            &want.output,
            tol,
        );
        if let Some(p) = &got.probs {
            assert_matches("module probabilities", p.data(), &want.probs, 1e-5);
        }
    }
    // A cache decoding the same rows: each step's bias over its [B, 1, n, len + n] scores,
    // against the reference of that step alone (its queries, every key so far).
    for path in [AttentionPath::Fused, AttentionPath::MultiPass] {
        let mut cache = KvCache::with_path(&mha, b, l, path).expect("cache");
        let mut pos = 0;
        for n in [8, 1] {
            let rows = |from: usize, to: usize| {
                let e = 16;
                let data: Vec<f32> = (0..b)
                    .flat_map(|bi| x.data()[(bi * l + from) * e..(bi * l + to) * e].to_vec())
                    .collect();
                Tensor::new([b, to - from, e], data).expect("rows")
            };
            let step_mask = bias(b, n, pos + n, 20 + 3 * pos as u64);
            let step = mha
                .forward_step_with(
                    &mut cache,
                    &rows(pos, pos + n),
                    &StepOptions {
                        mask: Some(&step_mask),
                        ..Default::default()
                    },
                )
                .unwrap_or_else(|e| panic!("{path:?} step at {pos}: {e}"));
            let seen = rows(0, pos + n);
            let want = reference::forward(
                &config,
                &weights,
                &rows(pos, pos + n),
                &seen,
                &seen,
                &step_mask,
            )
            .expect("reference");
            let tol = relative_tolerance(1e-5, &finite(&want.output));
            let label = format!("{path:?} cache step at {pos}");
            assert_matches(&label, step.data(), &want.output, tol);
            pos += n;
        }
    }
}

#[test]
fn the_reference_models_the_f32_sum_of_score_and_bias() {
    // Independent of the reference's code: a row of one bias value of −1e10 or below loses
    // every score in f32 rounding (f64 would keep them next to −1e10), so its probabilities are
    // exactly uniform; −2e38 beside −1e38 keeps a gap of 1e38 and weighs 0.
    let config = AttentionConfig::classic(8, 1).expect("config");
    let weights = wgpu_mha::AttentionWeights::random(&config, 3);
    let x = Tensor::random([1, 3, 8], 4);
    let rows = [vec![MIN; 3], vec![-1e10; 3], vec![-2e38, -1e38, -1e38]];
    let mask = Mask::Bias(Tensor::new([3, 3], rows.concat()).expect("bias"));
    let want = reference::forward(&config, &weights, &x, &x, &x, &mask).expect("reference");
    let third = 1.0 / 3.0;
    let expected = [[third; 3], [third; 3], [0.0, 0.5, 0.5]];
    for (i, row) in expected.iter().enumerate() {
        for (j, &p) in row.iter().enumerate() {
            let got = want.probs[i * 3 + j];
            assert!(
                (got - p).abs() < 1e-12,
                "row {i} key {j}: {got}, expected {p}"
            );
        }
    }
}
