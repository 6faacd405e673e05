//! `clamp`: OLMo's `clip_qkv` — the new rows of Q, K and V clamped to `[-limit, limit]` in
//! place, right after the projections (the reference clamps the same values in f64).

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::rope::RopeRows;
use crate::kernels::source::Prelude;

pub const WGSL: &str = include_str!("../../shaders/clamp.wgsl");

/// Mirrors `ClampParams` in `clamp.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ClampParams {
    pub elements: u32,
    pub n: u32,
    pub stride: u32,
    pub first: u32,
    pub head_dim: u32,
    pub offset: u32,
    pub groups_x: u32,
    pub limit: f32,
}

/// The full source: the element type, then the body.
pub fn source(f16: bool) -> String {
    Prelude::new().elem("QkvElem", f16).source(&[WGSL])
}

const SLOTS: &[Slot] = &[Slot::Uniform(0), Slot::Write(1)];

/// The grid of `groups` workgroups (at least one) spread over x then y, as the one-dimensional
/// passes (`clamp`, `output_gate`, `qk_norm`, `mla_rows`, `read_probe`) lay theirs out:
/// `(groups_x, [groups_x, ⌈groups / groups_x⌉, 1])`, checked against the device's limits
/// (`what` names the pass in the error). The shader finds its group at `y · groups_x + x`.
pub(crate) fn spread_groups(gpu: &Gpu, groups: u64, what: &str) -> Result<(u32, [u32; 3])> {
    let groups = groups.max(1);
    let groups_x = groups.min(gpu.limits().max_compute_workgroups_per_dimension as u64);
    let workgroups = [groups_x as u32, groups.div_ceil(groups_x) as u32, 1];
    gpu.check_workgroups(what, workgroups)?;
    Ok((groups_x as u32, workgroups))
}

/// Clamps `rows` of `x` (the rows RoPE would rotate, or the same rows of V) to ±`limit`.
pub fn dispatch(
    gpu: &Gpu,
    limit: f32,
    f16: bool,
    rows: RopeRows,
    x: &wgpu::Buffer,
) -> Result<Dispatch> {
    let elements = (rows.batch * rows.heads * rows.n * rows.head_dim) as u64;
    let (groups_x, workgroups) = spread_groups(gpu, elements.div_ceil(64), "clamp")?;
    let p = ClampParams {
        elements: elements as u32,
        n: rows.n as u32,
        stride: rows.stride as u32,
        first: rows.first as u32,
        head_dim: rows.head_dim as u32,
        offset: rows.offset,
        groups_x,
        limit,
    };
    let label = if f16 { "clamp f16" } else { "clamp" };
    let pass = gpu.compile(label, &PassSpec::main(label, SLOTS), || source(f16));
    Dispatch::new(gpu, pass, &p, &[(1, x)], workgroups)
}
