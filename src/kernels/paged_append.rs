//! `paged_append`: new keys and values `[total_new, H_kv, D]` into their slots of a page pool
//! (see `shaders/paged_append.wgsl`), in one dispatch for K and V together; into a quantized
//! pool (`shaders/paged_append_quant.wgsl`) a block of 32 values per invocation.

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::source::Prelude;
use crate::kv_dtype::{KvDtype, BLOCK};

pub const WGSL: &str = include_str!("../../shaders/paged_append.wgsl");
/// The parameters, bindings and walk over the new rows both bodies share.
pub const PARAMS_WGSL: &str = include_str!("../../shaders/paged_append_params.wgsl");
/// Into a quantized pool: one invocation per block of 32 values of a (token, KV head).
pub const QUANT_WGSL: &str = include_str!("../../shaders/paged_append_quant.wgsl");

/// Invocations per workgroup.
const WORKGROUP: usize = 64;

/// Mirrors `PagedAppendParams` in `paged_append_params.wgsl`.
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
    /// A quantized pool's scales plane, in words (`paged_append_quant.wgsl`).
    pub scales: u32,
    pub _pad1: u32,
}

/// The full source for a pool of `dtype` elements.
pub fn source(dtype: KvDtype) -> String {
    match dtype.quant_bits() {
        0 => Prelude::new()
            .elem("KvElem", dtype == KvDtype::F16)
            .source(&[super::GRID64_WGSL, PARAMS_WGSL, WGSL]),
        bits => Prelude::new().u32("KV_BITS", bits).source(&[
            super::GRID64_WGSL,
            PARAMS_WGSL,
            super::KV_APPEND_BLOCK_WGSL,
            QUANT_WGSL,
        ]),
    }
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
    dtype: KvDtype,
    mut params: PagedAppendParams,
    b: &AppendBindings,
) -> Result<Dispatch> {
    let label = match dtype {
        KvDtype::F32 => "paged_append",
        KvDtype::F16 => "paged_append f16",
        KvDtype::Q8_0 => "paged_append q8_0",
        KvDtype::Q4_0 => "paged_append q4_0",
    };
    let pass = gpu.compile(label, &PassSpec::main("paged_append", SLOTS), || {
        source(dtype)
    });
    let elements = params.tokens as usize * params.kv_heads as usize * params.head_dim as usize;
    // A quantized pool takes a block of 32 values per invocation (head sizes whole blocks).
    let per_invocation = if dtype.quantized() { BLOCK } else { 1 };
    let groups = (elements / per_invocation).div_ceil(WORKGROUP).max(1);
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
