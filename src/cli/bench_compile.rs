//! `wgpu-mha bench --only compile`: how long each kernel family takes to compile cold at the
//! shapes the named configurations use, so that "a new head size costs a minute on a software
//! adapter" is a figure anyone can rerun, not folklore.
//!
//! A pipeline's cost is paid in two places: `create_compute_pipeline` (naga, the driver's
//! front end) and, on Mesa's llvmpipe, the JIT at the first dispatch. So each family is timed
//! as one standalone job built and run once (everything a first forward pays), minus a second
//! run of the same job (the work itself). `main` disables Mesa's disk cache for this command
//! (`MESA_SHADER_CACHE_DISABLE`) before any device exists, and each family is the first user of
//! its pipelines in the process, so every figure is a cold compile.

use std::time::Instant;

use wgpu_mha::error::Result;
use wgpu_mha::gpu::Gpu;
use wgpu_mha::kernels::standalone::{Core, CoreDims, Job, LinearKernel};
use wgpu_mha::model::mask::Mask;
use wgpu_mha::model::tensor::Tensor;

use super::bench_config::{named_configs, BenchConfig, Variant};
use super::bench_decode::DecodeConfig;

/// The bound the CI issue set for any one pipeline on a software adapter.
pub const COLD_COMPILE_BOUND_S: f64 = 10.0;

/// One kernel family at one shape.
#[derive(Debug, Clone)]
pub struct CompileResult {
    /// The family and its specialisation, e.g. `flash_attention qk64 v64`.
    pub family: String,
    /// The named configurations that use it.
    pub used_by: Vec<String>,
    /// Seconds of the first build and run, minus a second run.
    pub compile_s: f64,
}

impl CompileResult {
    pub fn format(&self) -> String {
        let over = if self.compile_s > COLD_COMPILE_BOUND_S {
            format!("  OVER {COLD_COMPILE_BOUND_S} s")
        } else {
            String::new()
        };
        format!(
            "compile {}: {:.2} s cold (used by {}){over}\n",
            self.family,
            self.compile_s,
            self.used_by.join(", ")
        )
    }

    pub fn json(&self, gpu: &Gpu) -> serde_json::Value {
        serde_json::json!({
            "name": format!("compile {}", self.family),
            "adapter": gpu.describe(),
            "used_by": self.used_by,
            "cold_compile_s": self.compile_s,
        })
    }
}

/// Builds a job and runs it twice: seconds of (build + first run) − second run.
fn cold_seconds(build: impl FnOnce() -> Result<Job>) -> Result<f64> {
    let start = Instant::now();
    let job = build()?;
    job.run(None)?;
    let first = start.elapsed().as_secs_f64();
    let start = Instant::now();
    job.run(None)?;
    let again = start.elapsed().as_secs_f64();
    Ok((first - again).max(0.0))
}

/// Adds `name` to the entry of `family`, or a new entry measured by `measure`.
fn record(
    results: &mut Vec<CompileResult>,
    family: String,
    name: &str,
    measure: impl FnOnce() -> Result<f64>,
    report: &mut impl FnMut(&CompileResult),
) -> Result<()> {
    if let Some(r) = results.iter_mut().find(|r| r.family == family) {
        r.used_by.push(name.to_string());
        return Ok(());
    }
    let r = CompileResult {
        family,
        used_by: vec![name.to_string()],
        compile_s: measure()?,
    };
    report(&r);
    results.push(r);
    Ok(())
}

/// A configuration of one's own (`--config`): a module's (boxed: it holds a whole
/// `AttentionConfig`), or a decode step's.
#[derive(Debug, Clone)]
pub enum Custom {
    Module(Box<BenchConfig>),
    Decode(DecodeConfig),
}

impl Custom {
    /// `decode:…` as a decode configuration, anything else as a module's.
    pub fn parse(spec: &str) -> Result<Self> {
        if spec.starts_with("decode:") {
            DecodeConfig::parse(spec).map(Custom::Decode)
        } else {
            BenchConfig::parse(spec).map(|c| Custom::Module(Box::new(c)))
        }
    }
}

