//! A two-layer toy decoder (random weights) decoding 32 tokens with **one submission per
//! token**: both layers' KV cache steps — projections, RoPE, grouped-query attention, output
//! projection, from the crate — and the example's own passes — RMSNorm and the residual add,
//! a tiny WGSL module below — are recorded into one command encoder, which the example
//! submits once per token. The result is compared with a host reference in f64
//! (`wgpu_mha::reference` for the attention, the norm and the add written out here).
//!
//! ```text
//! cargo run --release --example decoder_step_in_one_submission
//! ```
//! Exits with status 1 when the largest error exceeds the tolerance.
//!
//! Each layer is `x = x + attention(rms_norm(x))` (a Llama block without its MLP). The
//! crate's recorded step copies its inputs, writes its mask and RoPE table and copies its
//! output *inside* the encoder, so the two layers' steps and the example's passes run in the
//! order recorded, and every tensor the example gets back is its own.

use std::process::ExitCode;

use wgpu::util::DeviceExt;
use wgpu_mha::model::rope::Rope;
use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Gpu, GpuTensor, KvCache, Mask,
    MultiHeadAttention, StepOptions, Tensor,
};

const WIDTH: usize = 32;
const LAYERS: usize = 2;
const TOKENS: usize = 32;
const BATCH: usize = 2;
const EPS: f64 = 1e-6;

/// The example's own passes: one row of `WIDTH` per invocation. `rms_norm`: `y = x ·
/// rsqrt(mean(x²) + eps) · w`; `residual_add`: `y = x + w`. Rows are `arrayLength(y) / WIDTH`
/// (the tensors here are whole rows, 256 bytes: no padding).
const WGSL: &str = r#"
const WIDTH: u32 = 32u;
const EPS: f32 = 1e-6;
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn rms_norm(@builtin(global_invocation_id) id: vec3<u32>) {
    let row = id.x;
    if (row >= arrayLength(&y) / WIDTH) { return; }
    var squares = 0.0;
    for (var i = 0u; i < WIDTH; i++) {
        let v = x[row * WIDTH + i];
        squares += v * v;
    }
    let inv = inverseSqrt(squares / f32(WIDTH) + EPS);
    for (var i = 0u; i < WIDTH; i++) {
        y[row * WIDTH + i] = x[row * WIDTH + i] * inv * w[i];
    }
}

@compute @workgroup_size(64)
fn residual_add(@builtin(global_invocation_id) id: vec3<u32>) {
    let row = id.x;
    if (row >= arrayLength(&y) / WIDTH) { return; }
    for (var i = 0u; i < WIDTH; i++) {
        y[row * WIDTH + i] = x[row * WIDTH + i] + w[row * WIDTH + i];
    }
}
"#;

/// The example's two pipelines.
struct OwnPasses {
    rms_norm: wgpu::ComputePipeline,
    residual_add: wgpu::ComputePipeline,
}

impl OwnPasses {
    fn new(device: &wgpu::Device) -> Self {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("example passes"),
            source: wgpu::ShaderSource::Wgsl(WGSL.into()),
        });
        let pipeline = |entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        OwnPasses {
            rms_norm: pipeline("rms_norm"),
            residual_add: pipeline("residual_add"),
        }
    }

    /// Records `y = pass(x, w)` into `encoder`, over the rows of `y`.
    fn record(
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
        pipeline: &wgpu::ComputePipeline,
        [x, w, y]: [&wgpu::Buffer; 3],
        rows: usize,
    ) {
        let entries: Vec<wgpu::BindGroupEntry> = [x, w, y]
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(rows.div_ceil(64) as u32, 1, 1);
    }
}

