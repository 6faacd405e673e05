//! The fused `flash_attention` path agrees with the multi-pass path (and the f64 reference) on
//! every mask kind and both module shapes; and a problem whose scores would not fit a storage
//! binding runs on the fused path.

mod common;

use common::{bits, gpu, max_err, tolerance, Problem as Case};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, ForwardOptions, Mask,
    MultiHeadAttention, Tensor,
};

fn classic(label: &'static str, batch: usize, lq: usize, lk: usize, mask: Mask) -> Case {
    Case {
        label,
        config: AttentionConfig::classic(32, 4).expect("config"),
        batch,
        lq,
        lk,
        mask,
        self_attention: false,
    }
}

fn per_head(label: &'static str, batch: usize, lq: usize, lk: usize, mask: Mask) -> Case {
    Case {
        label,
        config: AttentionConfig::per_head(24, 6, 10, 3).expect("config"),
        batch,
        lq,
        lk,
        mask,
        self_attention: false,
    }
}

fn keep(len: usize, seed: u64) -> Vec<u8> {
    bits(len, seed).iter().map(|&b| (!b) as u8).collect()
}

fn cases() -> Vec<Case> {
    let (b, lq, lk) = (2, 5, 7);
    // Rank-4 keep mask with every key of (b 1, h 2, row 3) and (b 0, h 0, row 0) masked.
    let mut full_rows = keep(b * 4 * lq * lk, 4);
    full_rows[..lk].fill(0);
    let at = ((4 + 2) * lq + 3) * lk;
    full_rows[at..at + lk].fill(0);
    // Rank-3 block mask (per-head polarity) with row 1 of batch 0 fully blocked.
    let mut blocked = bits(b * lq * lk, 9);
    blocked[lk..2 * lk].fill(true);
    vec![
        classic("classic none", b, lq, lk, Mask::None),
        classic("classic causal Lq=Lk", b, 6, 6, Mask::Causal),
        classic("classic causal Lq<Lk", b, 3, 8, Mask::Causal),
        classic(
            "classic causal Lq>Lk (fully masked top rows)",
            b,
            8,
            3,
            Mask::Causal,
        ),
        classic(
            "classic key padding with a 0 length",
            b,
            lq,
            lk,
            Mask::KeyPadding(vec![4, 0]),
        ),
        classic(
            "classic key padding full/short",
            b,
            lq,
            lk,
            Mask::KeyPadding(vec![lk, 1]),
        ),
        classic(
            "classic attend rank 1",
            b,
            lq,
            lk,
            Mask::attend([lk], keep(lk, 1)).expect("mask"),
        ),
        classic(
            "classic attend rank 2",
            b,
            lq,
            lk,
            Mask::attend([lq, lk], keep(lq * lk, 2)).expect("mask"),
        ),
        classic(
            "classic attend rank 3",
            b,
            lq,
            lk,
            Mask::attend([b, lq, lk], keep(b * lq * lk, 3)).expect("mask"),
        ),
        classic(
            "classic attend rank 4, fully masked rows",
            b,
            lq,
            lk,
            Mask::attend([b, 4, lq, lk], full_rows).expect("mask"),
        ),
        classic(
            "classic attend [B,1,1,Lk]",
            b,
            lq,
            lk,
            Mask::attend([b, 1, 1, lk], keep(b * lk, 5)).expect("mask"),
        ),
        classic(
            "classic bias rank 2",
            b,
            lq,
            lk,
            Mask::bias(Tensor::random([lq, lk], 6)),
        ),
        classic(
            "classic bias rank 4",
            b,
            lq,
            lk,
            Mask::bias(Tensor::random([b, 4, lq, lk], 7)),
        ),
        classic("classic decode Lq=1 causal", b, 1, 9, Mask::Causal),
        // Past one 64-row query block and several K/V tiles: exercises tile skipping.
        classic("classic causal 70x70 (multi-tile)", 1, 70, 70, Mask::Causal),
        classic(
            "classic key padding 67 keys (multi-tile)",
            2,
            66,
            67,
            Mask::KeyPadding(vec![40, 0]),
        ),
        // Key groups wholly visible to a block's rows skip the mask; these blocks hold groups
        // that the causal edge leaves visible but the window's far edge does not.
        classic(
            "classic sliding window 19, 150x150 (multi-block)",
            1,
            150,
            150,
            Mask::SlidingWindow(19),
        ),
        classic(
            "classic sliding window 9, Lq 40 < Lk 150",
            2,
            40,
            150,
            Mask::SlidingWindow(9),
        ),
        classic(
            "classic causal Lq>Lk 80x33 (multi-tile)",
            1,
            80,
            33,
            Mask::Causal,
        ),
        per_head("per-head none cross", b, lq, lk, Mask::None),
        per_head("per-head causal Lq>Lk", b, 7, 4, Mask::Causal),
        per_head(
            "per-head key padding with a 0 length",
            b,
            lq,
            lk,
            Mask::KeyPadding(vec![0, 3]),
        ),
        per_head(
            "per-head block rank 1",
            b,
            lq,
            lk,
            Mask::block([lk], &bits(lk, 11)).expect("mask"),
        ),
        per_head(
            "per-head block rank 2",
            b,
            lq,
            lk,
            Mask::block([lq, lk], &bits(lq * lk, 12)).expect("mask"),
        ),
        per_head(
            "per-head block rank 3, fully masked row",
            b,
            lq,
            lk,
            Mask::block([b, lq, lk], &blocked).expect("mask"),
        ),
        per_head(
            "per-head block rank 4",
            b,
            lq,
            lk,
            Mask::block([b, 3, lq, lk], &bits(b * 3 * lq * lk, 13)).expect("mask"),
        ),
        per_head(
            "per-head bias rank 3",
            b,
            lq,
            lk,
            Mask::bias(Tensor::random([b, lq, lk], 14)),
        ),
    ]
}

