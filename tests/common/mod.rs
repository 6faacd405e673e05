//! Shared test helpers: one GPU per test binary, and the comparisons every test uses.
#![allow(dead_code)]

pub mod engine;
pub mod hf_cases;
pub mod hf_dirs;

use std::sync::OnceLock;

use wgpu_mha::model::rope::Rope;
use wgpu_mha::reference::{Core, ReferenceOutput};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, ForwardOptions, Gpu, Mask,
    MultiHeadAttention, SdpaOptions, Tensor,
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

/// The storage-binding size the tests of what happens past the limit make their device with
/// ([`gpu_with_binding_cap`]), and size their shapes to cross: small, so that crossing it is
/// cheap on a software adapter (lavapipe itself binds 128 MiB).
pub const SMALL_BINDING: u64 = 16 << 20;

/// A GPU like [`gpu`] whose storage bindings are capped at `binding` bytes, so that
/// tests of what happens past the limit cross it with the same shapes on every adapter — a real
/// GPU binds 2 GiB or more. Made as an engine makes its device (wgpu's helpers honour
/// `WGPU_BACKEND` and `WGPU_ADAPTER_NAME`) and wrapped with `Gpu::from_device`.
pub fn gpu_with_binding_cap(binding: u64) -> Gpu {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))
    .unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"));
    let mut limits = adapter.limits();
    limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(binding);
    // The features `Gpu::new` asks for, the pipeline cache included (CI's later passes reuse it).
    let features = adapter.features()
        & (wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::PIPELINE_CACHE);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("capped test device"),
        required_features: features,
        required_limits: limits,
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("a device with capped bindings: {e}"));
    Gpu::from_device(device, queue).unwrap_or_else(|e| panic!("wrapping the capped device: {e}"))
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
    steps_match_causal_forward(label, config, weights, x, steps, None);
}

/// [`assert_steps_match_causal_forward`] through a cache of each path in turn.
pub fn assert_steps_match_on_both_paths(
    label: &str,
    config: AttentionConfig,
    weights: &AttentionWeights,
    x: &Tensor,
    steps: &[usize],
) {
    for path in BOTH_PATHS {
        steps_match_causal_forward(
            &format!("{label} {path:?}"),
            config,
            weights,
            x,
            steps,
            Some(path),
        );
    }
}

