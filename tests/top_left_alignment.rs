//! The causal rules under `CausalAlignment::TopLeft` (PyTorch's `is_causal`) with more queries
//! than keys, where a query's diagonal lies past the last key: a sliding window wider than Lk
//! still hides keys from such queries (it used to be clamped to Lk, which holds bottom-right
//! only), padded windows too; and ALiBi's query position is the diagonal's key, i′ = i top-left
//! and i′ = i + Lk − Lq bottom-right — which sinks make visible (softmax alone ignores a
//! constant per row). Each path (decode, flash, multi-pass) against the reference core, and the
//! reference against masks and biases written out here from the definitions.

mod common;

use common::{relative_tolerance, sdpa_bhld, sdpa_reference};
use wgpu_mha::{AttentionPath, CausalAlignment, Mask, MaskTensor, SdpaOptions, Tensor};

const PATHS: [(&str, usize, AttentionPath); 3] = [
    ("decode", 7, AttentionPath::Fused),
    ("flash", 11, AttentionPath::Fused),
    ("multi-pass", 11, AttentionPath::MultiPass),
];
const LK: usize = 4;
const B: usize = 2;
const H: usize = 2;

/// Runs `options` on the device against the reference core of the same options, and that
/// reference against the reference core of `written` (the same problem spelled as a plain mask
/// or bias, with neither alignment nor ALiBi to interpret).
fn check(label: &str, lq: usize, options: &SdpaOptions, written: &SdpaOptions) {
    let run = sdpa_bhld(label, [B, H, lq, LK, 8], false, options);
    let (plain, _) = sdpa_reference([B, H, lq, LK, 8], false, written);
    let tol = relative_tolerance(1e-5, &run.want);
    let gap = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
    };
    let written_gap = gap(&run.want, &plain);
    assert!(
        written_gap <= tol,
        "{label}: the reference's rule differs from the definition by {written_gap:.3e}"
    );
    let got: Vec<f64> = run.got.iter().map(|&x| x as f64).collect();
    let err = gap(&got, &run.want);
    assert!(err <= tol, "{label}: max error {err:.3e} > {tol:.3e}");
}

/// `[B, Lq, Lk]` true = masked, for query i seeing keys j with i − w < j ≤ i (top-left) and,
/// when `keep` is given, only the keys it marks.
fn written_window(lq: usize, w: usize, keep: Option<&[u8]>) -> Mask {
    let hidden: Vec<bool> = (0..B * lq * LK)
        .map(|n| {
            let (b, i, j) = (n / (lq * LK), n / LK % lq, n % LK);
            let in_window = j <= i && j + w > i;
            !in_window || keep.is_some_and(|k| k[b * LK + j] == 0)
        })
        .collect();
    Mask::block(vec![B, lq, LK], &hidden).expect("mask")
}

#[test]
fn a_window_wider_than_lk_still_hides_keys_top_left() {
    // Lq > Lk = 4 and a window of 6: query 8 sees only key 3, queries from 9 on none (they
    // average V, as every fully masked row); clamped to 4, query 8 would see none.
    let keep: Vec<u8> = vec![1, 0, 1, 1, 1, 1, 0, 1];
    for (path_label, lq, path) in PATHS {
        for (kind, mask, written) in [
            (
                "window",
                Mask::SlidingWindow(6),
                written_window(lq, 6, None),
            ),
            (
                "padded window",
                Mask::CausalKeep {
                    window: Some(6),
                    keep: MaskTensor::new(vec![B, LK], keep.clone()).expect("keep"),
                },
                written_window(lq, 6, Some(&keep)),
            ),
        ] {
            let options = SdpaOptions {
                mask,
                causal_alignment: CausalAlignment::TopLeft,
                path,
                return_probs: path == AttentionPath::MultiPass,
                ..Default::default()
            };
            let written = SdpaOptions {
                mask: written,
                ..Default::default()
            };
            check(&format!("{kind} {path_label}"), lq, &options, &written);
        }
    }
}

/// `[1, H, Lq, Lk]`: slope(h) · (j − i′) with BLOOM's slopes for 2 heads and max_bias 8
/// (2^−4, 2^−8), i′ = i + `shift`.
fn written_alibi(lq: usize, shift: i64) -> Mask {
    let slopes = [1.0 / 16.0, 1.0 / 256.0];
    let data = (0..H * lq * LK)
        .map(|n| {
            let (h, i, j) = (n / (lq * LK), (n / LK % lq) as i64, (n % LK) as i64);
            (slopes[h] * (j - (i + shift)) as f64) as f32
        })
        .collect();
    Mask::Bias(Tensor::new([1, H, lq, LK], data).expect("bias"))
}

#[test]
fn alibi_measures_from_the_diagonal_of_either_alignment() {
    // Sinks (one logit per head) stay put while a constant shift of the row's scores moves
    // their weight: i′ = i against i′ = i + Lk − Lq differ by up to Lq − Lk slopes here.
    for (path_label, lq, path) in PATHS {
        for (align, shift) in [
            (CausalAlignment::TopLeft, 0),
            (CausalAlignment::BottomRight, LK as i64 - lq as i64),
        ] {
            let sinks = Some(vec![0.5, -0.25]);
            let options = SdpaOptions {
                alibi_max_bias: Some(8.0),
                causal_alignment: align,
                sinks: sinks.clone(),
                path,
                ..Default::default()
            };
            let written = SdpaOptions {
                mask: written_alibi(lq, shift),
                sinks,
                ..Default::default()
            };
            check(
                &format!("alibi {align:?} {path_label}"),
                lq,
                &options,
                &written,
            );
        }
    }
}