#[test]
fn fused_matches_multipass_on_every_mask_kind() {
    let cases = cases();
    assert!(cases.len() >= 20);
    for (n, case) in cases.iter().enumerate() {
        let c = case.config;
        let weights = AttentionWeights::random(&c, 100 + n as u64);
        let mha = MultiHeadAttention::new(gpu(), c, &weights).expect("module");
        let x_q = Tensor::random([case.batch, case.lq, c.model_dim], 200 + n as u64);
        let x_kv = Tensor::random([case.batch, case.lk, c.key_dim], 300 + n as u64);
        let run = |path| {
            let options = ForwardOptions {
                path,
                ..Default::default()
            };
            let out = mha
                .forward_with(&x_q, &x_kv, &x_kv, &case.mask, &options)
                .unwrap_or_else(|e| panic!("{}: {path:?} failed: {e}", case.label));
            assert_eq!(out.path, path, "{}", case.label);
            out.output
        };
        let fused = run(AttentionPath::Fused);
        let multi = run(AttentionPath::MultiPass);
        let want =
            reference::forward(&c, &weights, &x_q, &x_kv, &x_kv, &case.mask).expect("reference");
        let tol = tolerance(&want.output);
        let multi_f64: Vec<f64> = multi.data().iter().map(|&v| v as f64).collect();
        let diff = max_err(fused.data(), &multi_f64);
        assert!(
            diff <= tol,
            "{}: fused vs multi-pass {diff:.3e} > {tol:.3e}",
            case.label
        );
        let err = max_err(fused.data(), &want.output);
        assert!(
            err <= tol,
            "{}: fused vs reference {err:.3e} > {tol:.3e}",
            case.label
        );
    }
}

/// f64 attention output (after W_o) for a few query rows of a causal self-attention.
fn reference_rows(
    c: &AttentionConfig,
    w: &AttentionWeights,
    x: &Tensor,
    rows: &[usize],
) -> Vec<Vec<f64>> {
    let l = x.shape()[1];
    let d = c.model_dim;
    let xf: Vec<f64> = x.data().iter().map(|&v| v as f64).collect();
    let k = reference::linear(&xf, l, &w.k);
    let v = reference::linear(&xf, l, &w.v);
    let (h, dk) = (c.heads, c.qk_head_dim);
    let scale = c.scale() as f64;
    rows.iter()
        .map(|&i| {
            let q = reference::linear(&xf[i * d..(i + 1) * d], 1, &w.q);
            let mut combined = vec![0.0f64; h * dk];
            for hi in 0..h {
                // Causal with Lq = Lk: keys 0..=i.
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..dk)
                            .map(|e| q[hi * dk + e] * k[j * h * dk + hi * dk + e])
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (j, sj) in s.iter().enumerate() {
                    let p = (sj - m).exp() / sum;
                    for e in 0..dk {
                        combined[hi * dk + e] += p * v[j * h * dk + hi * dk + e];
                    }
                }
            }
            reference::linear(&combined, 1, w.o.as_ref().expect("classic has W_o"))
        })
        .collect()
}

/// Runs a causal self-attention of `batch` sequences of `l` tokens with `Auto` options, checks
/// it took the fused path (its scores exceed the tests' 16 MiB binding) and matches sampled rows.
/// A device capped at a 16 MiB binding, so the scores of the long tests cross it on every adapter.
fn capped_gpu() -> &'static wgpu_mha::Gpu {
    static CAPPED: std::sync::OnceLock<wgpu_mha::Gpu> = std::sync::OnceLock::new();
    CAPPED.get_or_init(|| common::gpu_with_binding_cap(common::SMALL_BINDING))
}

