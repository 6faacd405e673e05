//! The standalone per-pass runners (`wgpu_mha::kernels::standalone`) against plain f64 math,
//! including sizes that hit every edge of the tiles and every `linear` variant (scalar, vec4,
//! subgroup; into plain and head-split outputs), the auto choice between them, and every mask kind through `scores`, `flash_attention` and the
//! multi-pass core.

mod common;

use common::{gpu, max_err, tolerance};
use wgpu_mha::kernels::linear::{self, BoundElems, LinearParams, LinearVariant::*, Segment};
use wgpu_mha::kernels::standalone::{self, Core, CoreDims, HeadSplit, LinearKernel};
use wgpu_mha::{Error, Mask, MaskTensor, Tensor};

/// Sizes (batch, heads, Lq, Lk, dk, dv) of an attention-core problem.
fn core_dims(batch: usize, heads: usize, lq: usize, lk: usize, dk: usize, dv: usize) -> CoreDims {
    CoreDims {
        batch,
        heads,
        lq,
        lk,
        qk_head_dim: dk,
        v_head_dim: dv,
    }
}

fn rand(len: usize, seed: u64) -> Vec<f32> {
    Tensor::random([len], seed).into_data()
}

fn matmul_nt(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for r in 0..m {
        for c in 0..n {
            let mut acc = bias.map_or(0.0, |b| b[c] as f64);
            for e in 0..k {
                acc += x[r * k + e] as f64 * w[c * k + e] as f64;
            }
            y[r * n + c] = acc;
        }
    }
    y
}

#[test]
fn linear_matches_f64_on_edge_sizes() {
    // (m, n, k): the scalar variant (k % 4 != 0) and the vec4-eligible shapes, partial and
    // multiple tiles.
    let shapes = [(1, 1, 1), (3, 5, 7), (64, 64, 64)]
        .into_iter()
        .chain(VEC4_SHAPES);
    for (i, (m, n, k)) in shapes.enumerate() {
        let x = rand(m * k, 10 + i as u64);
        let w = rand(n * k, 20 + i as u64);
        let b = rand(n, 30 + i as u64);
        for bias in [None, Some(b.as_slice())] {
            let want = matmul_nt(&x, &w, bias, m, n, k);
            let tol = tolerance(&want);
            let got = standalone::linear(gpu(), (&x, &w, bias), (m, n, k), LinearKernel::Auto)
                .expect("linear");
            let err = max_err(&got, &want);
            assert!(
                err <= tol,
                "linear {m}x{n}x{k} bias={}: {err:.3e}",
                bias.is_some()
            );
            let naive = standalone::linear(gpu(), (&x, &w, bias), (m, n, k), LinearKernel::Naive)
                .expect("naive");
            let err = max_err(&naive, &want);
            assert!(err <= tol, "linear_naive {m}x{n}x{k}: {err:.3e}");
        }
    }
}

/// Vec4-eligible shapes (K % 4 == 0) whose M and N are off the 128×64 tile, or smaller.
const VEC4_SHAPES: [(usize, usize, usize); 6] = [
    (1, 1, 4),
    (17, 9, 4),
    (129, 65, 8),
    (130, 70, 36),
    (200, 136, 20),
    (257, 193, 64),
];

/// `Err(Unsupported)` naming the subgroup feature: what an adapter without SUBGROUP must say.
fn assert_unsupported(result: wgpu_mha::Result<Vec<f32>>, label: &str) {
    match result {
        Err(Error::Unsupported { what, .. }) => {
            assert!(what.contains("SUBGROUP"), "{label}: {what}")
        }
        other => panic!(
            "{label}: expected Err(Unsupported), got {:?}",
            other.map(|v| v.len())
        ),
    }
}

