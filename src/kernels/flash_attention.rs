//! `flash_attention`: fused scores + mask + online softmax + P·V; no `[Lq, Lk]` buffer.

use super::{MaskParams, Pass, Slot, MASK_WGSL};

pub const WGSL: &str = include_str!("../../shaders/flash_attention.wgsl");

/// Query rows per workgroup (`ROWS` per thread in the shader).
pub const BLOCK_Q: u32 = 64;

/// Workgroup memory budget for one K/V tile; 16 KiB fits every adapter wgpu supports.
const TILE_BYTES: usize = 16 * 1024;

/// Mirrors `FlashParams` in `flash_attention.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FlashParams {
    pub lq: u32,
    pub lk: u32,
    pub heads: u32,
    pub scale: f32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub z_offset: u32,
    pub kv_stride: u32,
    pub _pad: [u32; 3],
    pub mask: MaskParams,
}

/// Keys per staged tile for these head sizes, or `None` if not even one key fits.
pub fn kv_tile(qk_head_dim: usize, v_head_dim: usize) -> Option<u32> {
    // Rows are staged as whole vec4s (zero-padded).
    let per_key = (qk_head_dim.div_ceil(4) + v_head_dim.div_ceil(4)) * 16;
    let keys = (TILE_BYTES / per_key).min(32);
    (keys >= 1).then_some(keys as u32)
}

/// The shader with its head sizes baked in (they are fixed per module, and WGSL needs
/// constant sizes for the per-thread q and accumulator arrays).
pub fn source(qk_head_dim: usize, v_head_dim: usize, kv_tile: u32) -> String {
    let body = WGSL
        .replace(
            "const HEAD_DIM_QK: u32 = 64u;",
            &format!("const HEAD_DIM_QK: u32 = {qk_head_dim}u;"),
        )
        .replace(
            "const HEAD_DIM_V: u32 = 64u;",
            &format!("const HEAD_DIM_V: u32 = {v_head_dim}u;"),
        )
        .replace(
            "const KV_TILE: u32 = 32u;",
            &format!("const KV_TILE: u32 = {kv_tile}u;"),
        );
    format!("{MASK_WGSL}\n{body}")
}

pub(crate) fn pass(
    device: &wgpu::Device,
    qk_head_dim: usize,
    v_head_dim: usize,
    kv_tile: u32,
) -> Pass {
    // Runtime bounds checks stay on: measured no faster without them on lavapipe.
    Pass::new(
        device,
        "flash_attention",
        &source(qk_head_dim, v_head_dim, kv_tile),
        &[
            Slot::Uniform(0),
            Slot::Read(1),
            Slot::Write(4),
            Slot::Read(6),
        ],
    )
}

pub fn workgroups(p: &FlashParams, batch_heads: u32) -> [u32; 3] {
    [p.lq.div_ceil(BLOCK_Q), batch_heads, 1]
}
