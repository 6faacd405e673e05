//! `wgpu-mha bench --only decode` (or `--config decode:b=1,h=32,kvh=8,d=128,ctx=4096`): the
//! decode pass's GPU time per step over a context, the K/V bytes it reads per second, and,
//! measured in the same run on the same device, passes that only read as many bytes
//! (`read_probe`, the fastest of its shapes): decoding is memory-bound, so the probe is its
//! ceiling; beside it the host's own read bandwidth over as many bytes, the physical limit of
//! a CPU adapter. The decode pass's output is checked against an f64 reference on sampled
//! heads before it is timed.

use wgpu_mha::error::{Error, Result};
use wgpu_mha::gpu::Gpu;
use wgpu_mha::kernels::read_probe::{self, ProbeShape};
use wgpu_mha::kernels::standalone::{CoreDims, Job};
use wgpu_mha::model::tensor::Tensor;
use wgpu_mha::KvDtype;

use super::bench::Timed;

/// Runs of the host read (best of).
const HOST_RUNS: usize = 5;

/// The read probe in every shape ([`read_probe::SHAPES`]) over `bytes` in all (two buffers of
/// half each), to be timed in turn with the pass they bound.
pub fn probe_jobs(gpu: &Gpu, bytes: u64) -> Result<Vec<(ProbeShape, Job)>> {
    read_probe::SHAPES
        .iter()
        .map(|&shape| Ok((shape, Job::read_probe(gpu, bytes / 2, shape)?)))
        .collect()
}

/// The read bounds of one measurement: the fastest probe shape, every shape's GB/s, and the
/// host's read bandwidth over as many bytes.
#[derive(Debug, Clone, Default)]
pub struct Bounds {
    pub probe_gbps: f64,
    pub shapes: Vec<(String, f64)>,
    pub host_read_gbps: f64,
}

impl Bounds {
    /// From the probe jobs' median ms (in [`probe_jobs`]' order) over `bytes`, and a host read
    /// of as many bytes measured now.
    pub fn measure(probes: &[(ProbeShape, Job)], ms: &[f64], bytes: u64) -> Self {
        let shapes: Vec<(String, f64)> = probes
            .iter()
            .zip(ms)
            .map(|((shape, _), &ms)| (shape.name(), bytes as f64 / ms / 1e6))
            .collect();
        Bounds {
            probe_gbps: shapes.iter().map(|s| s.1).fold(0.0, f64::max),
            shapes,
            host_read_gbps: read_probe::host_read_gbps(bytes, HOST_RUNS),
        }
    }

    /// `probe_shapes`: each shape's GB/s.
    pub fn shapes_json(&self) -> serde_json::Value {
        self.shapes
            .iter()
            .map(|(n, g)| (n.clone(), serde_json::json!(g)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// One decode configuration: a batch of sequences, each with one new query row per head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeConfig {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub context: usize,
}

impl DecodeConfig {
    /// `decode:b=1,h=32,kvh=8,d=128,ctx=4096` (`kvh` defaults to `h`).
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |why: String| Error::Misuse(format!("decode bench spec `{spec}`: {why}"));
        let body = spec
            .strip_prefix("decode:")
            .ok_or_else(|| bad("expected `decode:` and key=value pairs".into()))?;
        let (mut b, mut h, mut kvh, mut d, mut ctx) = (1, None, None, None, None);
        for pair in body.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("`{pair}` is not key=value")))?;
            let value: usize = value
                .trim()
                .parse()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(format!("`{pair}`: not a positive integer")))?;
            match key.trim() {
                "b" => b = value,
                "h" => h = Some(value),
                "kvh" => kvh = Some(value),
                "d" => d = Some(value),
                "ctx" => ctx = Some(value),
                other => return Err(bad(format!("unknown key `{other}` (b, h, kvh, d, ctx)"))),
            }
        }
        let need = |v: Option<usize>, k: &str| v.ok_or_else(|| bad(format!("`{k}=` is missing")));
        let heads = need(h, "h")?;
        Ok(DecodeConfig {
            batch: b,
            heads,
            kv_heads: kvh.unwrap_or(heads),
            head_dim: need(d, "d")?,
            context: need(ctx, "ctx")?,
        })
    }

    /// The named decode configurations.
    pub fn named() -> Vec<Self> {
        [4_096, 32_768]
            .map(|context| DecodeConfig {
                batch: 1,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                context,
            })
            .to_vec()
    }

    pub fn name(&self) -> String {
        format!(
            "decode:b={},h={},kvh={},d={},ctx={}",
            self.batch, self.heads, self.kv_heads, self.head_dim, self.context
        )
    }

    /// K/V bytes one step reads, stored as `kv` (a quantized type's blocks, scales included).
    pub fn kv_bytes(&self, kv: KvDtype) -> u64 {
        2 * kv.bytes_per(self.batch * self.kv_heads * self.context * self.head_dim)
    }
}