#[test]
fn linear_subgroup_matches_f64_on_odd_shapes() {
    for (i, &(m, n, k)) in VEC4_SHAPES.iter().enumerate() {
        let x = rand(m * k, 110 + i as u64);
        let w = rand(n * k, 120 + i as u64);
        let b = rand(n, 130 + i as u64);
        for bias in [None, Some(b.as_slice())] {
            let label = format!("subgroup {m}x{n}x{k} bias={}", bias.is_some());
            let got = standalone::linear(
                gpu(),
                (&x, &w, bias),
                (m, n, k),
                LinearKernel::Variant(Subgroup),
            );
            if !gpu().has_subgroups() {
                assert_unsupported(got, &label);
                continue;
            }
            let want = matmul_nt(&x, &w, bias, m, n, k);
            let err = max_err(&got.expect(&label), &want);
            assert!(err <= tolerance(&want), "{label}: {err:.3e}");
        }
    }
}

#[test]
fn linear_variants_refuse_what_they_cannot_run() {
    // K % 4 != 0: both vec4 variants need whole vec4 rows. A clean Err, not a panic.
    let (x, w) = (rand(3 * 6, 1), rand(2 * 6, 2));
    for variant in [Vec4, Subgroup] {
        let result = standalone::linear(
            gpu(),
            (&x, &w, None),
            (3, 2, 6),
            LinearKernel::Variant(variant),
        );
        assert!(result.is_err(), "{variant:?} ran with K = 6");
    }
    let scalar = standalone::linear(
        gpu(),
        (&x, &w, None),
        (3, 2, 6),
        LinearKernel::Variant(Scalar),
    );
    let err = max_err(&scalar.expect("scalar"), &matmul_nt(&x, &w, None, 3, 2, 6));
    assert!(err <= 1e-5, "scalar {err:.3e}");
    if !gpu().has_subgroups() {
        let (x, w) = (rand(8 * 4, 3), rand(8 * 4, 4));
        let result = standalone::linear(
            gpu(),
            (&x, &w, None),
            (8, 8, 4),
            LinearKernel::Variant(Subgroup),
        );
        assert_unsupported(result, "subgroup without SUBGROUP");
    }
}

/// The auto choice: `Subgroup` only with SUBGROUP, with the kernels the policy names (CPU
/// kernels, on subgroups of 8 or more, where it was measured faster), and only where the vec4
/// precondition holds, like `Vec4`.
#[test]
fn linear_auto_choice_follows_the_policy() {
    let bound = BoundElems {
        x: 1 << 20,
        w: 1 << 20,
        bias: 1 << 10,
        y: 1 << 20,
    };
    let info = gpu().info();
    let subgroup_here = gpu().has_subgroups()
        && gpu().kernel_class() == wgpu_mha::KernelClass::Cpu
        && info.subgroup_min_size >= 8;
    assert_eq!(linear::subgroup_preferred(gpu()), subgroup_here);
    let fast = if subgroup_here { Subgroup } else { Vec4 };
    for (m, n, k, want) in [
        (130, 70, 36, fast),
        (1, 1, 4, fast),
        (130, 70, 6, Scalar),
        (4096, 4096, 4096, Scalar), // past the bound buffers: no in-range proof
    ] {
        let segment = Segment {
            heads: 1,
            head_dim: n,
            dst: 0,
        };
        let p = LinearParams::new(m, k, m, &[segment]);
        let got = linear::variant(gpu(), &p, &bound);
        assert_eq!(got, want, "{m}x{n}x{k} on {}", gpu().describe());
        if !gpu().has_subgroups() {
            assert_ne!(got, Subgroup);
        }
    }
}

/// f64 `x·wᵀ + b` scattered into head-split segments, one after another, each `[B, H, L, d]`.
fn head_split_f64(
    y: &[f64],
    batch: usize,
    seq_len: usize,
    segments: &[(usize, usize)],
) -> Vec<f64> {
    let rows = batch * seq_len;
    let n: usize = segments.iter().map(|&(h, d)| h * d).sum();
    let mut out = vec![f64::NAN; rows * n];
    let (mut col, mut dst) = (0, 0);
    for &(heads, d) in segments {
        for r in 0..rows {
            let (b, l) = (r / seq_len, r % seq_len);
            for c in 0..heads * d {
                let (head, e) = (c / d, c % d);
                out[dst + ((b * heads + head) * seq_len + l) * d + e] = y[r * n + col + c];
            }
        }
        col += heads * d;
        dst += rows * heads * d;
    }
    out
}

