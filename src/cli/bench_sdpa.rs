//! `wgpu-mha bench --only sdpa`: `scaled_dot_product_attention` on device tensors, recorded by
//! the bench into its own encoder and submitted as a caller would (q in the `[B, L, H, D]`
//! layout a projection writes, K/V in a `[B, H_kv, capacity, D]` cache slab with spare rows),
//! next to the module on the same shapes and adapter: its forward for the prefill, its
//! `KvCache` step for the decode (projections included: the difference is what the module adds
//! around the core). The core's output is checked against
//! the f64 reference on sampled heads before anything is timed. Times are wall clock from
//! submit to idle, medians over runs taken in turn.

use std::time::Instant;

use wgpu::util::DeviceExt;
use wgpu_mha::error::{Error, Result};
use wgpu_mha::gpu::Gpu;
use wgpu_mha::model::tensor::Tensor;
use wgpu_mha::{
    record_scaled_dot_product_attention, AttentionConfig, AttentionWeights, DeviceTensor,
    GpuTensor, KvCache, Layout, Mask, MultiHeadAttention, SdpaOptions,
};

/// One timed shape: `lq` new queries per sequence against `lk` keys (causal).
#[derive(Debug, Clone, Copy)]
pub struct SdpaShape {
    pub name: &'static str,
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub lq: usize,
    pub lk: usize,
}

/// Prefill and decode at a Llama-3-8B-like head layout (32 query heads of 128, 8 K/V heads).
pub const SHAPES: [SdpaShape; 2] = [
    SdpaShape {
        name: "sdpa prefill b=1 h=32 kvh=8 d=128 L=1024",
        batch: 1,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        lq: 1024,
        lk: 1024,
    },
    SdpaShape {
        name: "sdpa decode b=1 h=32 kvh=8 d=128 ctx=4096",
        batch: 1,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        lq: 1,
        lk: 4096,
    },
];

/// One shape's figures.
#[derive(Debug, Clone)]
pub struct SdpaResult {
    pub shape: SdpaShape,
    pub sdpa_ms: f64,
    pub module_ms: f64,
    /// Counting every one of the `Lq·Lk` scores (a causal prefill computes about half).
    pub sdpa_gflops: f64,
    /// K/V bytes read per second (every key and value once).
    pub kv_gbps: f64,
}

impl SdpaResult {
    pub fn format(&self) -> String {
        format!(
            "{}: sdpa {:.3} ms ({:.1} GFLOP/s over all Lq·Lk scores, K/V read {:.2} GB/s); module {} {:.3} ms (projections included); sdpa/module {:.3}\n",
            self.shape.name,
            self.sdpa_ms,
            self.sdpa_gflops,
            self.kv_gbps,
            self.module_label(),
            self.module_ms,
            self.sdpa_ms / self.module_ms
        )
    }

