//! `softmax`: row-wise, max-subtracted, in place; one workgroup per row.

use std::sync::Arc;

use crate::gpu::Gpu;

use super::{Pass, Slot};

pub const WGSL: &str = include_str!("../../shaders/softmax.wgsl");

/// Mirrors `SoftmaxParams` in `softmax.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SoftmaxParams {
    pub rows: u32,
    pub cols: u32,
    pub groups_x: u32,
    pub _pad: u32,
}

impl SoftmaxParams {
    /// Rows are spread over x then y, since one dimension holds at most `max_groups` workgroups.
    pub fn new(rows: u32, cols: u32, max_groups: u32) -> Self {
        SoftmaxParams {
            rows,
            cols,
            groups_x: rows.clamp(1, max_groups),
            _pad: 0,
        }
    }
}

/// The compiled pass, shared by everything on this device.
pub(crate) fn pass(gpu: &Gpu) -> Arc<Pass> {
    gpu.pass("softmax", || build(gpu.device()))
}

fn build(device: &wgpu::Device) -> Pass {
    Pass::new(device, "softmax", WGSL, &[Slot::Uniform(0), Slot::Write(4)])
}

pub fn workgroups(p: &SoftmaxParams) -> [u32; 3] {
    [p.groups_x, p.rows.div_ceil(p.groups_x), 1]
}
