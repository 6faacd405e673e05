//! `qk_norm`: RMSNorm or LayerNorm of head-split Q or K rows in place, per head or over a
//! token's whole projection, before RoPE ([`crate::model::qk_norm::QkNorm`]; the f64 rule the
//! reference follows is [`QkNorm::apply`]).

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::rope::RopeRows;
use crate::kernels::source::Prelude;
use crate::model::qk_norm::{NormKind, NormScope, QkNorm};

pub const WGSL: &str = include_str!("../../shaders/qk_norm.wgsl");
/// The entry point and workgroup sum of the one-group-per-workgroup passes (`qk_norm`,
/// `mla_rows`); the body supplies `group_count` and `group_pass`.
pub const GROUP_PASS_WGSL: &str = include_str!("../../shaders/group_pass.wgsl");

/// Mirrors `NormParams` in `qk_norm.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct NormParams {
    pub groups: u32,
    pub heads: u32,
    pub heads_per_group: u32,
    pub n: u32,
    pub stride: u32,
    pub first: u32,
    pub head_dim: u32,
    pub offset: u32,
    pub per_head_weight: u32,
    pub layer_norm: u32,
    pub eps: f32,
    pub weight_offset: f32,
    pub groups_x: u32,
    pub has_bias: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

/// The full source: the element type, the shared frame, then the body.
pub fn source(f16: bool) -> String {
    Prelude::new()
        .elem("QkvElem", f16)
        .source(&[GROUP_PASS_WGSL, WGSL])
}

const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Write(1),
    Slot::Read(2),
    Slot::Read(3),
];

/// Normalises `rows` of `x` (the same rows RoPE rotates) with `weight` (`[head_dim]`, or
/// `[heads · head_dim]`, f32), then adds `bias` (as long as the weight) when there is one.
pub fn dispatch(
    gpu: &Gpu,
    norm: &QkNorm,
    f16: bool,
    rows: RopeRows,
    x: &wgpu::Buffer,
    weight: (&wgpu::Buffer, usize),
    bias: Option<&wgpu::Buffer>,
) -> Result<Dispatch> {
    let heads_per_group = match norm.scope {
        NormScope::PerHead => 1,
        NormScope::Whole => rows.heads,
    };
    let groups = (rows.batch * rows.n * rows.heads / heads_per_group) as u64;
    let (groups_x, workgroups) = super::clamp::spread_groups(gpu, groups, "qk_norm")?;
    let p = NormParams {
        groups: groups as u32,
        heads: rows.heads as u32,
        heads_per_group: heads_per_group as u32,
        n: rows.n as u32,
        stride: rows.stride as u32,
        first: rows.first as u32,
        head_dim: rows.head_dim as u32,
        offset: rows.offset,
        per_head_weight: (weight.1 != rows.head_dim) as u32,
        layer_norm: (norm.kind == NormKind::Layer) as u32,
        eps: norm.eps,
        weight_offset: norm.weight_offset,
        groups_x,
        has_bias: bias.is_some() as u32,
        ..Default::default()
    };
    let label = if f16 { "qk_norm f16" } else { "qk_norm" };
    let pass = gpu.compile(label, &PassSpec::main(label, SLOTS), || source(f16));
    // Without a bias the weight fills its binding; the shader does not read it.
    let bias = bias.unwrap_or(weight.0);
    Dispatch::new(
        gpu,
        pass,
        &p,
        &[(1, x), (2, weight.0), (3, bias)],
        workgroups,
    )
}