/// Times every kernel family the named configurations (and the decode configurations) use,
/// on small problems of their head sizes; with `custom` (`--config`), that configuration's.
pub fn run(
    gpu: &Gpu,
    custom: Option<Custom>,
    mut report: impl FnMut(&CompileResult),
) -> Result<Vec<CompileResult>> {
    let mut results = Vec::new();
    let (l, batch) = (16usize, 1usize);
    let configs = match &custom {
        Some(Custom::Module(c)) => vec![(**c).clone()],
        Some(Custom::Decode(_)) => Vec::new(),
        None => named_configs()?,
    };
    for bc in configs {
        let c = bc.config;
        let (m, n, k) = (l, c.model_dim, c.model_dim);
        record(
            &mut results,
            "linear (picked variant)".into(),
            &bc.name,
            || {
                let x = Tensor::random([m * k], 1);
                let w = Tensor::random([n * k], 2);
                cold_seconds(|| {
                    Job::linear(gpu, x.data(), w.data(), None, (m, n, k), LinearKernel::Auto)
                })
            },
            &mut report,
        )?;
        let dims = CoreDims {
            batch,
            heads: c.heads,
            lq: l,
            lk: l,
            qk_head_dim: c.qk_head_dim,
            v_head_dim: c.v_head_dim,
        };
        let scale = 1.0 / (c.qk_head_dim as f32).sqrt();
        let (qk_len, v_len) = (
            batch * c.heads * l * c.qk_head_dim,
            batch * c.heads * l * c.v_head_dim,
        );
        let inputs = (
            Tensor::random([qk_len], 3),
            Tensor::random([qk_len], 4),
            Tensor::random([v_len], 5),
        );
        let core = |kind: Core| {
            cold_seconds(|| {
                Job::core(
                    gpu,
                    kind,
                    (inputs.0.data(), inputs.1.data(), inputs.2.data()),
                    dims,
                    scale,
                    &Mask::Causal,
                )
            })
        };
        let sizes = format!("qk{} v{}", c.qk_head_dim, c.v_head_dim);
        record(
            &mut results,
            format!("flash_attention {sizes}"),
            &bc.name,
            || core(Core::Fused),
            &mut report,
        )?;
        if bc.variant == Variant::Classic {
            // scores, softmax and av_combine take their sizes at run time: one entry.
            record(
                &mut results,
                "multi-pass core (scores, softmax, av_combine)".into(),
                &bc.name,
                || core(Core::MultiPass),
                &mut report,
            )?;
        }
    }
    let decodes = match custom {
        Some(Custom::Decode(dc)) => vec![dc],
        Some(Custom::Module(_)) => Vec::new(),
        None => DecodeConfig::named(),
    };
    for dc in decodes {
        let dims = CoreDims {
            batch: dc.batch,
            heads: dc.heads,
            lq: 1,
            lk: 64,
            qk_head_dim: dc.head_dim,
            v_head_dim: dc.head_dim,
        };
        let kv_len = dc.batch * dc.kv_heads * dims.lk * dc.head_dim;
        let family = format!(
            "decode_attention + decode_reduce d{} group {}",
            dc.head_dim,
            dc.heads / dc.kv_heads.max(1)
        );
        record(
            &mut results,
            family,
            &dc.name(),
            || {
                let q = Tensor::random([dc.batch * dc.heads * dc.head_dim], 6);
                let k = Tensor::random([kv_len], 7);
                let v = Tensor::random([kv_len], 8);
                let scale = 1.0 / (dc.head_dim as f32).sqrt();
                cold_seconds(|| {
                    Job::decode(
                        gpu,
                        (q.data(), k.data(), v.data()),
                        dims,
                        dc.kv_heads,
                        scale,
                    )
                })
            },
            &mut report,
        )?;
    }
    Ok(results)
}