/// One decode measurement.
#[derive(Debug, Clone)]
pub struct DecodeResult {
    pub config: DecodeConfig,
    /// How K and V are stored.
    pub kv: KvDtype,
    /// Step time over the first K/V type of the run's (`--kv`), measured in turn.
    pub ratio_to_first: f64,
    /// The output's max error against the f64 reference on the f32 keys and values, over
    /// the largest reference value (sampled heads): what the storage type costs.
    pub error_vs_f32: f64,
    /// Median GPU ms of one step (decode + reduce), or wall clock without timestamps.
    pub step_ms: f64,
    pub kv_gbps: f64,
    /// The fastest read-probe shape, its every shape, and the host's read bandwidth.
    pub bounds: Bounds,
    /// Why it could not run here, if so.
    pub skipped: Option<String>,
}

impl DecodeResult {
    pub fn json(&self, gpu: &Gpu) -> serde_json::Value {
        let c = &self.config;
        serde_json::json!({
            "name": c.name(),
            "variant": "decode",
            "kv": self.kv.name(),
            "ratio_to_first_kv": self.ratio_to_first,
            "error_vs_f32": self.error_vs_f32,
            "batch": c.batch,
            "heads": c.heads,
            "kv_heads": c.kv_heads,
            "head_dim": c.head_dim,
            "context": c.context,
            "step_ms": self.step_ms,
            "kv_gbps": self.kv_gbps,
            "probe_gbps": self.bounds.probe_gbps,
            "probe_shapes": self.bounds.shapes_json(),
            "host_read_gbps": self.bounds.host_read_gbps,
            "skipped": self.skipped,
            "adapter": gpu.describe(),
        })
    }

    pub fn format(&self) -> String {
        match &self.skipped {
            Some(why) => format!("{} {}: skipped: {why}\n", self.config.name(), self.kv),
            None => format!(
                "{} {}: step {:.3} ms ({:.2}x the first --kv's; output error vs f32 K/V {:.1e}), K/V read {:.2} GB/s; read probe {:.2} GB/s ({:.2}x of the probe), host read {:.2} GB/s\n",
                self.config.name(),
                self.kv,
                self.step_ms,
                self.ratio_to_first,
                self.error_vs_f32,
                self.kv_gbps,
                self.bounds.probe_gbps,
                self.kv_gbps / self.bounds.probe_gbps,
                self.bounds.host_read_gbps,
            ),
        }
    }
}

/// Times the decode pass over `c` with K/V stored as each of `kv` (f32, f16, q8_0, q4_0) and
/// the read probe's shapes over as many bytes as the first reads, all in turn.
/// `time_in_turn` gives each job's median GPU milliseconds, the jobs run alternately
/// ([`time_jobs_in_turn`](super::bench::time_jobs_in_turn)) so that their ratios are not the
/// machine's drift between two measurements. Each job's output is checked against the f64
/// reference on the values it stores before anything is timed.
pub fn run(
    gpu: &Gpu,
    c: &DecodeConfig,
    kv: &[KvDtype],
    time_in_turn: impl Fn(&[&dyn Timed]) -> Result<Vec<f64>>,
) -> Result<Vec<DecodeResult>> {
    let dims = CoreDims {
        batch: c.batch,
        heads: c.heads,
        lq: 1,
        lk: c.context,
        qk_head_dim: c.head_dim,
        v_head_dim: c.head_dim,
    };
    let kv_len = c.batch * c.kv_heads * c.context * c.head_dim;
    let skipped = |kv: KvDtype, why: String| DecodeResult {
        config: *c,
        kv,
        ratio_to_first: 0.0,
        error_vs_f32: 0.0,
        step_ms: 0.0,
        kv_gbps: 0.0,
        bounds: Bounds::default(),
        skipped: Some(why),
    };
    let q = Tensor::random([c.batch * c.heads * c.head_dim], 1);
    let k = Tensor::random([kv_len], 2);
    let v = Tensor::random([kv_len], 3);
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    let mut results = Vec::new();
    let mut jobs = Vec::new();
    for &dtype in kv {
        // K alone past one storage binding: this job binds K and V whole (a KvCache chunks them).
        if let Err(e) = gpu.check_fits("K of this context", dtype.bytes_for(kv_len)) {
            results.push(skipped(dtype, e.to_string()));
            continue;
        }
        let made = Job::decode_kv(
            gpu,
            (q.data(), k.data(), v.data()),
            dims,
            c.kv_heads,
            scale,
            dtype,
        );
        let (job, stored) = match made {
            Ok(made) => made,
            Err(e) => {
                results.push(skipped(dtype, e.to_string()));
                continue;
            }
        };
        // Checked before it is timed: sampled heads against the f64 reference.
        job.run(None)?;
        let got = job.read()?;
        check_sampled_heads(c, (&stored.q, &stored.k, &stored.v), scale, &got)
            .map_err(|e| Error::Misuse(format!("{dtype} K/V: {e}")))?;
        let err = error_vs_f32(c, (q.data(), k.data(), v.data()), scale, &got);
        jobs.push((dtype, job, err));
    }
    let Some(&(first, _, _)) = jobs.first() else {
        return Ok(results);
    };
    let probe_bytes = c.kv_bytes(first);
    let probes = probe_jobs(gpu, probe_bytes)?;
    let mut timed: Vec<&dyn Timed> = jobs.iter().map(|(_, j, _)| j as &dyn Timed).collect();
    timed.extend(probes.iter().map(|(_, p)| p as &dyn Timed));
    let ms = time_in_turn(&timed)?;
    if ms.len() != timed.len() {
        return Err(Error::Misuse(
            "the timer gave no median for the decode passes and the probes".into(),
        ));
    }
    let bounds = Bounds::measure(&probes, &ms[jobs.len()..], probe_bytes);
    for (i, (dtype, _, err)) in jobs.iter().enumerate() {
        results.push(DecodeResult {
            config: *c,
            kv: *dtype,
            error_vs_f32: *err,
            ratio_to_first: ms[i] / ms[0],
            step_ms: ms[i],
            kv_gbps: c.kv_bytes(*dtype) as f64 / ms[i] / 1e6,
            bounds: bounds.clone(),
            skipped: None,
        });
    }
    Ok(results)
}

