//! `wgpu-mha bench`: GPU time per pass, GFLOP/s and speed-ups over naive kernels, measured in
//! one run on one adapter. Speed is only ever claimed here, never in a test.
//!
//! Every figure is a median over `iters` timed runs after one warm-up run. Per-pass times come
//! from timestamp queries (adapters without TIMESTAMP_QUERY report wall-clock totals only).
//! Speed-ups compare an optimised pass with its naive baseline (`shaders/baseline/`) on the
//! same shape, in the same process, one after the other.

use std::time::Instant;

use wgpu_mha::error::{Error, Result};
use wgpu_mha::gpu::timer::PassTimer;
use wgpu_mha::gpu::Gpu;
use wgpu_mha::kernels::linear::LinearVariant;
use wgpu_mha::kernels::standalone::{Core, CoreDims, Job, LinearKernel};
use wgpu_mha::model::config::AttentionConfig;
use wgpu_mha::model::mask::Mask;
use wgpu_mha::model::tensor::Tensor;
use wgpu_mha::model::weights::AttentionWeights;
use wgpu_mha::{AttentionPath, ForwardOptions, MultiHeadAttention};

pub use super::bench_config::{named_configs, BenchConfig, Variant};

/// Name of the micro-benchmark entry.
pub const GEMM_MICRO: &str = "gemm";

/// What `wgpu-mha bench` was asked for.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Run only this named configuration (or `gemm`).
    pub only: Option<String>,
    /// A custom configuration instead of the named ones.
    pub config: Option<BenchConfig>,
    /// Timed runs per measurement (after one warm-up); at least 5.
    pub iters: usize,
    /// Skip the naive baselines (no speed-up columns).
    pub skip_naive: bool,
}

/// Median of a list (0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Median GPU milliseconds of one job (sum of its passes; wall clock without timestamps).
pub fn time_job(gpu: &Gpu, job: &Job, iters: usize) -> Result<f64> {
    let mut timer = PassTimer::new(gpu, job.passes().max(1));
    let mut samples = Vec::with_capacity(iters);
    for i in 0..=iters {
        let start = Instant::now();
        let passes = job.run(timer.as_mut())?;
        let wall = start.elapsed().as_secs_f64() * 1e3;
        let ms = if passes.is_empty() {
            wall
        } else {
            passes.iter().map(|p| p.1).sum()
        };
        if i > 0 {
            samples.push(ms);
        }
    }
    Ok(median(samples))
}

/// Something a bench times: a fixed set of dispatches on buffers that stay alive, run whole
/// (recorded, submitted, waited for), each dispatch timed when a timer is given.
pub trait Timed {
    /// Dispatches one run records (the timer's capacity).
    fn passes(&self) -> u32;
    /// One run; per-pass GPU milliseconds when timed (empty without timestamps).
    fn run(&self, timer: Option<&mut PassTimer>) -> Result<Vec<(&'static str, f64)>>;
}

impl Timed for Job {
    fn passes(&self) -> u32 {
        Job::passes(self)
    }
    fn run(&self, timer: Option<&mut PassTimer>) -> Result<Vec<(&'static str, f64)>> {
        Job::run(self, timer)
    }
}

/// Like [`time_job`] for several jobs at once, run in turn (one run of each, then again), so
/// that all of them see the same state of a shared, noisy machine: their ratio is then far
/// steadier than that of medians taken one job after the other. Median ms of each.
pub fn time_jobs_in_turn(gpu: &Gpu, jobs: &[&dyn Timed], iters: usize) -> Result<Vec<f64>> {
    let mut timers: Vec<_> = jobs
        .iter()
        .map(|job| PassTimer::new(gpu, job.passes().max(1)))
        .collect();
    let mut samples = vec![Vec::with_capacity(iters); jobs.len()];
    for i in 0..=iters {
        for ((job, timer), samples) in jobs.iter().zip(&mut timers).zip(&mut samples) {
            let start = Instant::now();
            let passes = job.run(timer.as_mut())?;
            let wall = start.elapsed().as_secs_f64() * 1e3;
            if i > 0 {
                samples.push(if passes.is_empty() {
                    wall
                } else {
                    passes.iter().map(|p| p.1).sum()
                });
            }
        }
    }
    Ok(samples.into_iter().map(median).collect())
}

/// One optimised pass against its baseline.
#[derive(Debug, Clone)]
pub struct Speedup {
    pub name: String,
    pub optimised_ms: f64,
    pub naive_ms: f64,
    pub gflop: f64,
}

impl Speedup {
    pub fn ratio(&self) -> f64 {
        self.naive_ms / self.optimised_ms
    }
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "optimised_ms": self.optimised_ms,
            "naive_ms": self.naive_ms,
            "speedup": self.ratio(),
            "optimised_gflops": self.gflop / self.optimised_ms * 1e3,
            "naive_gflops": self.gflop / self.naive_ms * 1e3,
        })
    }
}

