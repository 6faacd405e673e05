//! `av_combine`: `P·V` per (batch, head), written into the combined `[B, Lq, H·dv]` layout.

use crate::error::Result;
use crate::gpu::pass::{Binding, Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;

use super::source::Prelude;
use super::{gemm_prelude, CoreProblem, RowStrides, GEMM_TILE, GEMM_TILE_WGSL};

pub const WGSL: &str = include_str!("../../shaders/av_combine.wgsl");

/// Mirrors `AvParams` in `av_combine.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AvParams {
    /// Where V's and the output's rows lie.
    pub v: RowStrides,
    pub o: RowStrides,
    pub lq: u32,
    pub lk: u32,
    pub head_dim: u32,
    pub heads: u32,
    pub z_offset: u32,
    pub k_begin: u32,
    pub k_end: u32,
    /// Query heads per value head (see [`crate::kernels::QkvLayout::kv_group`]).
    pub kv_group: u32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
    pub _pad3: u32,
}

impl AvParams {
    pub fn new(c: &CoreProblem) -> Self {
        AvParams {
            lq: c.lq as u32,
            lk: c.lk as u32,
            head_dim: c.v_head_dim as u32,
            heads: c.heads as u32,
            v: c.layout.v,
            o: c.layout.out,
            k_end: c.lk as u32,
            kv_group: c.layout.kv_group,
            ..Default::default()
        }
    }
}

/// What the pass reads and writes.
pub struct AvBuffers<'a> {
    /// Probabilities `[B, H, Lq, Lk]`.
    pub probs: &'a wgpu::Buffer,
    /// Head-split V at the problem's `v_offset`.
    pub v: &'a wgpu::Buffer,
    /// Combined heads `[B, Lq, H·dv]`.
    pub out: &'a wgpu::Buffer,
}

/// The full source: prelude, shared GEMM tile and entry point, body.
pub fn source() -> String {
    gemm_prelude(Prelude::new()).source(&[
        super::ROWS_WGSL,
        GEMM_TILE_WGSL,
        super::scores::GEMM_HEADS_WGSL,
        WGSL,
    ])
}

/// 64×64 tiles of `[Lq, dv]`, one z layer per (batch, head); one dispatch per range of keys
/// (see `kernels::depth_split`), each after the first adding to the output.
pub fn dispatches(gpu: &Gpu, c: &CoreProblem, b: AvBuffers) -> Result<Vec<Dispatch>> {
    let p = AvParams::new(c);
    let slots = [
        Slot::Uniform(0),
        Slot::Read(1),
        Slot::Read(2),
        Slot::Write(4),
    ];
    let pass = gpu.compile("av_combine", &PassSpec::main("av_combine", &slots), source);
    let groups = [
        p.head_dim.div_ceil(GEMM_TILE),
        p.lq.div_ceil(GEMM_TILE),
        c.batch_heads(),
    ];
    let at = |k_begin, k_end| AvParams {
        k_begin,
        k_end,
        ..p
    };
    // The probabilities are the crate's own; V and the output may be a caller's views.
    let r = &c.layout.ranges;
    let buffers = [
        (1, Binding::from(b.probs)),
        (2, Binding::new(b.v, r.v)),
        (4, Binding::new(b.out, r.out)),
    ];
    super::depth_split(gpu, &pass, p.lk, at, &buffers, groups)
}
