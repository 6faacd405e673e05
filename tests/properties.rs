//! Property tests. Valid random problems (sizes 1–64, heads 1–8, Lq/Lk 1–48, every mask kind,
//! both module shapes, both paths) match the f64 reference; random invalid inputs return
//! `Err` and never panic.
//!
//! Case counts: 300 valid problems and 1,200 invalid inputs; `PROPTEST_CASES` overrides both.
//! The valid problems draw their module from 32 random configurations (embedding widths 1–64,
//! heads 1–8, both shapes, drawn once from a seeded generator) and everything else — batch,
//! Lq, Lk, mask, path, data — per case. Head sizes come from a small fixed set
//! ([`CLASSIC_HEAD_DIMS`], [`PER_HEAD_DIMS`]): they select the fused and decode shaders'
//! specialisations, and a software adapter spends seconds compiling each new one (about
//! 300 s on lavapipe and 1,500 s on GL for this file when every configuration had its own), so
//! the set covers what the kernels treat differently — under one vec4, ragged vec4s, aligned,
//! q/k narrower and wider than v — and no more. Modules are built once per configuration.

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Error, ForwardOptions, Mask,
    MaskTensor, MultiHeadAttention, Tensor,
};

/// A runner of `default` cases (`PROPTEST_CASES` overrides), persisting no failures.
fn runner(default: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

#[derive(Debug, Clone)]
struct Problem {
    config: AttentionConfig,
    batch: usize,
    lq: usize,
    lk: usize,
    mask: Mask,
    fused: bool,
    seed: u64,
}

/// Classic head sizes (`d_k`, for queries, keys and values): under one vec4, ragged, aligned.
const CLASSIC_HEAD_DIMS: [usize; 3] = [1, 3, 8];

/// Per-head `(q_k_size, v_size)`: q/k wider than v, both ragged, equal and aligned, v wider.
const PER_HEAD_DIMS: [(usize, usize); 4] = [(2, 1), (5, 13), (16, 16), (24, 64)];

/// 32 random configurations: half classic (heads 1–8), half per-head (embedding 1–64, heads
/// 1–8), head sizes from the fixed sets above.
fn config_pool() -> Vec<AttentionConfig> {
    let mut rng = wgpu_mha::model::weights::SplitMix64::new(2026);
    let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
    (0..32)
        .map(|i| {
            let heads = 1 + pick(8);
            if i % 2 == 0 {
                let dk = CLASSIC_HEAD_DIMS[pick(CLASSIC_HEAD_DIMS.len())];
                AttentionConfig::classic(heads * dk, heads).unwrap()
            } else {
                let (qk, v) = PER_HEAD_DIMS[pick(PER_HEAD_DIMS.len())];
                AttentionConfig::per_head(1 + pick(64), qk, v, heads).unwrap()
            }
        })
        .collect()
}

/// The pool is drawn at random: make sure the draw left no head size of the sets out.
#[test]
fn the_config_pool_covers_every_head_size() {
    let pool = config_pool();
    for dk in CLASSIC_HEAD_DIMS {
        assert!(
            pool.iter()
                .any(|c| c.output_projection && c.qk_head_dim == dk && c.v_head_dim == dk),
            "no classic configuration of d_k {dk}"
        );
    }
    for (qk, v) in PER_HEAD_DIMS {
        assert!(
            pool.iter()
                .any(|c| !c.output_projection && c.qk_head_dim == qk && c.v_head_dim == v),
            "no per-head configuration of q_k {qk}, v {v}"
        );
    }
}

fn config_strategy() -> impl Strategy<Value = AttentionConfig> {
    proptest::sample::select(config_pool())
}

/// A mask of a random kind that fits (B, H, Lq, Lk).
fn mask_strategy(b: usize, h: usize, lq: usize, lk: usize) -> BoxedStrategy<Mask> {
    let shapes = vec![
        vec![b, h, lq, lk],
        vec![b, 1, lq, lk],
        vec![b, 1, 1, lk],
        vec![1, 1, lq, lk],
        vec![b, lq, lk],
        vec![lq, lk],
        vec![lk],
    ];
    let shape = proptest::sample::select(shapes);
    prop_oneof![
        Just(Mask::None),
        Just(Mask::Causal),
        proptest::collection::vec(0..=lk, b).prop_map(Mask::KeyPadding),
        (shape.clone(), any::<u64>()).prop_map(|(s, seed)| {
            let n: usize = s.iter().product();
            let data = Tensor::random([n], seed)
                .data()
                .iter()
                .map(|&x| (x > -0.4) as u8)
                .collect();
            Mask::Attend(MaskTensor::new(s, data).unwrap())
        }),
        (shape.clone(), any::<u64>()).prop_map(|(s, seed)| {
            let n: usize = s.iter().product();
            let data = Tensor::random([n], seed)
                .data()
                .iter()
                .map(|&x| (x > 0.4) as u8)
                .collect();
            Mask::Block(MaskTensor::new(s, data).unwrap())
        }),
        (shape, any::<u64>()).prop_map(|(s, seed)| Mask::Bias(Tensor::random(s, seed).scaled(2.0))),
    ]
    .boxed()
}

fn problem_strategy() -> impl Strategy<Value = Problem> {
    (
        config_strategy(),
        1usize..=3,
        1usize..=48,
        1usize..=48,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_flat_map(|(config, batch, lq, lk, fused, seed)| {
            mask_strategy(batch, config.heads, lq, lk).prop_map(move |mask| Problem {
                config,
                batch,
                lq,
                lk,
                mask,
                fused,
                seed,
            })
        })
}

#[test]
fn random_valid_problems_match_the_reference() {
    // (TestRunner takes an `Fn`: the cache lives behind a RefCell.)
    let modules: std::cell::RefCell<Vec<(AttentionConfig, AttentionWeights, MultiHeadAttention)>> =
        Default::default();
    runner(300)
        .run(&problem_strategy(), |p| {
            let c = p.config;
            if !modules.borrow().iter().any(|(mc, _, _)| *mc == c) {
                let weights = AttentionWeights::random(&c, p.seed);
                let mha = MultiHeadAttention::new(common::gpu(), c, &weights)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                modules.borrow_mut().push((c, weights, mha));
            }
            let modules = modules.borrow();
            let Some((_, weights, mha)) = modules.iter().find(|(mc, _, _)| *mc == c) else {
                return Err(TestCaseError::fail("module cache"));
            };
            let q = Tensor::random([p.batch, p.lq, c.model_dim], p.seed ^ 1);
            let kv = Tensor::random([p.batch, p.lk, c.key_dim], p.seed ^ 2);
            let path = if p.fused {
                AttentionPath::Fused
            } else {
                AttentionPath::MultiPass
            };
            let got = mha
                .forward_with(&q, &kv, &kv, &p.mask, &common::options(path, false))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = reference::forward(&c, weights, &q, &kv, &kv, &p.mask)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let err = common::max_err(got.output.data(), &want.output);
            prop_assert!(
                err <= common::tolerance(&want.output),
                "error {err:.3e} on {p:?}"
            );
            Ok(())
        })
        .unwrap();
}

/// One kind of invalid input per variant; each must give `Err`, never a panic.
#[derive(Debug, Clone)]
enum Bad {
    /// Config numbers, possibly invalid (0, non-divisible).
    Config {
        d: usize,
        h: usize,
        e: usize,
        qk: usize,
        v: usize,
    },
    /// Input tensors of random (mostly wrong) shapes.
    Shapes {
        q: Vec<usize>,
        k: Vec<usize>,
        v: Vec<usize>,
    },
    /// A tensor mask of a random (mostly wrong) shape.
    MaskShape { shape: Vec<usize>, block: bool },
    /// Key padding of random length/values.
    Padding { lens: Vec<usize> },
    /// A weight matrix of a random shape.
    WeightShape {
        which: usize,
        rows: usize,
        cols: usize,
    },
}

fn bad_strategy() -> impl Strategy<Value = Bad> {
    let dims = || proptest::collection::vec(0usize..=9, 0..=5);
    prop_oneof![
        (0usize..=40, 0usize..=9, 0usize..=20, 0usize..=9, 0usize..=9)
            .prop_map(|(d, h, e, qk, v)| Bad::Config { d, h, e, qk, v }),
        (dims(), dims(), dims()).prop_map(|(q, k, v)| Bad::Shapes { q, k, v }),
        (dims(), any::<bool>()).prop_map(|(shape, block)| Bad::MaskShape { shape, block }),
        proptest::collection::vec(0usize..=12, 0..=4).prop_map(|lens| Bad::Padding { lens }),
        (0usize..4, 0usize..=20, 0usize..=20).prop_map(|(which, rows, cols)| Bad::WeightShape {
            which,
            rows,
            cols
        }),
    ]
}

#[test]
fn random_invalid_inputs_are_errors_not_panics() {
    // A fixed module (classic d 8, 2 heads) and a valid baseline problem [2, 4, 8].
    let config = AttentionConfig::classic(8, 2).unwrap();
    let (weights, mha) = common::module(config, 3);
    let x = Tensor::random([2, 4, 8], 1);
    runner(1200)
        .run(&bad_strategy(), |bad| {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                || -> Result<bool, Error> {
                    match &bad {
                        Bad::Config { d, h, e, qk, v } => {
                            let classic_ok = *d > 0 && *h > 0 && d % h == 0;
                            prop_assert_eq_result(
                                AttentionConfig::classic(*d, *h).is_ok(),
                                classic_ok,
                            )?;
                            let per_head_ok = *e > 0 && *qk > 0 && *v > 0 && *h > 0;
                            prop_assert_eq_result(
                                AttentionConfig::per_head(*e, *qk, *v, *h).is_ok(),
                                per_head_ok,
                            )?;
                            Ok(true)
                        }
                        Bad::Shapes { q, k, v } => {
                            let t = |s: &Vec<usize>| Tensor::zeros(s.clone());
                            let valid = q.len() == 3
                                && k.len() == 3
                                && v.len() == 3
                                && q[2] == 8
                                && k[2] == 8
                                && v[2] == 8
                                && k[0] == q[0]
                                && v[0] == q[0]
                                && v[1] == k[1];
                            let r = mha.forward(&t(q), &t(k), &t(v), &Mask::None);
                            Ok(r.is_ok() == valid)
                        }
                        Bad::MaskShape { shape, block } => {
                            let n = shape.iter().product();
                            let m = MaskTensor::new(shape.clone(), vec![1; n])?;
                            let mask = if *block {
                                Mask::Block(m)
                            } else {
                                Mask::Attend(m)
                            };
                            let full = [2usize, 2, 4, 4];
                            let offset = 4 - shape.len().min(4);
                            let axes: Vec<usize> = match shape.len() {
                                3 => vec![0, 2, 3],
                                _ => (offset..4).collect(),
                            };
                            let valid = (1..=4).contains(&shape.len())
                                && shape
                                    .iter()
                                    .zip(&axes)
                                    .all(|(&n, &a)| n == 1 || n == full[a]);
                            let r = mha.forward(&x, &x, &x, &mask);
                            Ok(r.is_ok() == valid)
                        }
                        Bad::Padding { lens } => {
                            let valid = lens.len() == 2 && lens.iter().all(|&l| l <= 4);
                            let r = mha.forward(&x, &x, &x, &Mask::KeyPadding(lens.clone()));
                            Ok(r.is_ok() == valid)
                        }
                        Bad::WeightShape { which, rows, cols } => {
                            let mut w = weights.clone();
                            let layer = match which {
                                0 => &mut w.q,
                                1 => &mut w.k,
                                2 => &mut w.v,
                                _ => w.o.as_mut().unwrap(),
                            };
                            *layer = wgpu_mha::Linear {
                                out_features: *rows,
                                in_features: *cols,
                                weight: vec![0.0; rows * cols],
                                bias: Some(vec![0.0; *rows]),
                            };
                            let valid = *rows == 8 && *cols == 8;
                            Ok(MultiHeadAttention::new(common::gpu(), config, &w).is_ok() == valid)
                        }
                    }
                },
            ));
            match outcome {
                Err(_) => Err(TestCaseError::fail(format!("panicked on {bad:?}"))),
                Ok(Err(e)) => Err(TestCaseError::fail(format!(
                    "unexpected error on {bad:?}: {e}"
                ))),
                Ok(Ok(consistent)) => {
                    prop_assert!(
                        consistent,
                        "accepted an invalid input or rejected a valid one: {bad:?}"
                    );
                    Ok(())
                }
            }
        })
        .unwrap();
}