#[test]
fn linear_head_split_matches_f64_for_every_variant() {
    // Q | K | V segments of different widths (n = 68, off the 64-column tile), rows off the
    // 128-row tile, as a fused QKV projection writes them.
    for (batch, seq_len, k, segments) in [
        (2, 37, 24, vec![(3, 8), (2, 12), (1, 20)]),
        (3, 50, 16, vec![(4, 16), (4, 16)]),
        (1, 5, 8, vec![(2, 3)]),
    ] {
        let rows = batch * seq_len;
        let n: usize = segments.iter().map(|&(h, d)| h * d).sum();
        let x = rand(rows * k, 140);
        let w = rand(n * k, 150);
        let b = rand(n, 160);
        for bias in [None, Some(b.as_slice())] {
            let plain = matmul_nt(&x, &w, bias, rows, n, k);
            let want = head_split_f64(&plain, batch, seq_len, &segments);
            let tol = tolerance(&want);
            for variant in [None, Some(Scalar), Some(Vec4), Some(Subgroup)] {
                let label = format!(
                    "{variant:?} B{batch} L{seq_len} K{k} {segments:?} bias={}",
                    bias.is_some()
                );
                let split = HeadSplit {
                    seq_len,
                    segments: &segments,
                };
                let kernel = variant.map_or(LinearKernel::Auto, LinearKernel::Variant);
                let got =
                    standalone::linear_head_split(gpu(), (&x, &w, bias), (rows, k), split, kernel);
                if variant == Some(Subgroup) && !gpu().has_subgroups() {
                    assert_unsupported(got, &label);
                    continue;
                }
                let err = max_err(&got.expect(&label), &want);
                assert!(err <= tol, "{label}: {err:.3e}");
            }
        }
    }
}

#[test]
fn linear_rejects_bad_lengths() {
    assert!(standalone::linear(
        gpu(),
        (&[0.0; 5], &[0.0; 4], None),
        (2, 2, 2),
        LinearKernel::Auto
    )
    .is_err());
    assert!(standalone::linear(
        gpu(),
        (&[0.0; 4], &[0.0; 4], Some(&[0.0; 3])),
        (2, 2, 2),
        LinearKernel::Auto
    )
    .is_err());
    assert!(standalone::linear(gpu(), (&[], &[], None), (0, 2, 2), LinearKernel::Auto).is_err());
}

/// f64 attention core on head-split inputs: returns (masked scaled scores, probabilities,
/// combined output [B, Lq, H·dv]). `keep(b, h, i, j)` says whether a score survives.
fn core_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d: CoreDims,
    scale: f64,
    keep: &dyn Fn(usize, usize, usize, usize) -> bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (dk, dv) = (d.qk_head_dim, d.v_head_dim);
    let mut scores = vec![0.0; d.batch * d.heads * d.lq * d.lk];
    let mut probs = scores.clone();
    let mut out = vec![0.0; d.batch * d.lq * d.heads * dv];
    for b in 0..d.batch {
        for h in 0..d.heads {
            let z = b * d.heads + h;
            for i in 0..d.lq {
                let row = &mut scores[(z * d.lq + i) * d.lk..][..d.lk];
                for (j, s) in row.iter_mut().enumerate() {
                    let dot: f64 = (0..dk)
                        .map(|e| {
                            q[(z * d.lq + i) * dk + e] as f64 * k[(z * d.lk + j) * dk + e] as f64
                        })
                        .sum();
                    *s = if keep(b, h, i, j) { scale * dot } else { -1e9 };
                }
                let max = row.iter().cloned().fold(f64::MIN, f64::max);
                let sum: f64 = row.iter().map(|s| (s - max).exp()).sum();
                let p = &mut probs[(z * d.lq + i) * d.lk..][..d.lk];
                for (pj, s) in p.iter_mut().zip(row.iter()) {
                    *pj = (s - max).exp() / sum;
                }
                for e in 0..dv {
                    let acc: f64 = (0..d.lk)
                        .map(|j| p[j] * v[(z * d.lk + j) * dv + e] as f64)
                        .sum();
                    out[(b * d.lq + i) * d.heads * dv + h * dv + e] = acc;
                }
            }
        }
    }
    (scores, probs, out)
}