    fn module_label(&self) -> &'static str {
        match self.shape.lq {
            1 => "KvCache step",
            _ => "forward",
        }
    }

    pub fn json(&self, gpu: &Gpu) -> serde_json::Value {
        let s = &self.shape;
        serde_json::json!({
            "name": s.name, "variant": "sdpa", "batch": s.batch, "heads": s.heads,
            "kv_heads": s.kv_heads, "head_dim": s.head_dim, "lq": s.lq, "lk": s.lk,
            "sdpa_ms": self.sdpa_ms, "module_ms": self.module_ms,
            "sdpa_gflops": self.sdpa_gflops, "kv_gbps": self.kv_gbps,
            "module": self.module_label(), "adapter": gpu.describe(),
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn storage(gpu: &Gpu, data: &[f32]) -> wgpu::Buffer {
    gpu.device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("bench sdpa tensor"),
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        })
}

fn wait(gpu: &Gpu) -> Result<()> {
    gpu.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .map(|_| ())
        .map_err(|e| Error::Gpu {
            stage: "bench sdpa".into(),
            message: e.to_string(),
        })
}

/// Times one shape (see the module docs).
pub fn run(gpu: &Gpu, s: &SdpaShape, iters: usize) -> Result<SdpaResult> {
    let (b, h, kvh, d) = (s.batch, s.heads, s.kv_heads, s.head_dim);
    let capacity = s.lk + 64;
    let q = Tensor::random([b * s.lq * h * d], 1);
    // The cache slab: [B, H_kv, capacity, D], the first lk rows live.
    let k = Tensor::random([b * kvh * capacity * d], 2);
    let v = Tensor::random([b * kvh * capacity * d], 3);
    let (q_buf, k_buf, v_buf) = (
        storage(gpu, q.data()),
        storage(gpu, k.data()),
        storage(gpu, v.data()),
    );
    let out_buf = storage(gpu, &vec![0.0; b * s.lq * h * d]);
    let q_t = DeviceTensor::new(&q_buf, [b, h, s.lq, d], Layout::Blhd);
    let kv_shape = [b, kvh, s.lk, d];
    let k_t = DeviceTensor::new(&k_buf, kv_shape, Layout::Bhld).with_capacity(capacity);
    let v_t = DeviceTensor::new(&v_buf, kv_shape, Layout::Bhld).with_capacity(capacity);
    let out_t = DeviceTensor::new(&out_buf, [b, h, s.lq, d], Layout::Blhd);
    let options = SdpaOptions {
        mask: Mask::Causal,
        ..Default::default()
    };
    let sdpa = || -> Result<()> {
        let mut encoder = gpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        record_scaled_dot_product_attention(gpu, &mut encoder, &q_t, &k_t, &v_t, &out_t, &options)?;
        gpu.queue().submit([encoder.finish()]);
        wait(gpu)
    };
    sdpa()?;
    check_sampled_heads(gpu, s, (&q, &k, &v, capacity), &out_buf)?;

    let config = AttentionConfig::classic(h * d, h)?.with_kv_heads(kvh)?;
    let mha = MultiHeadAttention::new(gpu, config, &AttentionWeights::random(&config, 4))?;
    let runs = iters.max(3);
    // Decode: the module's own decode, a KvCache step over a cache holding the context.
    let mut cache = match s.lq {
        1 => {
            let mut cache = KvCache::new(&mha, b, s.lk + runs + 2)?;
            mha.forward_step(&mut cache, &Tensor::random([b, s.lk - 1, h * d], 6))?;
            Some(cache)
        }
        _ => None,
    };
    let x_new = Tensor::random([b, s.lq, h * d], 5);
    let x_new_gpu = GpuTensor::upload(gpu, &x_new)?;
    let x_all = GpuTensor::upload(gpu, &Tensor::random([b, s.lk, h * d], 6))?;
    let mut module = || -> Result<()> {
        match cache.as_mut() {
            Some(cache) => mha.forward_step(cache, &x_new).map(|_| ()),
            None => {
                mha.forward_gpu(&x_new_gpu, &x_all, &x_all, &Mask::Causal)?;
                wait(gpu)
            }
        }
    };
    let (mut sdpa_ms, mut module_ms) = (Vec::new(), Vec::new());
    sdpa()?;
    for _ in 0..runs {
        let t = Instant::now();
        sdpa()?;
        sdpa_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        module()?;
        module_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let sdpa_ms = median(sdpa_ms);
    let flops = 2.0 * (b * h * s.lq * s.lk) as f64 * (2 * d) as f64;
    let kv_bytes = 2.0 * (b * kvh * s.lk * d * 4) as f64;
    Ok(SdpaResult {
        shape: *s,
        sdpa_ms,
        module_ms: median(module_ms),
        sdpa_gflops: flops / sdpa_ms / 1e6,
        kv_gbps: kv_bytes / sdpa_ms / 1e6,
    })
}

/// The first and last query heads of batch 0, at the first, middle and last query rows,
/// computed in f64 from the same host data, against the core's output.
fn check_sampled_heads(
    gpu: &Gpu,
    s: &SdpaShape,
    (q, k, v, capacity): (&Tensor, &Tensor, &Tensor, usize),
    out: &wgpu::Buffer,
) -> Result<()> {
    let got =
        GpuTensor::from_buffer(&[s.batch * s.lq * s.heads * s.head_dim], out.clone())?.read(gpu)?;
    let (h, d, group) = (s.heads, s.head_dim, s.heads / s.kv_heads);
    let scale = 1.0 / (d as f64).sqrt();
    for head in [0, h - 1] {
        for i in [0, s.lq / 2, s.lq - 1] {
            let query = &q.data()[(i * h + head) * d..][..d];
            let kv = (head / group) * capacity * d;
            let last = i + s.lk - s.lq; // bottom-right causal
            let scores: Vec<f64> = (0..=last)
                .map(|j| {
                    let key = &k.data()[kv + j * d..][..d];
                    scale
                        * query
                            .iter()
                            .zip(key)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = w.iter().sum();
            for e in 0..d {
                let want: f64 = w
                    .iter()
                    .enumerate()
                    .map(|(j, wj)| wj * v.data()[kv + j * d + e] as f64)
                    .sum::<f64>()
                    / sum;
                let o = got.data()[(i * h + head) * d + e] as f64;
                let diff = (o - want).abs();
                if diff.is_nan() || diff > 1e-4 * (1.0 + want.abs()) {
                    return Err(Error::Misuse(format!(
                        "{}: sdpa gives {o} at head {head}, row {i}, element {e}; the f64 reference {want} (nothing was timed)",
                        s.name
                    )));
                }
            }
        }
    }
    Ok(())
}