fn steps_match_causal_forward(
    label: &str,
    config: AttentionConfig,
    weights: &AttentionWeights,
    x: &Tensor,
    steps: &[usize],
    path: Option<AttentionPath>,
) {
    let mha = MultiHeadAttention::new(gpu(), config, weights).expect("module");
    let [b, l, e] = x.shape()[..] else {
        panic!("{label}: x must be [B, L, E]")
    };
    assert_eq!(steps.iter().sum::<usize>(), l, "{label}: steps cover L");
    let want = reference::forward(&config, weights, x, x, x, &Mask::Causal).expect("reference");
    let out = config.output_dim();
    let mut cache = match path {
        Some(path) => wgpu_mha::KvCache::with_path(&mha, b, l, path),
        None => wgpu_mha::KvCache::new(&mha, b, l),
    }
    .expect("cache");
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

/// One `scaled_dot_product_attention` on the test GPU over seeded `[B, H, L, D]` tensors
/// (`Layout::Bhld`, H_kv = H, f16 storage when asked), and the f64 reference core of the same
/// call: `(output, reference, probabilities with their reference)`, all `[B, H, Lq, ·]`.
pub struct SdpaRun {
    pub got: Vec<f32>,
    pub want: Vec<f64>,
    pub probs: Option<(Vec<f32>, Vec<f64>)>,
}

/// The seeded `[B, H, L, D]` q, k, v of [`sdpa_bhld`] (rounded through f16 when asked: the
/// reference sees what the device stores).
fn sdpa_inputs([b, h, lq, lk, d]: [usize; 5], f16: bool) -> [Vec<f32>; 3] {
    let round = |t: Tensor| -> Vec<f32> {
        let x = t.into_data();
        match f16 {
            true => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
            false => x,
        }
    };
    [
        round(Tensor::random([b, h, lq, d], 1)),
        round(Tensor::random([b, h, lk, d], 2)),
        round(Tensor::random([b, h, lk, d], 3)),
    ]
}

/// The f64 reference core of [`sdpa_bhld`]'s call: `(output [B, H, Lq, D], probabilities)`.
pub fn sdpa_reference(
    [b, h, lq, lk, d]: [usize; 5],
    f16: bool,
    options: &wgpu_mha::SdpaOptions,
) -> (Vec<f64>, Vec<f64>) {
    let [q, k, v] = sdpa_inputs([b, h, lq, lk, d], f16);
    // The reference takes the combined-heads layouts [B, L, H·D]: element (b, h, l, e).
    let at = |n: usize, l: usize| {
        let (di, rest) = (n % d, n / d);
        let (li, rest) = (rest % l, rest / l);
        let (hi, bi) = (rest % h, rest / h);
        ((bi * l + li) * h + hi) * d + di
    };
    let combined = |x: &[f32], l: usize| -> Vec<f64> {
        let mut y = vec![0.0; x.len()];
        for (n, &val) in x.iter().enumerate() {
            y[at(n, l)] = val as f64;
        }
        y
    };
    let (want, probs) = sdpa_core([b, h, h, lq, lk, d, d], options).run(
        &combined(&q, lq),
        &combined(&k, lk),
        &combined(&v, lk),
    );
    let want = (0..b * h * lq * d).map(|n| want[at(n, lq)]).collect();
    (want, probs)
}

pub fn sdpa_bhld(
    label: &str,
    [b, h, lq, lk, d]: [usize; 5],
    f16: bool,
    options: &wgpu_mha::SdpaOptions,
) -> SdpaRun {
    use wgpu::util::DeviceExt;
    use wgpu_mha::{DeviceTensor, Layout};
    let gpu = gpu();
    let [q, k, v] = sdpa_inputs([b, h, lq, lk, d], f16);
    let upload = |x: &[f32]| {
        let bytes: Vec<u8> = match f16 {
            true => {
                let half: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
                bytemuck::cast_slice(&half).to_vec()
            }
            false => bytemuck::cast_slice(x).to_vec(),
        };
        gpu.device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("test tensor"),
                contents: &bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            })
    };
    let (bq, bk, bv) = (upload(&q), upload(&k), upload(&v));
    let out = wgpu_mha::GpuTensor::zeros(gpu, &[b, h, lq, d]).expect("out");
    let t = |buf, l| {
        let t = DeviceTensor::new(buf, [b, h, l, d], Layout::Bhld);
        if f16 {
            t.f16()
        } else {
            t
        }
    };
    let result = wgpu_mha::scaled_dot_product_attention(
        gpu,
        &t(&bq, lq),
        &t(&bk, lk),
        &t(&bv, lk),
        &DeviceTensor::new(out.buffer(), [b, h, lq, d], Layout::Bhld),
        options,
    )
    .unwrap_or_else(|e| panic!("{label}: {e}"));
    let got = out.read(gpu).expect("read").into_data();
    let (want, probs) = sdpa_reference([b, h, lq, lk, d], f16, options);
    let probs = result
        .probs
        .map(|p| (p.read(gpu).expect("probs").into_data(), probs));
    SdpaRun { got, want, probs }
}

/// [`check_against_reference`] with `key` = `value` = `kv` on both paths, the attention
/// weights compared on the multi-pass one (which computes them); each label ends in its path.
pub fn check_both_paths(
    label: &str,
    config: AttentionConfig,
    query: &Tensor,
    kv: &Tensor,
    mask: &Mask,
) {
    for path in BOTH_PATHS {
        let probs = path == AttentionPath::MultiPass;
        let label = format!("{label} {path:?}");
        check_against_reference(&label, config, query, kv, kv, mask, &options(path, probs));
    }
}