/// The result of one configuration.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub name: String,
    pub variant: &'static str,
    pub batch: usize,
    pub lq: usize,
    pub lk: usize,
    pub heads: usize,
    pub model_dim: usize,
    pub path: String,
    /// Median wall-clock milliseconds of a whole forward (upload, passes, readback).
    pub total_ms: f64,
    /// Median sum of the per-pass GPU times.
    pub gpu_ms: f64,
    pub gflop: f64,
    /// Pass name → median GPU ms, in dispatch order.
    pub passes: Vec<(String, f64)>,
    pub speedups: Vec<Speedup>,
    /// Measurements this adapter could not make, each with its reason.
    pub skipped: Vec<String>,
    pub peak_buffer_bytes: u64,
    /// The gemm row only: GFLOP/s of the picked linear at 4096×512×512 and of the fused core
    /// at B1 H8 L1024 d64, timed in turn ([`time_jobs_in_turn`]).
    pub gemm_and_flash_gflops: Option<(f64, f64)>,
}

impl BenchResult {
    pub fn gflops(&self) -> f64 {
        self.gflop / self.total_ms * 1e3
    }
    pub fn json(&self, gpu: &Gpu) -> serde_json::Value {
        let passes: serde_json::Map<String, serde_json::Value> = self
            .passes
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::json!(v)))
            .collect();
        let mut row = serde_json::json!({
            "name": self.name,
            "variant": self.variant,
            "batch": self.batch,
            "lq": self.lq,
            "lk": self.lk,
            "heads": self.heads,
            "model_dim": self.model_dim,
            "path": self.path,
            "total_ms": self.total_ms,
            "gpu_ms": self.gpu_ms,
            "gflop": self.gflop,
            "gflops": self.gflops(),
            "gpu_gflops": if self.gpu_ms > 0.0 { self.gflop / self.gpu_ms * 1e3 } else { 0.0 },
            "passes": passes,
            "speedups": self.speedups.iter().map(Speedup::json).collect::<Vec<_>>(),
            "skipped": self.skipped,
            "peak_buffer_bytes": self.peak_buffer_bytes,
            "adapter": {
                "name": gpu.info().name,
                "backend": format!("{:?}", gpu.info().backend),
            },
        });
        // The gemm row: the picked linear's and the fused core's GFLOP/s, measured in this run.
        if let (Some((gemm, flash)), Some(obj)) = (self.gemm_and_flash_gflops, row.as_object_mut())
        {
            obj.insert("gemm_gflops".into(), serde_json::json!(gemm));
            obj.insert("flash_gflops".into(), serde_json::json!(flash));
        }
        row
    }
}