fn prop_assert_eq_result(got: bool, want: bool) -> Result<(), Error> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Config(format!("validity {got}, expected {want}")))
    }
}

/// Corrupted and truncated safetensors files (a case file and a weights file, cut at random
/// points or with random bytes overwritten, header included) never panic: reading them is
/// `Err`, or — when only tensor data changed — a case that still runs without panicking.
/// 1,000 files by default.
#[test]
fn corrupted_and_truncated_files_never_panic() {
    let case = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/classic_b2_lq3_lk5_d24_h3_headmask.safetensors"
    ))
    .unwrap();
    let weights = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/weights/mha_separate_e32_h4_k20_v12.safetensors"
    ))
    .unwrap();
    let strategy = (
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        any::<prop::sample::Index>(),
    );
    runner(1000)
        .run(&strategy, |(use_case, truncate, flips, cut)| {
            let mut bytes = if use_case {
                case.clone()
            } else {
                weights.clone()
            };
            // Bias the damage towards the JSON header, where parsing happens.
            let header_len = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            for (at, value) in &flips {
                let pos = if at.index(2) == 0 {
                    at.index(header_len)
                } else {
                    at.index(bytes.len())
                };
                bytes[pos] = *value;
            }
            if truncate {
                bytes.truncate(cut.index(bytes.len()));
            }
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if use_case {
                    if let Ok(case) = wgpu_mha::Case::from_bytes("fuzzed", bytes.clone()) {
                        let _ = case.run(common::gpu(), &ForwardOptions::default());
                    }
                } else {
                    let _ = AttentionWeights::from_safetensors_bytes(&bytes, "", None);
                }
            }));
            prop_assert!(
                outcome.is_ok(),
                "panicked on a damaged file (flips {flips:?}, truncate {truncate})"
            );
            Ok(())
        })
        .unwrap();
}
