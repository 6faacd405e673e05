//! `rope`: rotary position embeddings applied in place to head-split Q or K rows, from a
//! cos/sin table the host computes in f64 ([`crate::model::rope::Rope::table`]).

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::source::Prelude;
use crate::model::rope::Rope;

pub const WGSL: &str = include_str!("../../shaders/rope.wgsl");

/// Invocations per workgroup (one pair each).
const WORKGROUP: u32 = 64;

/// Mirrors `RopeParams` in `rope.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RopeParams {
    pub rows: u32,
    pub heads: u32,
    pub n: u32,
    pub stride: u32,
    pub first: u32,
    pub head_dim: u32,
    pub half: u32,
    pub interleaved: u32,
    pub offset: u32,
    pub groups_x: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

/// Which rows of a head-split buffer one dispatch rotates: `n` rows starting at `first` of
/// each of `batch · heads` blocks of `stride` rows of `head_dim`, at element `offset`.
#[derive(Debug, Clone, Copy)]
pub struct RopeRows {
    pub batch: usize,
    pub heads: usize,
    pub n: usize,
    pub stride: usize,
    pub first: usize,
    pub head_dim: usize,
    pub offset: u32,
}

/// The full source: the element type, then the body.
pub fn source(f16: bool) -> String {
    Prelude::new()
        .elem("QkvElem", f16)
        .source(&[super::GRID64_WGSL, WGSL])
}

const SLOTS: &[Slot] = &[Slot::Uniform(0), Slot::Write(1), Slot::Read(2)];

/// Rotates `rows` of `x` by the angles of `table` (`[batch, n, rotary_dims / 2, 2]`).
pub fn dispatch(
    gpu: &Gpu,
    rope: &Rope,
    f16: bool,
    rows: RopeRows,
    x: &wgpu::Buffer,
    table: &wgpu::Buffer,
) -> Result<Dispatch> {
    let half = (rope.rotary_dims / 2) as u32;
    let count = (rows.batch * rows.heads * rows.n) as u32;
    let groups = (count as u64 * half as u64)
        .div_ceil(WORKGROUP as u64)
        .max(1);
    let max = gpu.limits().max_compute_workgroups_per_dimension as u64;
    let groups_x = groups.min(max);
    let workgroups = [groups_x as u32, groups.div_ceil(groups_x) as u32, 1];
    gpu.check_workgroups("rope", workgroups)?;
    let p = RopeParams {
        rows: count,
        heads: rows.heads as u32,
        n: rows.n as u32,
        stride: rows.stride as u32,
        first: rows.first as u32,
        head_dim: rows.head_dim as u32,
        half,
        interleaved: rope.interleaved as u32,
        offset: rows.offset,
        groups_x: groups_x as u32,
        ..Default::default()
    };
    let label = if f16 { "rope f16" } else { "rope" };
    let pass = gpu.compile(label, &PassSpec::main(label, SLOTS), || source(f16));
    Dispatch::new(gpu, pass, &p, &[(1, x), (2, table)], workgroups)
}