/// Names the forward's passes by role: projections before the core, `out_projection` after.
fn name_passes(raw: &[(&'static str, f64)]) -> Vec<(String, f64)> {
    let mut named: Vec<(String, f64)> = Vec::new();
    let mut seen_core = false;
    for &(label, ms) in raw {
        let name = match label {
            "linear" if seen_core => "out_projection".to_string(),
            "linear" => "projection".to_string(),
            other => {
                seen_core = true;
                other.to_string()
            }
        };
        match named.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += ms,
            None => named.push((name, ms)),
        }
    }
    named
}

fn random(len: usize, seed: u64) -> Vec<f32> {
    Tensor::random([len], seed).into_data()
}

/// Random X `[m, k]`, W `[n, k]` and bias `[n]` for timing a linear pass.
fn linear_inputs(m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (random(m * k, 1), random(n * k, 2), random(n, 3))
}

/// The linear pass at `m×n×k` against the naive GEMM.
pub fn gemm_speedup(
    gpu: &Gpu,
    name: &str,
    m: usize,
    n: usize,
    k: usize,
    iters: usize,
) -> Result<Speedup> {
    let (x, w, b) = linear_inputs(m, n, k);
    let fast = Job::linear(gpu, &x, &w, Some(&b), (m, n, k), LinearKernel::Auto)?;
    let optimised_ms = time_job(gpu, &fast, iters)?;
    drop(fast);
    let naive = Job::linear(gpu, &x, &w, Some(&b), (m, n, k), LinearKernel::Naive)?;
    let naive_ms = time_job(gpu, &naive, iters)?;
    Ok(Speedup {
        name: name.into(),
        optimised_ms,
        naive_ms,
        gflop: 2.0 * (m * n * k) as f64 / 1e9,
    })
}

/// The `linear` GEMM at `m×n×k` as a forward picks it (`linear MxNxK`), the vec4 variant when
/// that is not the pick (`linear vec4 MxNxK`), and where the adapter has SUBGROUP the subgroup
/// variant (`linear subgroup MxNxK`), each against one naive timing taken in the same run. The
/// second list says what was skipped and why.
pub fn gemm_variants(
    gpu: &Gpu,
    m: usize,
    n: usize,
    k: usize,
    iters: usize,
) -> Result<(Vec<Speedup>, Vec<String>)> {
    let (x, w, b) = linear_inputs(m, n, k);
    let job = |kernel| Job::linear(gpu, &x, &w, Some(&b), (m, n, k), kernel);
    let shape = format!("{m}x{n}x{k}");
    let auto = job(LinearKernel::Auto)?;
    let mut timed = vec![(format!("linear {shape}"), time_job(gpu, &auto, iters)?)];
    let mut wanted = Vec::new();
    if auto.linear_variant() != Some(LinearVariant::Vec4) {
        wanted.push(("vec4", LinearVariant::Vec4));
    }
    drop(auto);
    let mut skipped = Vec::new();
    if gpu.has_subgroups() {
        wanted.push(("subgroup", LinearVariant::Subgroup));
    } else {
        skipped.push(format!(
            "linear subgroup {shape}: skipped, the adapter has no SUBGROUP feature"
        ));
    }
    for (name, variant) in wanted {
        let ms = time_job(gpu, &job(LinearKernel::Variant(variant))?, iters)?;
        timed.push((format!("linear {name} {shape}"), ms));
    }
    let naive_ms = time_job(gpu, &job(LinearKernel::Naive)?, iters)?;
    let rows = timed
        .into_iter()
        .map(|(name, optimised_ms)| Speedup {
            name,
            optimised_ms,
            naive_ms,
            gflop: 2.0 * (m * n * k) as f64 / 1e9,
        })
        .collect();
    Ok((rows, skipped))
}

/// An attention core (fused or multi-pass) against the naive multi-pass core.
pub fn core_speedup(
    gpu: &Gpu,
    name: &str,
    dims: CoreDims,
    fused: bool,
    iters: usize,
) -> Result<Speedup> {
    let (q, k, v) = core_inputs(dims);
    let scale = 1.0 / (dims.qk_head_dim as f32).sqrt();
    let fast = if fused {
        Job::core(gpu, Core::Fused, (&q, &k, &v), dims, scale, &Mask::None)?
    } else {
        Job::core(gpu, Core::MultiPass, (&q, &k, &v), dims, scale, &Mask::None)?
    };
    let optimised_ms = time_job(gpu, &fast, iters)?;
    drop(fast);
    let naive = Job::core(gpu, Core::Naive, (&q, &k, &v), dims, scale, &Mask::None)?;
    let naive_ms = time_job(gpu, &naive, iters)?;
    Ok(Speedup {
        name: name.into(),
        optimised_ms,
        naive_ms,
        gflop: core_gflop(dims),
    })
}

fn core_inputs(dims: CoreDims) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let z = dims.batch * dims.heads;
    (
        random(z * dims.lq * dims.qk_head_dim, 4),
        random(z * dims.lk * dims.qk_head_dim, 5),
        random(z * dims.lk * dims.v_head_dim, 6),
    )
}

