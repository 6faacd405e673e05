//! `wgpu-mha`: the command-line tool. With no arguments it runs both seed shapes on an embedded
//! default problem and checks them against the CPU reference.

mod cli;

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, ForwardOptions, Gpu, GpuOptions, Mask,
    MultiHeadAttention, Tensor,
};

#[derive(Parser)]
#[command(
    name = "wgpu-mha",
    version,
    about = "Multi-head attention on any GPU through wgpu"
)]
struct Cli {
    /// Backend: vulkan, metal, dx12 or gl (default: WGPU_BACKEND, else all).
    #[arg(long, global = true)]
    backend: Option<String>,
    /// Substring of the adapter name (default: WGPU_ADAPTER_NAME, else the best found).
    #[arg(long, global = true)]
    adapter: Option<String>,
    /// Kernel shapes: `cpu` or `gpu` (default: WGPU_MHA_KERNELS, else the adapter's class).
    /// Forcing `gpu` on a software adapter runs the shapes a GPU would pick.
    #[arg(long, global = true)]
    kernels: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// List adapters with their backend, features and key limits.
    Info,
    /// Run both seed shapes on the embedded default and compare with the CPU reference.
    Demo,
    /// Run case files on the GPU and compare with their `out_f64`; ends with `N passed, N failed`.
    Check(cli::interop::CheckArgs),
    /// Run a case file, weights + inputs, or a Hugging Face module (--hf), and write the output
    /// tensor `out` to safetensors.
    Run(cli::run_args::RunArgs),
    /// List the attention modules of a Hugging Face checkpoint (or any safetensors file): family,
    /// prefix, sizes, heads, position scheme, and whether it runs.
    Inspect(cli::hf::InspectArgs),
    /// Run many small forwards and print process RSS and live GPU objects (leak check).
    Soak {
        /// Number of forwards.
        #[arg(long, default_value_t = 10_000)]
        iters: usize,
        /// Print a sample every N forwards.
        #[arg(long, default_value_t = 1_000)]
        every: usize,
    },
    /// GPU time per pass, GFLOP/s and speed-ups over naive kernels (medians, one warm-up).
    ///
    /// Named configurations: gemm (linear 4096x512x512 and attention core at L=1024),
    /// classic-b1-l128, classic-b8-l512, classic-b1-l2048-d1024-h16, per_head-b16-l128.
    Bench {
        /// Run only this named configuration (`decode`: the decode configurations; `compile`:
        /// the cold compile time of each kernel family at the named configurations' shapes;
        /// `sdpa`: the attention core on device tensors next to the module forward; `serve`:
        /// batched paged attention at serving shapes, `--config serve:div=N` to shrink them).
        #[arg(long)]
        only: Option<String>,
        /// A custom shape instead of the named ones: `classic:b=1,l=128,d=512,h=8`,
        /// `per_head:b=16,l=128,e=128,qk=256,v=512,h=8` (`lq=`, `lk=` may replace `l=`), or
        /// `decode:b=1,h=32,kvh=8,d=128,ctx=4096`, or `serve:div=16` (the serve bench with every
        /// token count divided by 16; `serve:kv=q8_0+q4_0` times only the mixed decode over
        /// pools of those types against an f16 pool).
        #[arg(long)]
        config: Option<String>,
        /// Timed runs per measurement after one warm-up (median reported; at least 5).
        #[arg(long, default_value_t = 5)]
        iters: usize,
        /// Also write the results as a JSON list to this file.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Skip the naive baselines (no speed-up figures; much faster on slow adapters).
        #[arg(long)]
        no_naive: bool,
        /// How the decode bench stores keys and values: one or more of f32, f16, q8_0, q4_0
        /// (comma-separated), timed in turn, each step time also as a ratio to the first's.
        #[arg(long, value_delimiter = ',', default_value = "f32")]
        kv: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let kernels = match cli
        .kernels
        .as_deref()
        .map(wgpu_mha::KernelClass::parse)
        .transpose()
    {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let options = GpuOptions {
        backend: cli.backend.clone(),
        adapter_name: cli.adapter.clone(),
        kernels,
        ..GpuOptions::default()
    };
    let result = match cli.command.unwrap_or(Command::Demo) {
        Command::Info => info(&options),
        Command::Demo => demo(&options),
        Command::Check(args) => cli::interop::check(&options, &args),
        Command::Run(args) => cli::interop::run(&options, &args),
        Command::Inspect(args) => cli::hf::inspect(&args),
        Command::Soak { iters, every } => soak(&options, iters, every),
        Command::Bench {
            only,
            config,
            iters,
            json,
            no_naive,
            kv,
        } => kv
            .iter()
            .map(|k| wgpu_mha::KvDtype::parse(k))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|kv| bench(&options, only, config, iters, json, no_naive, &kv)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn info(options: &GpuOptions) -> Result<ExitCode, wgpu_mha::Error> {
    let adapters = wgpu_mha::list_adapters(options.backend.as_deref());
    if adapters.is_empty() {
        return Err(wgpu_mha::Error::NoAdapter {
            detail: String::new(),
        });
    }
    for a in adapters {
        let l = &a.limits;
        println!(
            "{} ({:?}, {:?}, driver {} {})",
            a.info.name, a.info.backend, a.info.device_type, a.info.driver, a.info.driver_info
        );
        println!(
            "  features: f16={} subgroup={} timestamps={} pipeline_cache={}",
            a.features.contains(wgpu::Features::SHADER_F16),
            a.features.contains(wgpu::Features::SUBGROUP),
            a.features.contains(wgpu::Features::TIMESTAMP_QUERY),
            a.features.contains(wgpu::Features::PIPELINE_CACHE)
        );
        println!(
            "  limits: storage binding {} MiB, buffer {} MiB, workgroup memory {} KiB, invocations {}, groups/dim {}",
            l.max_storage_buffer_binding_size >> 20,
            l.max_buffer_size >> 20,
            l.max_compute_workgroup_storage_size >> 10,
            l.max_compute_invocations_per_workgroup,
            l.max_compute_workgroups_per_dimension
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn bench(
    options: &GpuOptions,
    only: Option<String>,
    config: Option<String>,
    iters: usize,
    json: Option<std::path::PathBuf>,
    skip_naive: bool,
    kv: &[wgpu_mha::KvDtype],
) -> Result<ExitCode, wgpu_mha::Error> {
    if only.as_deref() == Some("compile") {
        let custom = config
            .as_deref()
            .map(cli::bench_compile::Custom::parse)
            .transpose()?;
        return bench_compile(options, custom, json);
    }
    if only.as_deref() == Some("sdpa") {
        return bench_sdpa(options, iters, json);
    }
    // The serve bench: batched paged attention (see cli::bench_serve).
    let serve_spec = config.as_deref().filter(|c| c.starts_with("serve:"));
    if only.as_deref() == Some("serve") || serve_spec.is_some() {
        if only.as_deref().is_some_and(|o| o != "serve") {
            return Err(wgpu_mha::Error::Misuse(format!(
                "--config serve:… is the serve bench's; it does not go with --only {}",
                only.as_deref().unwrap_or_default()
            )));
        }
        let size = match (serve_spec, config.as_deref()) {
            (Some(spec), _) => cli::bench_serve::ServeSize::parse(spec)?,
            (None, Some(other)) => {
                return Err(wgpu_mha::Error::Misuse(format!(
                    "--only serve takes --config serve:div=N (every token count divided by a \
                     power of two up to 256) and kv=q8_0+q4_0 (pool types), not `{other}`"
                )))
            }
            (None, None) => cli::bench_serve::ServeSize::default(),
        };
        return bench_serve(options, size, iters, json);
    }
    // Decode configurations are their own kind of row (see cli::bench_decode).
    let decode_spec = config.as_deref().filter(|c| c.starts_with("decode:"));
    let decode_configs = match (decode_spec, only.as_deref(), &config) {
        (Some(spec), _, _) => vec![cli::bench_decode::DecodeConfig::parse(spec)?],
        (None, Some("decode"), _) => cli::bench_decode::DecodeConfig::named(),
        (None, None, None) => cli::bench_decode::DecodeConfig::named(),
        _ => Vec::new(),
    };
    let decode_only = decode_spec.is_some() || only.as_deref() == Some("decode");
    let config = match decode_spec {
        Some(_) => None,
        None => config
            .as_deref()
            .map(cli::bench::BenchConfig::parse)
            .transpose()?,
    };
    // A --json path that cannot be written fails now, not after minutes of benchmarking.
    let json = JsonOut::open(json)?;
    let gpu = open_gpu(options)?;
    if !gpu.has_timestamps() {
        println!("(no TIMESTAMP_QUERY: per-pass times unavailable, totals are wall clock)");
    }
    let bench_options = cli::bench::BenchOptions {
        only,
        config,
        iters,
        skip_naive,
    };
    let results = match decode_only {
        true => Vec::new(),
        false => cli::bench::run(&gpu, &bench_options, |r| {
            print!("{}", cli::bench::format_result(r))
        })?,
    };
    let mut decodes = Vec::new();
    for c in &decode_configs {
        let rows = cli::bench_decode::run(&gpu, c, kv, |jobs| {
            cli::bench::time_jobs_in_turn(&gpu, jobs, iters.max(5))
        })?;
        for r in rows {
            print!("{}", r.format());
            decodes.push(r);
        }
    }
    JsonOut::finish(json, || {
        let rows = results.iter().map(|r| r.json(&gpu));
        rows.chain(decodes.iter().map(|r| r.json(&gpu))).collect()
    })
}

/// A bench's `--json FILE`: created before any benchmarking (a path that cannot be written
/// fails at once, not after minutes), written whole when the results are in.
struct JsonOut {
    path: std::path::PathBuf,
    pending: wgpu_mha::io::files::PendingOutput,
}

impl JsonOut {
    fn open(path: Option<std::path::PathBuf>) -> Result<Option<Self>, wgpu_mha::Error> {
        path.map(|path| {
            let pending = wgpu_mha::io::files::PendingOutput::create(&path, &[])?;
            Ok(JsonOut { path, pending })
        })
        .transpose()
    }

    /// The end of a bench: the list `rows` makes written to the file when one was asked for
    /// (`rows` runs only then), and success.
    fn finish(
        json: Option<Self>,
        rows: impl FnOnce() -> Vec<serde_json::Value>,
    ) -> Result<ExitCode, wgpu_mha::Error> {
        if let Some(json) = json {
            let text = serde_json::to_string_pretty(&rows()).unwrap_or_default();
            json.pending.commit(text.as_bytes())?;
            println!("wrote {}", json.path.display());
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The GPU `options` pick, its adapter printed (every command that runs passes starts so).
fn open_gpu(options: &GpuOptions) -> Result<Gpu, wgpu_mha::Error> {
    let gpu = Gpu::with_options(options)?;
    println!("adapter: {}", gpu.describe());
    Ok(gpu)
}

/// `bench --only sdpa`: the attention core on device tensors next to the module forward (see
/// cli::bench_sdpa).
fn bench_sdpa(
    options: &GpuOptions,
    iters: usize,
    json: Option<std::path::PathBuf>,
) -> Result<ExitCode, wgpu_mha::Error> {
    let json = JsonOut::open(json)?;
    let gpu = open_gpu(options)?;
    let mut results = Vec::new();
    for shape in &cli::bench_sdpa::SHAPES {
        let r = cli::bench_sdpa::run(&gpu, shape, iters)?;
        print!("{}", r.format());
        results.push(r);
    }
    JsonOut::finish(json, || results.iter().map(|r| r.json(&gpu)).collect())
}

/// `bench --only serve`: batched paged attention at serving shapes (see cli::bench_serve).
fn bench_serve(
    options: &GpuOptions,
    size: cli::bench_serve::ServeSize,
    iters: usize,
    json: Option<std::path::PathBuf>,
) -> Result<ExitCode, wgpu_mha::Error> {
    let json = JsonOut::open(json)?;
    let gpu = open_gpu(options)?;
    if !gpu.has_timestamps() {
        println!("(no TIMESTAMP_QUERY: times are wall clock)");
    }
    let started = Instant::now();
    let results = cli::bench_serve::run(
        &gpu,
        size,
        |jobs| cli::bench::time_jobs_in_turn(&gpu, jobs, iters.max(5)),
        |r| print!("{}", r.format()),
    )?;
    println!("serve bench: {:.1} s", started.elapsed().as_secs_f64());
    JsonOut::finish(json, || results.iter().map(|r| r.json(&gpu)).collect())
}

/// `bench --only compile`: cold compile time of each kernel family (see cli::bench_compile).
fn bench_compile(
    options: &GpuOptions,
    custom: Option<cli::bench_compile::Custom>,
    json: Option<std::path::PathBuf>,
) -> Result<ExitCode, wgpu_mha::Error> {
    let json = JsonOut::open(json)?;
    // Cold means cold: Mesa's on-disk shader cache is read when a device is made, so it is
    // switched off before the first one (no other thread runs yet). Other drivers keep caches
    // of their own that no variable reaches; their figures may be warm.
    std::env::set_var("MESA_SHADER_CACHE_DISABLE", "true");
    let gpu = open_gpu(options)?;
    let results = cli::bench_compile::run(&gpu, custom, |r| print!("{}", r.format()))?;
    JsonOut::finish(json, || results.iter().map(|r| r.json(&gpu)).collect())
}

/// One seed shape on the GPU vs the f64 reference.
struct DemoCase {
    name: &'static str,
    config: AttentionConfig,
    query: Tensor,
    key_value: Option<Tensor>,
    mask: Mask,
}

fn demo(options: &GpuOptions) -> Result<ExitCode, wgpu_mha::Error> {
    let _note = cli::progress::SlowNote::start("the demo");
    let gpu = open_gpu(options)?;
    // Seed 000: classic d_model 512, 8 heads, self-attention with a key-padding mask.
    let classic = DemoCase {
        name: "classic d_model=512 heads=8, self-attention, padding mask",
        config: AttentionConfig::classic(512, 8)?,
        query: Tensor::random([2, 64, 512], 11),
        key_value: None,
        mask: Mask::KeyPadding(vec![64, 40]),
    };
    // Seed 001: per-head emb 128, q_k 256, v 512, 8 heads, cross-attention.
    let per_head = DemoCase {
        name: "per-head emb=128 q_k=256 v=512 head=8, cross-attention",
        config: AttentionConfig::per_head(128, 256, 512, 8)?,
        query: Tensor::random([2, 24, 128], 12),
        key_value: Some(Tensor::random([2, 40, 128], 13)),
        mask: Mask::None,
    };
    let mut all_ok = true;
    for case in [classic, per_head] {
        let weights = AttentionWeights::random(&case.config, 7);
        let mha = MultiHeadAttention::new(&gpu, case.config, &weights)?;
        let kv = case.key_value.as_ref().unwrap_or(&case.query);
        let opts = ForwardOptions::default();
        // Warm up once (the first dispatch compiles the pipelines), then time.
        mha.forward_with(&case.query, kv, kv, &case.mask, &opts)?;
        let start = Instant::now();
        let out = mha.forward_with(&case.query, kv, kv, &case.mask, &opts)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let reference =
            reference::forward(&case.config, &weights, &case.query, kv, kv, &case.mask)?;
        let err = out.output.max_abs_diff(&reference.output_f32());
        let bound = 1e-5 * (1.0 + reference.max_abs() as f32);
        let ok = err <= bound;
        all_ok &= ok;
        let (b, lq, lk) = (case.query.shape()[0], case.query.shape()[1], kv.shape()[1]);
        println!("{}", case.name);
        println!(
            "  B={b} Lq={lq} Lk={lk} -> output {:?} ({:?} path)",
            out.output.shape(),
            out.path
        );
        println!(
            "  max |GPU - CPU reference| = {err:.3e} (bound {bound:.1e}) {}  GPU time {ms:.2} ms ({:.2} GFLOP/s)",
            if ok { "AGREE" } else { "DISAGREE" },
            case.config.flops(b, lq, lk) / ms / 1e6
        );
    }
    Ok(exit_code(all_ok))
}

fn soak(options: &GpuOptions, iters: usize, every: usize) -> Result<ExitCode, wgpu_mha::Error> {
    let gpu = open_gpu(options)?;
    println!(
        "{:>10} {:>12} {:>12} {:>12}",
        "forwards", "rss_kib", "gpu_buffers", "bind_groups"
    );
    let samples = cli::soak::run(&gpu, iters, every)?;
    for s in &samples {
        let rss = s.rss_kib.map_or("-".to_string(), |r| r.to_string());
        println!(
            "{:>10} {:>12} {:>12} {:>12}",
            s.iteration, rss, s.gpu_buffers, s.gpu_bind_groups
        );
    }
    let flat = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => {
            a.gpu_buffers == b.gpu_buffers && a.gpu_bind_groups == b.gpu_bind_groups
        }
        _ => true,
    };
    println!(
        "GPU objects {}",
        if flat { "flat after warm-up" } else { "GREW" }
    );
    Ok(exit_code(flat))
}

/// Success when `ok`, else a failure exit status.
fn exit_code(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
