//! `output_gate`: Qwen3-Next's sigmoid gate on the combined heads, in place, between the
//! attention core and `W_o` (the gate values are the query input's `W_g` projection, made by
//! the `linear` pass into a buffer of their own).

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;

pub const WGSL: &str = include_str!("../../shaders/output_gate.wgsl");

/// Mirrors `GateParams` in `output_gate.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GateParams {
    pub elements: u32,
    pub groups_x: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

/// The full source (no prelude: all f32).
pub fn source() -> String {
    WGSL.to_string()
}

const SLOTS: &[Slot] = &[Slot::Uniform(0), Slot::Write(1), Slot::Read(2)];

/// `x[i] ·= sigmoid(gate[i])` for the first `elements` values of `x`.
pub fn dispatch(
    gpu: &Gpu,
    elements: usize,
    x: &wgpu::Buffer,
    gate: &wgpu::Buffer,
) -> Result<Dispatch> {
    let groups = (elements as u64).div_ceil(64);
    let (groups_x, workgroups) = super::clamp::spread_groups(gpu, groups, "output gate")?;
    let p = GateParams {
        elements: elements as u32,
        groups_x,
        ..GateParams::default()
    };
    let pass = gpu.compile("output gate", &PassSpec::main("output gate", SLOTS), source);
    Dispatch::new(gpu, pass, &p, &[(1, x), (2, gate)], workgroups)
}
