//! `scores`: `S = mask(scale · Q·Kᵀ)` per (batch, head), `[B, H, Lq, Lk]`.

use std::sync::Arc;

use crate::gpu::Gpu;

use super::{MaskParams, Pass, Slot, GEMM_TILE_WGSL, MASK_WGSL};

pub const WGSL: &str = include_str!("../../shaders/scores.wgsl");

/// Mirrors `ScoresParams` in `scores.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ScoresParams {
    pub lq: u32,
    pub lk: u32,
    pub head_dim: u32,
    pub heads: u32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub scale: f32,
    pub z_offset: u32,
    pub kv_stride: u32,
    pub _pad: [u32; 3],
    pub mask: MaskParams,
}

/// The compiled pass, shared by everything on this device.
pub(crate) fn pass(gpu: &Gpu) -> Arc<Pass> {
    gpu.pass("scores", || build(gpu.device()))
}

fn build(device: &wgpu::Device) -> Pass {
    let source = format!("{GEMM_TILE_WGSL}\n{MASK_WGSL}\n{WGSL}");
    Pass::new(
        device,
        "scores",
        &source,
        &[
            Slot::Uniform(0),
            Slot::Read(1),
            Slot::Write(4),
            Slot::Read(6),
        ],
    )
}

/// 64×64 tiles of `[Lq, Lk]`, one z layer per (batch, head) in this chunk.
pub fn workgroups(p: &ScoresParams, batch_heads: u32) -> [u32; 3] {
    [p.lk.div_ceil(64), p.lq.div_ceil(64), batch_heads]
}