#[test]
fn attention_passes_match_f64() {
    for (n, dims) in [
        core_dims(2, 3, 5, 7, 8, 12),
        core_dims(1, 2, 70, 65, 16, 16),
        core_dims(1, 1, 1, 1, 3, 5),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 40 + 10 * n as u64;
        let q = rand(dims.batch * dims.heads * dims.lq * dims.qk_head_dim, seed);
        let k = rand(
            dims.batch * dims.heads * dims.lk * dims.qk_head_dim,
            seed + 1,
        );
        let v = rand(
            dims.batch * dims.heads * dims.lk * dims.v_head_dim,
            seed + 2,
        );
        let scale = 0.3;
        let (s_want, p_want, o_want) = core_f64(&q, &k, &v, dims, scale as f64, &|_, _, _, _| true);
        let s = standalone::core(gpu(), Core::Scores, (&q, &k, &[]), dims, scale, &Mask::None)
            .expect("scores");
        assert!(
            max_err(&s, &s_want) <= tolerance(&s_want),
            "scores {dims:?}"
        );
        let rows = dims.batch * dims.heads * dims.lq;
        let p = standalone::softmax(gpu(), &s, rows, dims.lk).expect("softmax");
        assert!(max_err(&p, &p_want) <= 1e-5, "softmax {dims:?}");
        let o = standalone::core(
            gpu(),
            Core::AvCombine,
            (&p, &[], &v),
            dims,
            1.0,
            &Mask::None,
        )
        .expect("av_combine");
        let tol = tolerance(&o_want);
        assert!(max_err(&o, &o_want) <= tol, "av_combine {dims:?}");
        for (name, got) in [
            (
                "flash",
                standalone::core(gpu(), Core::Fused, (&q, &k, &v), dims, scale, &Mask::None),
            ),
            (
                "multipass",
                standalone::core(
                    gpu(),
                    Core::MultiPass,
                    (&q, &k, &v),
                    dims,
                    scale,
                    &Mask::None,
                ),
            ),
            (
                "naive",
                standalone::core(gpu(), Core::Naive, (&q, &k, &v), dims, scale, &Mask::None),
            ),
        ] {
            let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
            let err = max_err(&got, &o_want);
            assert!(err <= tol, "{name} {dims:?}: {err:.3e} > {tol:.3e}");
        }
    }
}

#[test]
fn standalone_masks_follow_forward_semantics() {
    // A causal mask with Lq > Lk leaves the first rows fully masked: they average V.
    let dims = core_dims(1, 1, 4, 2, 4, 4);
    let q = rand(16, 1);
    let k = rand(8, 2);
    let v = rand(8, 3);
    let fused = standalone::core(gpu(), Core::Fused, (&q, &k, &v), dims, 0.5, &Mask::Causal)
        .expect("flash");
    let multi = standalone::core(
        gpu(),
        Core::MultiPass,
        (&q, &k, &v),
        dims,
        0.5,
        &Mask::Causal,
    )
    .expect("multi");
    let multi64: Vec<f64> = multi.iter().map(|&x| x as f64).collect();
    assert!(max_err(&fused, &multi64) <= 1e-6);
    for e in 0..4 {
        let mean = (v[e] + v[4 + e]) / 2.0;
        assert!((fused[e] - mean).abs() <= 1e-6, "row 0 is the mean of V");
    }
}

fn assert_close(label: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{label}: length");
    let err = max_err(got, want);
    let tol = tolerance(want);
    assert!(err <= tol, "{label}: max error {err:.3e} > {tol:.3e}");
}

/// Sizes for the masked tests: tile edges, Lq = 1, Lk = 1, dk ≠ dv.
fn dims() -> Vec<CoreDims> {
    vec![
        core_dims(2, 3, 7, 13, 24, 24),
        core_dims(1, 2, 70, 65, 16, 8),
        core_dims(3, 1, 1, 9, 5, 7),
        core_dims(1, 4, 12, 1, 64, 64),
    ]
}