fn core_gflop(d: CoreDims) -> f64 {
    2.0 * (d.batch * d.heads * d.lq * d.lk) as f64 * (d.qk_head_dim + d.v_head_dim) as f64 / 1e9
}

/// The fused pass against the optimised multi-pass core on the same problem.
pub fn fused_vs_multipass(gpu: &Gpu, dims: CoreDims, iters: usize) -> Result<Speedup> {
    let (q, k, v) = core_inputs(dims);
    let scale = 1.0 / (dims.qk_head_dim as f32).sqrt();
    let fused = Job::core(gpu, Core::Fused, (&q, &k, &v), dims, scale, &Mask::None)?;
    let fused_ms = time_job(gpu, &fused, iters)?;
    drop(fused);
    let multi = Job::core(gpu, Core::MultiPass, (&q, &k, &v), dims, scale, &Mask::None)?;
    let multi_ms = time_job(gpu, &multi, iters)?;
    Ok(Speedup {
        name: format!(
            "flash_attention vs multi-pass core, B{} H{} L{} d{}",
            dims.batch, dims.heads, dims.lq, dims.qk_head_dim
        ),
        optimised_ms: fused_ms,
        naive_ms: multi_ms,
        gflop: core_gflop(dims),
    })
}

/// The `gemm` micro-benchmark: linear at 4096×512×512 (the forward's pick, and the vec4 and
/// subgroup variants, see [`gemm_variants`]) vs naive; fused vs multi-pass (and vs naive)
/// attention core at B1 H8 L1024 d64.
pub fn run_micro(gpu: &Gpu, iters: usize) -> Result<BenchResult> {
    let (gemms, skipped) = gemm_variants(gpu, 4096, 512, 512, iters)?;
    let gemm = gemms[0].clone();
    let dims = CoreDims {
        batch: 1,
        heads: 8,
        lq: 1024,
        lk: 1024,
        qk_head_dim: 64,
        v_head_dim: 64,
    };
    let fused = fused_vs_multipass(gpu, dims, iters)?;
    let naive_core = core_speedup(
        gpu,
        "flash_attention vs naive core, B1 H8 L1024 d64",
        dims,
        true,
        iters,
    )?;
    let mut passes = vec![("linear_4096x512x512".to_string(), gemm.optimised_ms)];
    for g in &gemms[1..] {
        // "linear subgroup 4096x512x512" -> "linear_subgroup_4096x512x512"
        passes.push((g.name.replace(' ', "_"), g.optimised_ms));
    }
    passes.extend([
        ("linear_naive_4096x512x512".to_string(), gemm.naive_ms),
        ("flash_attention_l1024".to_string(), fused.optimised_ms),
        ("multipass_core_l1024".to_string(), fused.naive_ms),
        ("naive_core_l1024".to_string(), naive_core.naive_ms),
    ]);
    // The two the fused core is judged against each other by, timed in turn.
    let (x, w, b) = linear_inputs(4096, 512, 512);
    let linear = Job::linear(gpu, &x, &w, Some(&b), (4096, 512, 512), LinearKernel::Auto)?;
    let (q, k, v) = core_inputs(dims);
    let scale = 1.0 / (dims.qk_head_dim as f32).sqrt();
    let core = Job::core(gpu, Core::Fused, (&q, &k, &v), dims, scale, &Mask::None)?;
    let in_turn = time_jobs_in_turn(gpu, &[&linear as &dyn Timed, &core], iters)?;
    let gemm_and_flash_gflops = Some((
        gemm.gflop / in_turn[0] * 1e3,
        fused.gflop / in_turn[1] * 1e3,
    ));
    let mut speedups = gemms;
    speedups.extend([fused, naive_core]);
    Ok(BenchResult {
        name: GEMM_MICRO.into(),
        variant: "micro",
        batch: 1,
        lq: 1024,
        lk: 1024,
        heads: 8,
        model_dim: 512,
        path: "standalone".into(),
        total_ms: gemm.optimised_ms,
        gpu_ms: gemm.optimised_ms,
        gflop: gemm.gflop,
        passes,
        speedups,
        skipped,
        peak_buffer_bytes: 0,
        gemm_and_flash_gflops,
    })
}