/// `x · rsqrt(mean(x²) + eps) · gamma`, row by row, in f64.
fn rms_norm(x: &[f64], gamma: &[f32]) -> Vec<f64> {
    x.chunks(WIDTH)
        .flat_map(|row| {
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / WIDTH as f64 + EPS).sqrt();
            row.iter()
                .zip(gamma)
                .map(move |(v, &g)| v * inv * g as f64)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Token `t` of every sequence of a `[B, L, WIDTH]` tensor, as `[B, 1, WIDTH]`.
fn token(x: &Tensor, t: usize) -> wgpu_mha::Result<Tensor> {
    let l = x.shape()[1];
    let data = (0..BATCH)
        .flat_map(|b| x.data()[(b * l + t) * WIDTH..(b * l + t + 1) * WIDTH].to_vec())
        .collect();
    Tensor::new([BATCH, 1, WIDTH], data)
}

fn main() -> Result<ExitCode, wgpu_mha::Error> {
    // 1. Two Llama-style layers: 4 query heads sharing 2 key/value heads, RoPE, no biases.
    let config = AttentionConfig::classic(WIDTH, 4)?
        .with_bias(false)
        .with_kv_heads(2)?
        .with_rope(Rope::new(10_000.0, 8))?;
    let weights: Vec<AttentionWeights> = (0..LAYERS)
        .map(|l| AttentionWeights::random(&config, 10 + l as u64))
        .collect();
    let gammas: Vec<Vec<f32>> = (0..LAYERS)
        .map(|l| {
            let noise = Tensor::random([WIDTH], 20 + l as u64);
            noise.data().iter().map(|v| 1.0 + 0.5 * v).collect()
        })
        .collect();
    let embeddings = Tensor::random([BATCH, TOKENS, WIDTH], 1);

    let gpu = Gpu::new()?;
    println!("adapter: {}", gpu.describe());
    let device = gpu.device();
    let modules = weights
        .iter()
        .map(|w| MultiHeadAttention::new(&gpu, config, w))
        .collect::<wgpu_mha::Result<Vec<_>>>()?;
    let mut caches = modules
        .iter()
        .map(|m| KvCache::new(m, BATCH, TOKENS))
        .collect::<wgpu_mha::Result<Vec<_>>>()?;
    let passes = OwnPasses::new(device);
    let gamma_buffers: Vec<wgpu::Buffer> = gammas
        .iter()
        .map(|g| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("rms_norm weight"),
                contents: bytemuck::cast_slice(g),
                usage: wgpu::BufferUsages::STORAGE,
            })
        })
        .collect();

    // 2. Decode: per token, one encoder holding both layers, one submit, one readback.
    let shape = [BATCH, 1, WIDTH];
    let mut got = vec![0.0f32; BATCH * TOKENS * WIDTH];
    let mut submissions = 0;
    for t in 0..TOKENS {
        let mut x = GpuTensor::upload(&gpu, &token(&embeddings, t)?)?;
        let mut encoder = device.create_command_encoder(&Default::default());
        for (layer, (mha, cache)) in modules.iter().zip(&mut caches).enumerate() {
            let normed = GpuTensor::zeros(&gpu, &shape)?;
            let buffers = [x.buffer(), &gamma_buffers[layer], normed.buffer()];
            OwnPasses::record(device, &mut encoder, &passes.rms_norm, buffers, BATCH);
            let attended =
                mha.forward_step_gpu_into(&mut encoder, cache, &normed, &StepOptions::default())?;
            let next = GpuTensor::zeros(&gpu, &shape)?;
            let buffers = [x.buffer(), attended.buffer(), next.buffer()];
            OwnPasses::record(device, &mut encoder, &passes.residual_add, buffers, BATCH);
            x = next;
        }
        gpu.queue().submit([encoder.finish()]);
        submissions += 1;
        let out = x.read(&gpu)?;
        for b in 0..BATCH {
            got[(b * TOKENS + t) * WIDTH..][..WIDTH]
                .copy_from_slice(&out.data()[b * WIDTH..(b + 1) * WIDTH]);
        }
    }

    // 3. The host reference in f64: each layer over the whole sequence with a causal mask
    //    (what decoding token by token computes), norm and residual add in f64.
    let mut x: Vec<f64> = embeddings.data().iter().map(|&v| v as f64).collect();
    for layer in 0..LAYERS {
        let normed = rms_norm(&x, &gammas[layer]);
        let input = Tensor::new(
            [BATCH, TOKENS, WIDTH],
            normed.iter().map(|&v| v as f32).collect(),
        )?;
        let attended = reference::forward(
            &config,
            &weights[layer],
            &input,
            &input,
            &input,
            &Mask::Causal,
        )?;
        for (xi, a) in x.iter_mut().zip(&attended.output) {
            *xi += a;
        }
    }
    let scale = 1.0 + x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&x)
        .map(|(&g, &w)| (g as f64 - w).abs())
        // A NaN anywhere is an infinite error, never skipped.
        .fold(
            0.0f64,
            |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) },
        );
    let tolerance = 1e-5 * scale;
    println!(
        "{TOKENS} tokens × {BATCH} sequences, {LAYERS} layers, {submissions} submissions: max error {err:.2e} (tolerance {tolerance:.2e})"
    );
    Ok(if err <= tolerance {
        ExitCode::SUCCESS
    } else {
        println!("FAILED: the decode differs from the host reference");
        ExitCode::FAILURE
    })
}
