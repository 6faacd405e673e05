//! The standalone per-pass runners (`wgpu_mha::kernels::standalone`) against plain f64 math,
//! including sizes that hit every edge of the tiles and both `linear` variants (K % 4 == 0
//! selects the vec4 one).

mod common;

use common::{gpu, max_err, tolerance};
use wgpu_mha::kernels::standalone::{self, CoreDims};
use wgpu_mha::{Mask, Tensor};

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
    // (m, n, k): scalar variant (k % 4 != 0) and vec4 variant, partial and multiple tiles.
    for (i, &(m, n, k)) in [
        (1, 1, 1),
        (3, 5, 7),
        (130, 70, 36),
        (129, 65, 8),
        (64, 64, 64),
        (200, 136, 20),
        (17, 9, 4),
    ]
    .iter()
    .enumerate()
    {
        let x = rand(m * k, 10 + i as u64);
        let w = rand(n * k, 20 + i as u64);
        let b = rand(n, 30 + i as u64);
        for bias in [None, Some(b.as_slice())] {
            let want = matmul_nt(&x, &w, bias, m, n, k);
            let tol = tolerance(&want);
            let got = standalone::linear(gpu(), &x, &w, bias, m, n, k).expect("linear");
            let err = max_err(&got, &want);
            assert!(
                err <= tol,
                "linear {m}x{n}x{k} bias={}: {err:.3e}",
                bias.is_some()
            );
            let naive = standalone::linear_naive(gpu(), &x, &w, bias, m, n, k).expect("naive");
            let err = max_err(&naive, &want);
            assert!(err <= tol, "linear_naive {m}x{n}x{k}: {err:.3e}");
        }
    }
}

#[test]
fn linear_rejects_bad_lengths() {
    assert!(standalone::linear(gpu(), &[0.0; 5], &[0.0; 4], None, 2, 2, 2).is_err());
    assert!(standalone::linear(gpu(), &[0.0; 4], &[0.0; 4], Some(&[0.0; 3]), 2, 2, 2).is_err());
    assert!(standalone::linear(gpu(), &[], &[], None, 0, 2, 2).is_err());
}

/// Head-split attention core in f64: `[B, Lq, H·dv]`.
fn core_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d: CoreDims,
    scale: f32,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (dk, dv) = (d.qk_head_dim, d.v_head_dim);
    let mut scores = vec![0.0; d.batch * d.heads * d.lq * d.lk];
    let mut probs = scores.clone();
    let mut out = vec![0.0; d.batch * d.lq * d.heads * dv];
    for z in 0..d.batch * d.heads {
        let (b, h) = (z / d.heads, z % d.heads);
        for i in 0..d.lq {
            let row = &mut scores[(z * d.lq + i) * d.lk..][..d.lk];
            for (j, s) in row.iter_mut().enumerate() {
                let dot: f64 = (0..dk)
                    .map(|e| q[(z * d.lq + i) * dk + e] as f64 * k[(z * d.lk + j) * dk + e] as f64)
                    .sum();
                *s = dot * scale as f64;
            }
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|s| (s - m).exp()).sum();
            let p = &mut probs[(z * d.lq + i) * d.lk..][..d.lk];
            for (pj, s) in p.iter_mut().zip(row.iter()) {
                *pj = (s - m).exp() / sum;
            }
            for e in 0..dv {
                let acc: f64 = (0..d.lk)
                    .map(|j| p[j] * v[(z * d.lk + j) * dv + e] as f64)
                    .sum();
                out[(b * d.lq + i) * d.heads * dv + h * dv + e] = acc;
            }
        }
    }
    (scores, probs, out)
}

#[test]
fn attention_passes_match_f64() {
    for (n, dims) in [
        CoreDims {
            batch: 2,
            heads: 3,
            lq: 5,
            lk: 7,
            qk_head_dim: 8,
            v_head_dim: 12,
        },
        CoreDims {
            batch: 1,
            heads: 2,
            lq: 70,
            lk: 65,
            qk_head_dim: 16,
            v_head_dim: 16,
        },
        CoreDims {
            batch: 1,
            heads: 1,
            lq: 1,
            lk: 1,
            qk_head_dim: 3,
            v_head_dim: 5,
        },
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
        let (s_want, p_want, o_want) = core_f64(&q, &k, &v, dims, scale);
        let s = standalone::scores(gpu(), &q, &k, dims, scale, &Mask::None).expect("scores");
        assert!(
            max_err(&s, &s_want) <= tolerance(&s_want),
            "scores {dims:?}"
        );
        let rows = dims.batch * dims.heads * dims.lq;
        let p = standalone::softmax(gpu(), &s, rows, dims.lk).expect("softmax");
        assert!(max_err(&p, &p_want) <= 1e-5, "softmax {dims:?}");
        let o = standalone::av_combine(gpu(), &p, &v, dims).expect("av_combine");
        let tol = tolerance(&o_want);
        assert!(max_err(&o, &o_want) <= tol, "av_combine {dims:?}");
        for (name, got) in [
            (
                "flash",
                standalone::flash_attention(gpu(), &q, &k, &v, dims, scale, &Mask::None),
            ),
            (
                "multipass",
                standalone::attention_multipass(gpu(), &q, &k, &v, dims, scale, &Mask::None),
            ),
            (
                "naive",
                standalone::attention_naive(gpu(), &q, &k, &v, dims, scale),
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
    let dims = CoreDims {
        batch: 1,
        heads: 1,
        lq: 4,
        lk: 2,
        qk_head_dim: 4,
        v_head_dim: 4,
    };
    let q = rand(16, 1);
    let k = rand(8, 2);
    let v = rand(8, 3);
    let fused =
        standalone::flash_attention(gpu(), &q, &k, &v, dims, 0.5, &Mask::Causal).expect("flash");
    let multi = standalone::attention_multipass(gpu(), &q, &k, &v, dims, 0.5, &Mask::Causal)
        .expect("multi");
    let multi64: Vec<f64> = multi.iter().map(|&x| x as f64).collect();
    assert!(max_err(&fused, &multi64) <= 1e-6);
    for e in 0..4 {
        let mean = (v[e] + v[4 + e]) / 2.0;
        assert!((fused[e] - mean).abs() <= 1e-6, "row 0 is the mean of V");
    }
}