/// [`check_both_paths`] for a batch of `b` queries of each length in `lqs` (seeded
/// `seeds.0 + Lq`) against `lk` keys and values (seeded `seeds.1`), under each mask `masks`
/// gives for that length; each label is "`label` Lq … mask kind".
pub fn check_both_paths_over(
    label: &str,
    config: AttentionConfig,
    [b, lk]: [usize; 2],
    lqs: &[usize],
    seeds: (u64, u64),
    masks: impl Fn(usize) -> Vec<Mask>,
) {
    let e = config.model_dim;
    let kv = Tensor::random([b, lk, e], seeds.1);
    for &lq in lqs {
        let q = Tensor::random([b, lq, e], seeds.0 + lq as u64);
        for mask in masks(lq) {
            let label = format!("{label} Lq {lq} {}", mask.kind_name());
            check_both_paths(&label, config, &q, &kv, &mask);
        }
    }
}

/// A feature binds: the f64 reference of `config` (seeded weights, causal self-attention over
/// a seeded `[b, l, E]` input) and of the same module with the feature taken out by `strip`
/// (from the config and the weights) differ by more than 1e-2, so an engine that skipped the
/// feature would fail. Returns the reference with the feature.
pub fn assert_feature_binds(
    label: &str,
    config: AttentionConfig,
    [b, l]: [usize; 2],
    strip: impl FnOnce(&mut AttentionConfig, &mut AttentionWeights),
) -> ReferenceOutput {
    let weights = AttentionWeights::random(&config, 42);
    let x = Tensor::random([b, l, config.model_dim], 3);
    let (mut plain, mut plain_weights) = (config, weights.clone());
    strip(&mut plain, &mut plain_weights);
    let with = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).expect("reference");
    let without = reference::forward(&plain, &plain_weights, &x, &x, &x, &Mask::Causal)
        .expect("reference without");
    let diff = max_err_f64(&with.output, &without.output);
    assert!(
        diff > 1e-2,
        "{label}: without it the answer moves by only {diff:.3e}"
    );
    with
}

/// `mha` (built from `weights`) on both paths, `key` = `value` = `kv`, equals the f64
/// reference of the same weights; each label ends in its path.
pub fn assert_module_matches_on_both_paths(
    label: &str,
    mha: &MultiHeadAttention,
    weights: &AttentionWeights,
    query: &Tensor,
    kv: &Tensor,
    mask: &Mask,
) {
    let want = reference::forward(mha.config(), weights, query, kv, kv, mask).expect("reference");
    for path in BOTH_PATHS {
        let got = mha
            .forward_with(query, kv, kv, mask, &options(path, false))
            .unwrap_or_else(|e| panic!("{label} {path:?}: {e}"));
        assert_close(
            &format!("{label} {path:?}"),
            got.output.data(),
            &want.output,
        );
    }
}

/// 4 query heads of 4 sharing 2 key/value heads (E = 16), RoPE over the whole head.
pub fn gqa_rope() -> AttentionConfig {
    AttentionConfig::classic(16, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
        .with_rope(Rope::new(10_000.0, 4))
        .unwrap()
}

/// [`sdpa_core`] run over the f32 q, k, v (in the core's `[B, L, H·d]` layouts):
/// `(output, probabilities)`.
pub fn run_sdpa_core(
    dims: [usize; 7],
    options: &SdpaOptions,
    inputs: [Vec<f32>; 3],
) -> (Vec<f64>, Vec<f64>) {
    let [q, k, v] = inputs.map(|x| x.iter().map(|&v| v as f64).collect::<Vec<_>>());
    sdpa_core(dims, options).run(&q, &k, &v)
}

/// The f64 reference core of a `scaled_dot_product_attention` call with `options`:
/// `[batch, heads, kv_heads, lq, lk, dk, dv]`, the scale 1/√dk unless the options give one, the
/// causal diagonal aligned as the options say.
pub fn sdpa_core(
    [batch, heads, kv_heads, lq, lk, dk, dv]: [usize; 7],
    options: &SdpaOptions,
) -> Core<'_> {
    Core {
        batch,
        heads,
        kv_heads,
        lq,
        lk,
        dk,
        dv,
        scale: options.scale.map_or(1.0 / (dk as f64).sqrt(), |s| s as f64),
        softcap: options.softcap,
        alibi_max_bias: options.alibi_max_bias,
        temperature: None,
        sinks: options.sinks.as_deref(),
        mask: &options.mask,
        top_left: options.causal_alignment == wgpu_mha::CausalAlignment::TopLeft,
    }
}