/// One configuration: the whole forward (profiled), then each optimised pass vs its baseline.
pub fn run_config(
    gpu: &Gpu,
    bc: &BenchConfig,
    iters: usize,
    skip_naive: bool,
) -> Result<BenchResult> {
    let c = bc.config;
    let weights = AttentionWeights::random(&c, 7);
    let mha = MultiHeadAttention::new(gpu, c, &weights)?;
    let x_q = Tensor::random([bc.batch, bc.lq, c.model_dim], 1);
    let x_kv = (bc.variant == Variant::PerHead || bc.lq != bc.lk)
        .then(|| Tensor::random([bc.batch, bc.lk, c.key_dim], 2));
    let kv = x_kv.as_ref().unwrap_or(&x_q);
    let options = ForwardOptions::default();
    let mut totals = Vec::new();
    let mut gpu_totals = Vec::new();
    let mut per_pass: Vec<(String, Vec<f64>)> = Vec::new();
    let mut path = AttentionPath::Auto;
    for i in 0..=iters {
        let start = Instant::now();
        let out = mha.forward_profiled(&x_q, kv, kv, &Mask::None, &options)?;
        let wall = start.elapsed().as_secs_f64() * 1e3;
        path = out.path;
        if i == 0 {
            continue; // warm-up
        }
        totals.push(wall);
        gpu_totals.push(out.pass_ms.iter().map(|p| p.1).sum());
        for (name, ms) in name_passes(&out.pass_ms) {
            match per_pass.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.push(ms),
                None => per_pass.push((name, vec![ms])),
            }
        }
    }
    let peak_buffer_bytes = mha.workspace_bytes() + weight_bytes(&c);
    drop(mha);

    let mut speedups = Vec::new();
    if !skip_naive {
        // The first projection GEMM of the forward (fused QKV for self-attention, Q otherwise).
        let n = if x_kv.is_none() {
            2 * c.qk_width() + c.v_width()
        } else {
            c.qk_width()
        };
        speedups.push(gemm_speedup(
            gpu,
            &format!("projection {}x{}x{}", bc.batch * bc.lq, n, c.model_dim),
            bc.batch * bc.lq,
            n,
            c.model_dim,
            iters,
        )?);
        let dims = CoreDims {
            batch: bc.batch,
            heads: c.heads,
            lq: bc.lq,
            lk: bc.lk,
            qk_head_dim: c.qk_head_dim,
            v_head_dim: c.v_head_dim,
        };
        let fused = path == AttentionPath::Fused;
        let scores_bytes = 4 * (bc.batch * c.heads * bc.lq * bc.lk) as u64;
        if scores_bytes <= gpu.limits().max_storage_buffer_binding_size {
            let label = if fused {
                "flash_attention vs naive core"
            } else {
                "multi-pass core vs naive core"
            };
            speedups.push(core_speedup(gpu, label, dims, fused, iters)?);
        }
    }
    Ok(BenchResult {
        name: bc.name.clone(),
        variant: bc.variant.name(),
        batch: bc.batch,
        lq: bc.lq,
        lk: bc.lk,
        heads: c.heads,
        model_dim: c.model_dim,
        path: format!("{path:?}"),
        total_ms: median(totals),
        gpu_ms: median(gpu_totals),
        gflop: c.flops(bc.batch, bc.lq, bc.lk) / 1e9,
        passes: per_pass.into_iter().map(|(n, v)| (n, median(v))).collect(),
        speedups,
        skipped: Vec::new(),
        peak_buffer_bytes,
        gemm_and_flash_gflops: None,
    })
}