/// The f64 outputs of the first, a middle and the last head of every sequence, computed from
/// `q [B, H, d]`, `k`/`v [B, H_kv, ctx, d]`: (where the head's row starts in the pass's
/// combined `[B, 1, H·d]`, its d values).
fn sampled_reference(
    c: &DecodeConfig,
    (q, k, v): (&[f32], &[f32], &[f32]),
    scale: f32,
) -> Vec<(usize, Vec<f64>)> {
    let (d, ctx, group) = (c.head_dim, c.context, c.heads / c.kv_heads.max(1));
    let mut rows = Vec::new();
    for b in 0..c.batch {
        for h in [0, c.heads / 2, c.heads - 1] {
            let q = &q[(b * c.heads + h) * d..][..d];
            let kv = (b * c.kv_heads + h / group) * ctx * d;
            let scores: Vec<f64> = (0..ctx)
                .map(|j| {
                    let key = &k[kv + j * d..][..d];
                    let dot: f64 = q.iter().zip(key).map(|(&a, &b)| a as f64 * b as f64).sum();
                    dot * scale as f64
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            let want = (0..d)
                .map(|e| {
                    (0..ctx)
                        .map(|j| weights[j] * v[kv + j * d + e] as f64)
                        .sum::<f64>()
                        / sum
                })
                .collect();
            rows.push(((b * c.heads + h) * d, want));
        }
    }
    rows
}

/// The sampled heads ([`sampled_reference`]) of `got` against the f64 reference on the values
/// the pass read, within f32 error.
pub fn check_sampled_heads(
    c: &DecodeConfig,
    qkv: (&[f32], &[f32], &[f32]),
    scale: f32,
    got: &[f32],
) -> Result<()> {
    for (at, want) in sampled_reference(c, qkv, scale) {
        for (e, (&o, &want)) in got[at..].iter().zip(&want).enumerate() {
            let diff = (o as f64 - want).abs();
            if diff.is_nan() || diff > 1e-4 * (1.0 + want.abs()) {
                return Err(Error::Misuse(format!(
                    "{}: the decode pass gives {o} at element {} of the combined heads; the f64 \
                     reference {want} (nothing was timed)",
                    c.name(),
                    at + e
                )));
            }
        }
    }
    Ok(())
}

/// max |got − reference| / max |reference| over the sampled heads, the reference on the f32
/// keys and values: what storing them as f16 or in blocks costs the output.
fn error_vs_f32(c: &DecodeConfig, qkv: (&[f32], &[f32], &[f32]), scale: f32, got: &[f32]) -> f64 {
    let (mut err, mut max) = (0f64, 0f64);
    for (at, want) in sampled_reference(c, qkv, scale) {
        for (&o, &w) in got[at..].iter().zip(&want) {
            err = err.max((o as f64 - w).abs());
            max = max.max(w.abs());
        }
    }
    err / max.max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::{DecodeConfig, KvDtype};

    #[test]
    fn specs_parse_with_defaults_and_refuse_what_they_lack() {
        let c = DecodeConfig::parse("decode:b=2,h=32,kvh=8,d=128,ctx=4096").unwrap();
        assert_eq!(
            (c.batch, c.heads, c.kv_heads, c.head_dim, c.context),
            (2, 32, 8, 128, 4096)
        );
        assert_eq!(c.kv_bytes(KvDtype::F32), 2 * 2 * 8 * 4096 * 128 * 4);
        assert_eq!(c.kv_bytes(KvDtype::Q8_0), 2 * 2 * 8 * 4096 * 128 / 32 * 34);
        let mha = DecodeConfig::parse("decode:h=4,d=64,ctx=10").unwrap();
        assert_eq!((mha.batch, mha.kv_heads), (1, 4));
        for bad in [
            "decode:h=4,d=64",
            "decode:h=4,d=64,ctx=0",
            "decode:h=4,d=64,ctx=8,x=1",
            "classic:h=4",
        ] {
            assert!(DecodeConfig::parse(bad).is_err(), "{bad}");
        }
    }
}
