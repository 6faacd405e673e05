//! `av_combine`: `P·V` per (batch, head), written into the combined `[B, Lq, H·dv]` layout.

use std::sync::Arc;

use crate::gpu::Gpu;

use super::{Pass, Slot, GEMM_TILE_WGSL};

pub const WGSL: &str = include_str!("../../shaders/av_combine.wgsl");

/// Mirrors `AvParams` in `av_combine.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AvParams {
    pub lq: u32,
    pub lk: u32,
    pub head_dim: u32,
    pub heads: u32,
    pub v_offset: u32,
    pub z_offset: u32,
    pub kv_stride: u32,
    pub _pad: u32,
}

/// The compiled pass, shared by everything on this device.
pub(crate) fn pass(gpu: &Gpu) -> Arc<Pass> {
    gpu.pass("av_combine", || build(gpu.device()))
}

fn build(device: &wgpu::Device) -> Pass {
    let source = format!("{GEMM_TILE_WGSL}\n{WGSL}");
    Pass::new(
        device,
        "av_combine",
        &source,
        &[
            Slot::Uniform(0),
            Slot::Read(1),
            Slot::Read(2),
            Slot::Write(4),
        ],
    )
}

pub fn workgroups(p: &AvParams, batch_heads: u32) -> [u32; 3] {
    [p.head_dim.div_ceil(64), p.lq.div_ceil(64), batch_heads]
}