fn weight_bytes(c: &AttentionConfig) -> u64 {
    let mut elems = c.qk_width() * (c.model_dim + c.key_dim)
        + c.v_width() * c.value_dim
        + 2 * c.qk_width()
        + c.v_width();
    if c.output_projection {
        elems += c.model_dim * c.v_width() + c.model_dim;
    }
    4 * elems as u64
}

/// Runs the selected configurations, printing a line per result as it lands.
pub fn run(
    gpu: &Gpu,
    options: &BenchOptions,
    mut report: impl FnMut(&BenchResult),
) -> Result<Vec<BenchResult>> {
    let iters = options.iters.max(5);
    let mut results = Vec::new();
    if let Some(custom) = &options.config {
        let r = run_config(gpu, custom, iters, options.skip_naive)?;
        report(&r);
        results.push(r);
        return Ok(results);
    }
    let named = named_configs()?;
    if let Some(only) = &options.only {
        if only != GEMM_MICRO && !named.iter().any(|c| &c.name == only) {
            let mut names: Vec<&str> = named.iter().map(|c| c.name.as_str()).collect();
            names.push(GEMM_MICRO);
            return Err(Error::Misuse(format!(
                "no configuration named `{only}`; known: {}",
                names.join(", ")
            )));
        }
    }
    let wanted = |name: &str| options.only.as_deref().is_none_or(|o| o == name);
    if wanted(GEMM_MICRO) {
        let r = run_micro(gpu, iters)?;
        report(&r);
        results.push(r);
    }
    for bc in named.iter().filter(|c| wanted(&c.name)) {
        let r = run_config(gpu, bc, iters, options.skip_naive)?;
        report(&r);
        results.push(r);
    }
    Ok(results)
}

/// Human-readable lines of one result.
pub fn format_result(r: &BenchResult) -> String {
    let mut s = format!(
        "{} [{} B{} Lq{} Lk{} H{} d{}] path {}: total {:.2} ms ({:.2} GFLOP/s), GPU {:.2} ms, buffers {:.1} MiB\n",
        r.name,
        r.variant,
        r.batch,
        r.lq,
        r.lk,
        r.heads,
        r.model_dim,
        r.path,
        r.total_ms,
        r.gflops(),
        r.gpu_ms,
        r.peak_buffer_bytes as f64 / (1 << 20) as f64
    );
    if !r.passes.is_empty() {
        let parts: Vec<String> = r
            .passes
            .iter()
            .map(|(n, ms)| format!("{n} {ms:.2} ms"))
            .collect();
        s += &format!("  passes: {}\n", parts.join(", "));
    }
    for sp in &r.speedups {
        s += &format!(
            "  {}: {:.2} ms vs {:.2} ms -> {:.2}x ({:.2} vs {:.2} GFLOP/s)\n",
            sp.name,
            sp.optimised_ms,
            sp.naive_ms,
            sp.ratio(),
            sp.gflop / sp.optimised_ms * 1e3,
            sp.gflop / sp.naive_ms * 1e3
        );
    }
    if let Some((gemm, flash)) = r.gemm_and_flash_gflops {
        s += &format!(
            "  fused core vs picked linear, timed in turn: {flash:.2} vs {gemm:.2} GFLOP/s -> {:.2}x\n",
            flash / gemm
        );
    }
    for why in &r.skipped {
        s += &format!("  {why}\n");
    }
    s
}
