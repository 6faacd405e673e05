//! `paged_append`: new keys and values `[total_new, H_kv, D]` into their slots of a page pool
//! (see `shaders/paged_append.wgsl`), in one dispatch for K and V together.

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::source::Prelude;

pub const WGSL: &str = include_str!("../../shaders/paged_append.wgsl");

/// Invocations per workgroup.
const WORKGROUP: usize = 64;

/// Mirrors `AppendParams` in `paged_append.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PagedAppendParams {
    pub tokens: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub page_size: u32,
    pub hnd: u32,
    pub groups_x: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub row_stride: u32,
    pub head_stride: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

/// The full source for a pool of f16 (`f16`) or f32 elements.
pub fn source(f16: bool) -> String {
    Prelude::new().elem("KvElem", f16).source(&[WGSL])
}

const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Read(2),
    Slot::Read(3),
    Slot::Write(4),
];

/// Where the rows come from and go to.
pub struct AppendBindings<'a> {
    pub keys: &'a wgpu::Buffer,
    pub values: &'a wgpu::Buffer,
    /// i32 per token: `page · page_size + offset`, or negative to skip it.
    pub slots: &'a wgpu::Buffer,
    pub pool: &'a wgpu::Buffer,
}

/// The one dispatch of an append (its parameters' `groups_x` is filled in here).
pub fn dispatch(
    gpu: &Gpu,
    f16: bool,
    mut params: PagedAppendParams,
    b: &AppendBindings,
) -> Result<Dispatch> {
    let label = if f16 {
        "paged_append f16"
    } else {
        "paged_append"
    };
    let pass = gpu.compile(label, &PassSpec::main("paged_append", SLOTS), || {
        source(f16)
    });
    let elements = params.tokens as usize * params.kv_heads as usize * params.head_dim as usize;
    let groups = elements.div_ceil(WORKGROUP).max(1);
    let max = gpu.limits().max_compute_workgroups_per_dimension as usize;
    let x = groups.min(max);
    params.groups_x = x as u32;
    let workgroups = [x as u32, groups.div_ceil(x) as u32, 1];
    Dispatch::new(
        gpu,
        pass,
        &params,
        &[(1, b.keys), (2, b.values), (3, b.slots), (4, b.pool)],
        workgroups,
    )
}