fn check_fused_long(batch: usize, l: usize) {
    let (d, h) = (512, 8);
    let c = AttentionConfig::classic(d, h).expect("config");
    let weights = AttentionWeights::random(&c, 3);
    let capped = capped_gpu();
    let mha = MultiHeadAttention::new(capped, c, &weights).expect("module");
    let x = Tensor::random([batch, l, d], 4);
    assert!(4 * (batch * h * l * l) as u64 > capped.limits().max_storage_buffer_binding_size);
    let out = mha
        .forward_with(&x, &x, &x, &Mask::Causal, &ForwardOptions::default())
        .expect("the fused path handles scores larger than a binding");
    assert_eq!(out.path, AttentionPath::Fused);
    assert_eq!(out.output.shape(), &[batch, l, d]);
    let rows = [0, 1, 63, 64, l / 2 - 1, l - 1];
    for b in [0, batch - 1] {
        let xb =
            Tensor::new([1, l, d], x.data()[b * l * d..(b + 1) * l * d].to_vec()).expect("slice");
        let want = reference_rows(&c, &weights, &xb, &rows);
        for (&i, want_row) in rows.iter().zip(&want) {
            let got = &out.output.data()[(b * l + i) * d..(b * l + i + 1) * d];
            let err = max_err(got, want_row);
            let tol = tolerance(want_row);
            assert!(
                err <= tol,
                "batch {b} row {i}: max error {err:.3e} > {tol:.3e}"
            );
        }
    }
}

/// B3 H8 L512, d_model 512: scores 3·8·512²·4 B = 24 MiB > 16 MiB, so `Auto` runs fused.
#[test]
fn scores_larger_than_a_binding_run_fused() {
    check_fused_long(3, 512);
}

/// B1 H8 d_model 512 (head 64), Lq = Lk just past one dispatch's keys (at least 1,024, so the
/// scores pass 16 MiB): fused, never allocating `[B, H, Lq, Lk]`, with the key range split over
/// two dispatches and the state carried between them. On a CPU adapter a dispatch's keys are
/// what keeps an invocation under llvmpipe's cap of 65,535 loop iterations (1,400–2,700 keys
/// by shape), so the length follows the device's own split rather than a fixed 4,096 (which
/// cost GL CI minutes without testing more).
#[test]
fn long_sequence_runs_fused_and_matches_sampled_rows() {
    let flash = wgpu_mha::kernels::flash_attention::Flash::new(capped_gpu(), 64, 64, false)
        .expect("a d64 flash tile fits every adapter");
    let l = (flash.keys_per_dispatch() + 1)
        .next_multiple_of(64)
        .max(1024);
    assert!(
        flash.key_ranges(l).len() >= 2,
        "L {l} must take two dispatches"
    );
    check_fused_long(1, l);
}

/// Long key ranges with the per-head seed's head sizes (q/k 256, v 512: the most work per key)
/// and every mask kind that skips tiles, against the reference.
#[test]
fn long_keys_with_large_heads_match_the_reference() {
    let c = AttentionConfig::per_head(64, 256, 512, 2).expect("config");
    let weights = AttentionWeights::random(&c, 5);
    let mha = MultiHeadAttention::new(gpu(), c, &weights).expect("module");
    let q = Tensor::random([2, 9, 64], 6);
    let kv = Tensor::random([2, 700, 64], 7);
    for mask in [Mask::None, Mask::Causal, Mask::KeyPadding(vec![300, 0])] {
        let fused = ForwardOptions {
            path: AttentionPath::Fused,
            ..Default::default()
        };
        let got = mha
            .forward_with(&q, &kv, &kv, &mask, &fused)
            .expect("fused");
        let want =
            wgpu_mha::reference::forward(&c, &weights, &q, &kv, &kv, &mask).expect("reference");
        let err = max_err(got.output.data(), &want.output);
        assert!(
            err <= tolerance(&want.output),
            "{}: error {err:.3e}",
            mask.kind_name()
        );
    }
}

/// Heads too wide for one 8-key K/V tile in workgroup memory: `Auto` runs the multi-pass core
/// and matches the reference; forcing `Fused` is `Err(Unsupported)` naming the head sizes.
#[test]
fn heads_too_wide_for_a_fused_tile_use_the_multi_pass_core() {
    let bytes = gpu().limits().max_compute_workgroup_storage_size as usize;
    // Smallest per-head width (q/k = v) whose 8-key tile overflows this device's workgroup memory.
    let width = (bytes / (8 * 2 * 4) + 1).next_multiple_of(4);
    let config = AttentionConfig::per_head(8, width, width, 1).expect("config");
    let weights = AttentionWeights::random(&config, 3);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let (q, kv) = (Tensor::random([2, 3, 8], 1), Tensor::random([2, 5, 8], 2));
    let mask = Mask::Causal;

    let auto = mha
        .forward_with(&q, &kv, &kv, &mask, &ForwardOptions::default())
        .expect("auto forward");
    assert_eq!(auto.path, AttentionPath::MultiPass);
    let want = reference::forward(&config, &weights, &q, &kv, &kv, &mask).expect("reference");
    let err = max_err(auto.output.data(), &want.output);
    assert!(err <= tolerance(&want.output), "error {err:.3e}");

    let forced = ForwardOptions {
        path: AttentionPath::Fused,
        ..Default::default()
    };
    let err = mha
        .forward_with(&q, &kv, &kv, &mask, &forced)
        .expect_err("fused must be refused");
    assert!(
        matches!(err, wgpu_mha::Error::Unsupported { .. })
            && err.to_string().contains(&format!("{width}")),
        "{err}"
    );
}
