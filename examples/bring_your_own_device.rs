//! An engine that owns its wgpu device and buffers uses wgpu-mha's attention core inside its
//! own command encoder: it makes its instance, adapter, device and queue; keeps q, k and v in
//! its own buffers (q as `[B, L, H, D]`, what its projection writes; k and v in a KV cache slab
//! with spare rows); records a pass of its own (q ·= 0.5), then `scaled_dot_product_attention`
//! with grouped-query heads, a causal mask and padding, into one encoder; and submits once.
//! The output is checked against an f64 reference computed here.
//!
//! ```text
//! cargo run --release --example bring_your_own_device
//! ```
//! Exits with status 1 if the output disagrees with the reference.

use std::process::ExitCode;

use wgpu::util::DeviceExt;
use wgpu_mha::reference::Core;
use wgpu_mha::{
    record_scaled_dot_product_attention, CausalAlignment, DeviceTensor, Gpu, GpuTensor, Layout,
    Mask, MaskTensor, SdpaOptions, Tensor,
};

// Two sequences of 6 new tokens over 9 keys, 8 query heads sharing 2 K/V heads of 16.
const B: usize = 2;
const H: usize = 8;
const H_KV: usize = 2;
const D: usize = 16;
const LQ: usize = 6;
const LK: usize = 9;
const CAPACITY: usize = 32; // rows of the engine's KV slab per (batch, K/V head)

/// The engine's own pass: halves q in place.
const HALVE_WGSL: &str = "
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&x)) {
        x[id.x] = 0.5 * x[id.x];
    }
}";

fn buffer(device: &wgpu::Device, label: &str, data: &[f32]) -> wgpu::Buffer {
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytemuck::cast_slice(data),
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
    })
}

fn main() -> Result<ExitCode, wgpu_mha::Error> {
    // The engine's device, made the engine's way (WGPU_BACKEND / WGPU_ADAPTER_NAME honoured).
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))
    .map_err(|e| wgpu_mha::Error::NoAdapter {
        detail: e.to_string(),
    })?;
    let (device, queue) =
        pollster::block_on(adapter.request_device(&Default::default())).map_err(|e| {
            wgpu_mha::Error::RequestDevice {
                adapter: adapter.get_info().name,
                message: e.to_string(),
            }
        })?;
    // wgpu-mha wraps the same device and queue (handles are shared, nothing is copied).
    let gpu = Gpu::from_device(device.clone(), queue.clone())?;
    println!("adapter: {}", gpu.describe());

    // The engine's tensors: q [B, LQ, H, D]; k, v [B, H_KV, CAPACITY, D] with LK rows filled.
    let q = Tensor::random([B * LQ * H * D], 1);
    let k = Tensor::random([B * H_KV * CAPACITY * D], 2);
    let v = Tensor::random([B * H_KV * CAPACITY * D], 3);
    let q_buf = buffer(&device, "engine q", q.data());
    let k_buf = buffer(&device, "engine k cache", k.data());
    let v_buf = buffer(&device, "engine v cache", v.data());
    let out_buf = buffer(&device, "engine attention out", &[0.0; B * LQ * H * D]);

    // Bottom-right causal (the 6 new tokens are the last of 9), and sequence 1 padded on the
    // left: its first 2 keys are padding.
    let keep: Vec<u8> = (0..B * LK)
        .map(|i| !(i / LK == 1 && i % LK < 2) as u8)
        .collect();
    let options = SdpaOptions {
        mask: Mask::CausalKeep {
            window: None,
            keep: MaskTensor::new(vec![B, LK], keep)?,
        },
        causal_alignment: CausalAlignment::BottomRight,
        ..Default::default()
    };

    // One encoder: the engine's pass, then attention; one submit.
    let halve = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("engine halve"),
        layout: None,
        module: &device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("engine halve"),
            source: wgpu::ShaderSource::Wgsl(HALVE_WGSL.into()),
        }),
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &halve.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: q_buf.as_entire_binding(),
        }],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&halve);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups((B * LQ * H * D).div_ceil(64) as u32, 1, 1);
    }
    let kv_shape = [B, H_KV, LK, D];
    record_scaled_dot_product_attention(
        &gpu,
        &mut encoder,
        &DeviceTensor::new(&q_buf, [B, H, LQ, D], Layout::Blhd),
        &DeviceTensor::new(&k_buf, kv_shape, Layout::Bhld).with_capacity(CAPACITY),
        &DeviceTensor::new(&v_buf, kv_shape, Layout::Bhld).with_capacity(CAPACITY),
        &DeviceTensor::new(&out_buf, [B, H, LQ, D], Layout::Blhd),
        &options,
    )?;
    queue.submit([encoder.finish()]);
    let got = GpuTensor::from_buffer(&[B * LQ * H * D], out_buf)?.read(&gpu)?;

    // The reference: halved q, and the slab's live rows in the [B, L, H_kv·D] layout.
    let q64: Vec<f64> = q.data().iter().map(|&x| 0.5 * x as f64).collect();
    let live = |slab: &Tensor| -> Vec<f64> {
        let mut rows = Vec::with_capacity(B * LK * H_KV * D);
        for b in 0..B {
            for j in 0..LK {
                for h in 0..H_KV {
                    let at = ((b * H_KV + h) * CAPACITY + j) * D;
                    rows.extend(slab.data()[at..at + D].iter().map(|&x| x as f64));
                }
            }
        }
        rows
    };
    let (want, _) = Core {
        batch: B,
        heads: H,
        kv_heads: H_KV,
        lq: LQ,
        lk: LK,
        dk: D,
        dv: D,
        scale: 1.0 / (D as f64).sqrt(),
        softcap: None,
        alibi_max_bias: None,
        temperature: None,
        sinks: None,
        mask: &options.mask,
        top_left: false,
    }
    .run(&q64, &live(&k), &live(&v));
    let err = got
        .data()
        .iter()
        .zip(&want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    let bound = 1e-5 * (1.0 + want.iter().fold(0.0f64, |m, w| m.max(w.abs())));
    println!("one submission: engine pass + sdpa (GQA {H}/{H_KV}, causal, padding); max error {err:.2e} (bound {bound:.1e})");
    Ok(if err <= bound {
        ExitCode::SUCCESS
    } else {
        eprintln!("the output disagrees with the f64 reference");
        ExitCode::FAILURE
    })
}
