//! `mla_rows`: a row pass of multi-head latent attention's pre-stage — a slice of each row
//! copied into another layout, RMS-normalised (`q_a_layernorm`, `kv_a_layernorm`) or as it is
//! (the shared RoPE key). Driven by [`crate::attention::mla_stage`].

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::source::Prelude;

pub const WGSL: &str = include_str!("../../shaders/mla_rows.wgsl");

/// Mirrors `RowParams` in `mla_rows.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowParams {
    pub rows: u32,
    pub n: u32,
    pub in_stride: u32,
    pub in_offset: u32,
    pub out_stride: u32,
    pub out_offset: u32,
    pub normalise: u32,
    pub groups_x: u32,
    pub eps: f32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

/// The full source: the shared frame, then the body.
pub fn source() -> String {
    Prelude::new().source(&[super::qk_norm::GROUP_PASS_WGSL, WGSL])
}

const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Write(2),
    Slot::Read(3),
];

/// One row slice: `n` values of each of `rows` rows, `(stride, offset)` in `src` and in `dst`;
/// normalised with `norm = (weight [n], eps)`, or copied when `None`.
pub fn dispatch(
    gpu: &Gpu,
    rows: usize,
    n: usize,
    (src, in_stride, in_offset): (&wgpu::Buffer, usize, usize),
    (dst, out_stride, out_offset): (&wgpu::Buffer, usize, usize),
    norm: Option<(&wgpu::Buffer, f32)>,
) -> Result<Dispatch> {
    let (groups_x, workgroups) = super::clamp::spread_groups(gpu, rows as u64, "mla_rows")?;
    let p = RowParams {
        rows: rows as u32,
        n: n as u32,
        in_stride: in_stride as u32,
        in_offset: in_offset as u32,
        out_stride: out_stride as u32,
        out_offset: out_offset as u32,
        normalise: norm.is_some() as u32,
        groups_x,
        eps: norm.map_or(0.0, |n| n.1),
        ..Default::default()
    };
    // A copy binds `src` as its (unread) weight.
    let weight = norm.map_or(src, |n| n.0);
    let pass = gpu.compile("mla_rows", &PassSpec::main("mla_rows", SLOTS), source);
    Dispatch::new(
        gpu,
        pass,
        &p,
        &[(1, src), (2, dst), (3, weight)],
        workgroups,
    )
}
