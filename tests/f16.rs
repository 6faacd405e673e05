//! `Precision::F16`: f16 weights and f16 Q/K/V with f32 accumulation on the fused path.
//!
//! Skip-free on every adapter: with `SHADER_F16` (lavapipe) the f16 module matches the f64
//! reference within 2e-2·(1 + max|ref|) and differs from the f32 module (so f16 really ran);
//! without it (GL) `F16` is `Err(Unsupported)` and `PreferF16` runs f32 at the f32 tolerance.

mod common;

use common::{
    assert_close, assert_within, bits, gpu, module, options, relative_tolerance, Problem as Case,
};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Error, GpuTensor, KvCache, Mask,
    MultiHeadAttention, Precision, Tensor,
};

fn cases() -> Vec<Case> {
    let classic = |d, h| AttentionConfig::classic(d, h).expect("config");
    let per_head = |e, qk, v, h| AttentionConfig::per_head(e, qk, v, h).expect("config");
    vec![
        Case {
            label: "classic d=96 h=4 (head 24) causal self-attention",
            config: classic(96, 4),
            batch: 2,
            lq: 9,
            lk: 9,
            mask: Mask::Causal,
            self_attention: true,
        },
        Case {
            label: "classic d=32 h=4 key padding cross",
            config: classic(32, 4),
            batch: 2,
            lq: 5,
            lk: 7,
            mask: Mask::KeyPadding(vec![4, 7]),
            self_attention: false,
        },
        Case {
            label: "classic d=28 h=4 (head 7) block mask",
            config: classic(28, 4),
            batch: 2,
            lq: 6,
            lk: 5,
            mask: Mask::block([2, 6, 5], &bits(60, 3)).expect("mask"),
            self_attention: false,
        },
        Case {
            label: "per-head qk 7 v 7 h 3 causal Lq<Lk",
            config: per_head(24, 7, 7, 3),
            batch: 2,
            lq: 4,
            lk: 9,
            mask: Mask::Causal,
            self_attention: false,
        },
        Case {
            label: "per-head qk 24 v 10 h 2 key padding self-attention",
            config: per_head(20, 24, 10, 2),
            batch: 2,
            lq: 8,
            lk: 8,
            mask: Mask::KeyPadding(vec![8, 3]),
            self_attention: true,
        },
        Case {
            label: "per-head qk 6 v 24 h 4 block mask",
            config: per_head(32, 6, 24, 4),
            batch: 3,
            lq: 5,
            lk: 6,
            mask: Mask::block([5, 6], &bits(30, 7)).expect("mask"),
            self_attention: false,
        },
        Case {
            label: "classic d=32 h=2 none, 70 keys (several tiles)",
            config: classic(32, 2),
            batch: 1,
            lq: 3,
            lk: 70,
            mask: Mask::None,
            self_attention: false,
        },
        Case {
            // Long enough that a CPU adapter splits the fused pass into key ranges (f32 carry).
            label: "classic d=32 h=2 causal, 1600 keys (split key ranges)",
            config: classic(32, 2),
            batch: 1,
            lq: 3,
            lk: 1600,
            mask: Mask::Causal,
            self_attention: false,
        },
    ]
}

/// Runs one case on a module of `precision`; returns (output, f64 reference).
fn run(case: &Case, precision: Precision) -> (MultiHeadAttention, Tensor, Vec<f64>) {
    let c = &case.config;
    let weights = AttentionWeights::random(c, 42);
    let mha = MultiHeadAttention::with_precision(gpu(), *c, &weights, precision)
        .unwrap_or_else(|e| panic!("{}: module: {e}", case.label));
    let q = Tensor::random([case.batch, case.lq, c.model_dim], 1);
    let (got, want) = if case.self_attention {
        assert_eq!(case.lq, case.lk);
        let got = mha.forward(&q, &q, &q, &case.mask);
        let want = reference::forward(c, &weights, &q, &q, &q, &case.mask);
        (got, want)
    } else {
        let k = Tensor::random([case.batch, case.lk, c.key_dim], 2);
        let v = Tensor::random([case.batch, case.lk, c.value_dim], 3);
        let got = mha.forward(&q, &k, &v, &case.mask);
        let want = reference::forward(c, &weights, &q, &k, &v, &case.mask);
        (got, want)
    };
    let got = got.unwrap_or_else(|e| panic!("{}: forward: {e}", case.label));
    let want = want.expect("reference");
    assert_eq!(got.shape(), want.shape.as_slice(), "{}: shape", case.label);
    (mha, got, want.output)
}

fn f16_tolerance(reference: &[f64]) -> f64 {
    relative_tolerance(2e-2, reference)
}

