//! Shared test helpers: one GPU per test binary, and the comparisons every test uses.
#![allow(dead_code)]

pub mod engine;
pub mod hf_dirs;

use std::sync::OnceLock;

use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, ForwardOptions, Gpu, Mask,
    MultiHeadAttention, Tensor,
};

/// The test GPU (WGPU_BACKEND / WGPU_ADAPTER_NAME honoured). No adapter is a failure, never a
/// silent skip: the message says how to get a software Vulkan device.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new() {
        Ok(gpu) => gpu,
        Err(e) => panic!("GPU tests need an adapter: {e}"),
    })
}

/// A module of `config` on the test GPU with seeded random weights (the weights come back too,
/// for the reference).
pub fn module(config: AttentionConfig, seed: u64) -> (AttentionWeights, MultiHeadAttention) {
    let weights = AttentionWeights::random(&config, seed);
    let mha = MultiHeadAttention::new(gpu(), config, &weights)
        .unwrap_or_else(|e| panic!("module for {config:?}: {e}"));
    (weights, mha)
}

/// Both attention paths, for tests that must hold on each.
pub const BOTH_PATHS: [AttentionPath; 2] = [AttentionPath::MultiPass, AttentionPath::Fused];

/// Forward options: `path`, and whether the probabilities come back.
pub fn options(path: AttentionPath, return_probs: bool) -> ForwardOptions {
    ForwardOptions {
        return_probs,
        path,
        positions: None,
    }
}

/// `relative`·(1 + max|ref|). NaN in the reference is passed over here: it makes the error NaN.
pub fn relative_tolerance(relative: f64, reference: &[f64]) -> f64 {
    relative * (1.0 + reference.iter().fold(0.0f64, |m, v| m.max(v.abs())))
}

/// The tolerance: max abs error ≤ 1e-5·(1 + max|ref|).
pub fn tolerance(reference: &[f64]) -> f64 {
    relative_tolerance(1e-5, reference)
}

/// The largest of `diffs`, NaN if any is NaN (`f64::max` alone would skip a NaN).
fn nan_max(diffs: impl Iterator<Item = f64>) -> f64 {
    diffs.fold(0.0, |m: f64, d| {
        if d.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(d)
        }
    })
}

/// max |got − want| (NaN if anything is NaN).
pub fn max_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    nan_max(got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()))
}

/// max |a − b| of two f64 slices (NaN if anything is NaN).
pub fn max_err_f64(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    nan_max(a.iter().zip(b).map(|(x, y)| (x - y).abs()))
}

/// Asserts max |got − want| ≤ `tol` (a NaN anywhere fails); returns the error.
pub fn assert_within(label: &str, got: &[f32], want: &[f64], tol: f64) -> f64 {
    let err = max_err(got, want);
    assert!(err <= tol, "{label}: max error {err:.3e} > {tol:.3e}");
    err
}

/// Asserts `got` matches the f64 reference `want` within [`tolerance`]; returns the error.
pub fn assert_close(label: &str, got: &[f32], want: &[f64]) -> f64 {
    assert_within(label, got, want, tolerance(want))
}

/// One forward problem of a table-driven test.
pub struct Problem {
    pub label: &'static str,
    pub config: AttentionConfig,
    pub batch: usize,
    pub lq: usize,
    pub lk: usize,
    pub mask: Mask,
    /// Query = key = value (one fused QKV GEMM).
    pub self_attention: bool,
}

/// Deterministic pseudo-random bits (xorshift; about one in three set).
pub fn bits(len: usize, seed: u64) -> Vec<bool> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s.is_multiple_of(3)
        })
        .collect()
}

/// Runs one problem on the GPU with `options` and checks output (and probabilities when
/// requested) against the f64 reference. Returns the output error.
pub fn check_against_reference(
    label: &str,
    config: AttentionConfig,
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    mask: &Mask,
    options: &ForwardOptions,
) -> f64 {
    let (weights, mha) = module(config, 42);
    let got = mha
        .forward_with(query, key, value, mask, options)
        .unwrap_or_else(|e| panic!("{label}: forward failed: {e}"));
    let want = reference::forward(&config, &weights, query, key, value, mask).expect("reference");
    assert_eq!(
        got.output.shape(),
        want.shape.as_slice(),
        "{label}: output shape"
    );
    let err = assert_close(
        &format!("{label} ({:?} path)", got.path),
        got.output.data(),
        &want.output,
    );
    if let Some(probs) = &got.probs {
        assert_within(
            &format!("{label}: probabilities"),
            probs.data(),
            &want.probs,
            1e-5,
        );
    }
    err
}

/// Runs the `wgpu-mha` binary; returns its exit code and stdout + stderr.
pub fn cli(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgpu-mha"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The `.safetensors` files of `tests/fixtures/<dir>`, sorted (never none).
pub fn fixtures(dir: &str) -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

/// A path's file name.
pub fn file_name(path: &std::path::Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// Every case file of `tests/fixtures/<dir>` passes its bound on the Auto (fused or decode)
/// path and on the multi-pass path.
pub fn cases_pass_on_both_paths(dir: &str) {
    for path in fixtures(dir) {
        let name = file_name(&path);
        let case = wgpu_mha::Case::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        for p in [AttentionPath::Auto, AttentionPath::MultiPass] {
            let result = case
                .run(gpu(), &options(p, false))
                .unwrap_or_else(|e| panic!("{name} {p:?}: {e}"));
            assert!(
                result.passed(),
                "{name} ({p:?}): max|engine − out_f64| = {:.3e} > bound {:.3e}",
                result.max_abs_err,
                result.bound
            );
        }
    }
}

/// Decodes `x` (`[B, L, E]`, self-attention) through a fresh `KvCache` in steps of the given
/// sizes and checks each step against the f64 reference's causal forward over the whole of
/// `x` (decode == full forward). The steps must cover `L`.
pub fn assert_steps_match_causal_forward(
    label: &str,
    config: AttentionConfig,
    weights: &AttentionWeights,
    x: &Tensor,
    steps: &[usize],
) {
    let mha = MultiHeadAttention::new(gpu(), config, weights).expect("module");
    let [b, l, e] = x.shape()[..] else {
        panic!("{label}: x must be [B, L, E]")
    };
    assert_eq!(steps.iter().sum::<usize>(), l, "{label}: steps cover L");
    let want = reference::forward(&config, weights, x, x, x, &Mask::Causal).expect("reference");
    let out = config.output_dim();
    let mut cache = wgpu_mha::KvCache::new(&mha, b, l).expect("cache");
    let mut pos = 0;
    for &n in steps {
        let rows: Vec<f32> = (0..b)
            .flat_map(|bi| x.data()[(bi * l + pos) * e..(bi * l + pos + n) * e].to_vec())
            .collect();
        let step = mha
            .forward_step(&mut cache, &Tensor::new([b, n, e], rows).expect("rows"))
            .unwrap_or_else(|err| panic!("{label}: step at {pos}: {err}"));
        let r: Vec<f64> = (0..b)
            .flat_map(|bi| want.output[(bi * l + pos) * out..(bi * l + pos + n) * out].to_vec())
            .collect();
        assert_close(&format!("{label}: step at {pos}"), step.data(), &r);
        pos += n;
    }
}