fn inputs(d: &CoreDims) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let z = d.batch * d.heads;
    (
        rand(z * d.lq * d.qk_head_dim, 4),
        rand(z * d.lk * d.qk_head_dim, 5),
        rand(z * d.lk * d.v_head_dim, 6),
    )
}

/// Whether key j is visible to query i of (batch b, head h) under a mask.
type KeepRule = Box<dyn Fn(usize, usize, usize, usize) -> bool>;

/// Causal (bottom-right) and a random [B, Lq, Lk] block mask with its keep rule.
fn masks(d: &CoreDims) -> Vec<(Mask, KeepRule)> {
    let (lq, lk) = (d.lq, d.lk);
    let bytes: Vec<u8> = rand(d.batch * lq * lk, 7)
        .iter()
        .map(|&x| (x > 0.3) as u8)
        .collect();
    let blocked = bytes.clone();
    vec![
        (Mask::None, Box::new(|_, _, _, _| true)),
        (
            Mask::Causal,
            Box::new(move |_, _, i, j| j as i64 <= i as i64 + lk as i64 - lq as i64),
        ),
        (
            Mask::Block(MaskTensor::new([d.batch, lq, lk], bytes).unwrap()),
            Box::new(move |b, _, i, j| blocked[(b * lq + i) * lk + j] == 0),
        ),
    ]
}

#[test]
fn scores_matches_f64_with_masks() {
    for d in dims() {
        let (q, k, _) = inputs(&d);
        let scale = 1.0 / (d.qk_head_dim as f64).sqrt();
        for (mask, keep) in masks(&d) {
            let (want, _, _) = core_f64(
                &q,
                &k,
                &[0.0; 0],
                CoreDims { v_head_dim: 0, ..d },
                scale,
                &*keep,
            );
            let got = standalone::core(
                common::gpu(),
                Core::Scores,
                (&q, &k, &[]),
                d,
                scale as f32,
                &mask,
            )
            .unwrap();
            assert_close(&format!("scores {d:?} {}", mask.kind_name()), &got, &want);
        }
    }
}

#[test]
fn softmax_matches_f64_including_masked_and_large_rows() {
    for (rows, cols) in [(5, 7), (3, 300), (2, 1), (70, 65)] {
        let mut s = rand(rows * cols, 8);
        s.iter_mut().enumerate().for_each(|(e, v)| {
            if e % 5 == 0 {
                *v = -1e9; // masked entries
            } else if e % 7 == 0 {
                *v *= 80.0; // large scores: the max subtraction matters
            }
        });
        // Row 0 fully masked: uniform.
        s[..cols].iter_mut().for_each(|v| *v = -1e9);
        let want: Vec<f64> = s
            .chunks(cols)
            .flat_map(|row| {
                let max = row.iter().map(|&x| x as f64).fold(f64::MIN, f64::max);
                let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
                row.iter()
                    .map(move |&x| (x as f64 - max).exp() / sum)
                    .collect::<Vec<_>>()
            })
            .collect();
        let got = standalone::softmax(common::gpu(), &s, rows, cols).unwrap();
        assert_close(&format!("softmax {rows}x{cols}"), &got, &want);
    }
}

#[test]
fn flash_and_multipass_cores_match_f64_with_masks() {
    for d in dims() {
        let (q, k, v) = inputs(&d);
        let scale = 1.0 / (d.qk_head_dim as f64).sqrt();
        for (mask, keep) in masks(&d) {
            let (_, _, want) = core_f64(&q, &k, &v, d, scale, &*keep);
            let label = format!("{d:?} {}", mask.kind_name());
            for core in [Core::Fused, Core::MultiPass] {
                let got =
                    standalone::core(common::gpu(), core, (&q, &k, &v), d, scale as f32, &mask);
                assert_close(&format!("{core:?} {label}"), &got.unwrap(), &want);
            }
        }
    }
}