#[test]
fn f16_matches_the_reference_or_is_refused_cleanly() {
    let gpu = gpu();
    let cases = cases();
    assert!(cases.len() >= 6);
    if gpu.has_f16() {
        for case in &cases {
            let (mha, got, want) = run(case, Precision::F16);
            assert_eq!(mha.precision(), Precision::F16, "{}", case.label);
            let tol = f16_tolerance(&want);
            let err = assert_within(&format!("{}: f16", case.label), got.data(), &want, tol);
            eprintln!(
                "{}: f16 max error {err:.3e} (tolerance {tol:.3e})",
                case.label
            );
            let (_, f32_out, _) = run(case, Precision::F32);
            assert_ne!(
                got.data(),
                f32_out.data(),
                "{}: f16 output is bit-identical to f32 (f16 did not run)",
                case.label
            );
            // PreferF16 picks f16 here, with the same result.
            let (prefer, prefer_out, _) = run(case, Precision::PreferF16);
            assert_eq!(prefer.precision(), Precision::F16);
            assert_eq!(prefer_out.data(), got.data(), "{}", case.label);
        }
    } else {
        for case in &cases {
            let weights = AttentionWeights::random(&case.config, 42);
            match MultiHeadAttention::with_precision(gpu, case.config, &weights, Precision::F16) {
                Err(Error::Unsupported { what, .. }) => {
                    assert!(what.contains("f16"), "{}: {what}", case.label)
                }
                Err(e) => panic!("{}: expected Unsupported, got {e}", case.label),
                Ok(_) => panic!("{}: F16 built without SHADER_F16", case.label),
            }
            let (mha, got, want) = run(case, Precision::PreferF16);
            assert_eq!(mha.precision(), Precision::F32, "{}", case.label);
            eprintln!("{}: no SHADER_F16, PreferF16 ran f32", case.label);
            assert_close(&format!("{}: f32 fallback", case.label), got.data(), &want);
        }
    }
}

#[test]
fn new_is_f32() {
    let config = AttentionConfig::classic(32, 4).expect("config");
    let (_, mha) = module(config, 1);
    assert_eq!(mha.precision(), Precision::F32);
    assert_eq!(Precision::default(), Precision::F32);
}

/// What an f16 module refuses: the multi-pass path (a forward's or a KV cache's); the GPU-tensor
/// forward runs.
#[test]
fn f16_module_limits() {
    let gpu = gpu();
    if !gpu.has_f16() {
        return f16_is_refused_without_shader_f16();
    }
    let config = AttentionConfig::classic(32, 4).expect("config");
    let weights = AttentionWeights::random(&config, 5);
    let mha =
        MultiHeadAttention::with_precision(gpu, config, &weights, Precision::F16).expect("module");
    let x = Tensor::random([2, 6, 32], 9);
    for options in [
        options(AttentionPath::Auto, true),
        options(AttentionPath::MultiPass, false),
    ] {
        match mha.forward_with(&x, &x, &x, &Mask::Causal, &options) {
            Err(Error::Unsupported { what, .. }) => assert!(what.contains("f16"), "{what}"),
            other => panic!(
                "{options:?}: expected Unsupported, got {:?}",
                other.map(|o| o.path)
            ),
        }
    }
    match KvCache::with_path(&mha, 1, 8, AttentionPath::MultiPass) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("f16"), "{what}"),
        other => panic!("KV cache: expected Unsupported, got {:?}", other.err()),
    }
    // The fused cache holds f16 keys and values (tests/decode.rs checks its steps).
    assert!(KvCache::new(&mha, 1, 8).is_ok());
    // forward_gpu runs the same f16 passes.
    let host = mha.forward(&x, &x, &x, &Mask::Causal).expect("forward");
    let xg = GpuTensor::upload(gpu, &x).expect("upload");
    let dev = mha
        .forward_gpu(&xg, &xg, &xg, &Mask::Causal)
        .expect("forward_gpu");
    let dev: Tensor = dev.read(gpu).expect("read");
    assert_eq!(dev.data(), host.data());
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).expect("reference");
    assert_within(
        "f16 module",
        host.data(),
        &want.output,
        f16_tolerance(&want.output),
    );
}

fn f16_is_refused_without_shader_f16() {
    let config = AttentionConfig::per_head(16, 8, 8, 2).expect("config");
    let weights = AttentionWeights::random(&config, 5);
    assert!(matches!(
        MultiHeadAttention::with_precision(gpu(), config, &weights, Precision::F16),
        Err(Error::Unsupported { .. })
    ));
}
