//! `merge_state`: two attention states `(v, lse)` of the same rows into one (see
//! `shaders/merge_state.wgsl`).

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;

pub const WGSL: &str = include_str!("../../shaders/merge_state.wgsl");

/// Invocations per workgroup.
const WORKGROUP: usize = 64;

/// Mirrors `MergeStateParams` in `merge_state.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MergeStateParams {
    pub rows: u32,
    pub head_dim: u32,
    pub groups_x: u32,
    pub _pad: u32,
}

const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Read(2),
    Slot::Read(3),
    Slot::Read(4),
    Slot::Write(5),
    Slot::Write(6),
];

/// The buffers of one merge: `[rows, D]` values and `[rows]` log-sum-exps.
pub struct MergeBindings<'a> {
    pub v_a: &'a wgpu::Buffer,
    pub s_a: &'a wgpu::Buffer,
    pub v_b: &'a wgpu::Buffer,
    pub s_b: &'a wgpu::Buffer,
    pub v_out: &'a wgpu::Buffer,
    pub s_out: &'a wgpu::Buffer,
}

/// The one dispatch merging `rows` (rows · heads) states of `head_dim` values.
pub fn dispatch(gpu: &Gpu, rows: usize, head_dim: usize, b: &MergeBindings) -> Result<Dispatch> {
    let pass = gpu.compile("merge_state", &PassSpec::main("merge_state", SLOTS), || {
        WGSL.to_string()
    });
    let groups = (rows * head_dim).div_ceil(WORKGROUP).max(1);
    let max = gpu.limits().max_compute_workgroups_per_dimension as usize;
    let x = groups.min(max);
    let params = MergeStateParams {
        rows: rows as u32,
        head_dim: head_dim as u32,
        groups_x: x as u32,
        _pad: 0,
    };
    Dispatch::new(
        gpu,
        pass,
        &params,
        &[
            (1, b.v_a),
            (2, b.s_a),
            (3, b.v_b),
            (4, b.s_b),
            (5, b.v_out),
            (6, b.s_out),
        ],
        [x as u32, groups.div_ceil(x) as u32, 1],
    )
}
