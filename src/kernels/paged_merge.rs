//! `paged_merge`: the rows a plan split into key chunks, from their partial states to their
//! output and log-sum-exp (see `shaders/paged_merge.wgsl`).

use crate::error::Result;
use crate::gpu::pass::{Pass, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::source::Prelude;

pub const WGSL: &str = include_str!("../../shaders/paged_merge.wgsl");

/// Invocations per workgroup.
const WORKGROUP: usize = 64;

/// Mirrors `MergeParams` in `paged_merge.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MergeParams {
    pub total_q: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub rows_at: u32,
    pub partial_rows: u32,
    pub write_lse: u32,
    pub groups_x: u32,
    pub _pad: u32,
}

/// The full source for heads of `d4` vec4s.
pub fn source(d4: u32) -> String {
    Prelude::new()
        .u32("DV4", d4)
        .source(&[super::GRID64_WGSL, WGSL])
}

const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Read(2),
    Slot::Write(3),
    Slot::Write(4),
];

pub fn pass(gpu: &Gpu, d4: u32) -> std::sync::Arc<Pass> {
    let key = format!("paged_merge d4 {d4}");
    gpu.compile(&key, &PassSpec::main("paged_merge", SLOTS), || source(d4))
}

/// Workgroups (and the x count the shader strides rows by) for `invocations`.
pub fn workgroups(gpu: &Gpu, invocations: usize) -> Result<([u32; 3], u32)> {
    let groups = invocations.div_ceil(WORKGROUP).max(1);
    let max = gpu.limits().max_compute_workgroups_per_dimension as usize;
    let x = groups.min(max);
    let dims = [x as u32, groups.div_ceil(x) as u32, 1];
    gpu.check_workgroups("paged_merge", dims)?;
    Ok((dims, x as u32))
}

pub fn bind(
    gpu: &Gpu,
    pass: &Pass,
    params: &wgpu::Buffer,
    plan: &wgpu::Buffer,
    scratch: &wgpu::Buffer,
    out: &wgpu::Buffer,
    lse: &wgpu::Buffer,
) -> Result<wgpu::BindGroup> {
    pass.bind(
        gpu.device(),
        &[
            (0, params.into()),
            (1, plan.into()),
            (2, scratch.into()),
            (3, out.into()),
            (4, lse.into()),
        ],
    )
}
