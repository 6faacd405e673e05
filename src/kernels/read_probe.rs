//! `read_probe`: a pass that only reads two buffers, to measure the read bandwidth a
//! memory-bound pass (decoding) can reach on a device, in the same run.

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;

pub const WGSL: &str = include_str!("../../shaders/read_probe.wgsl");

/// vec4s of each buffer one workgroup reads (64 per thread: far under any loop cap).
pub const PER_GROUP: u32 = 4096;

/// Mirrors `ProbeParams` in `read_probe.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ProbeParams {
    pub vec4s: u32,
    pub per_group: u32,
    pub groups_x: u32,
    pub _pad0: u32,
}

/// Workgroups reading `vec4s` vec4s of each buffer.
pub fn groups(vec4s: u32) -> u32 {
    vec4s.div_ceil(PER_GROUP).max(1)
}

/// Reads `vec4s` vec4s of `a` and of `b`; `out` takes `64 · groups(vec4s)` floats.
pub fn dispatch(
    gpu: &Gpu,
    vec4s: u32,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<Dispatch> {
    let total = groups(vec4s);
    let groups_x = total.min(gpu.limits().max_compute_workgroups_per_dimension);
    let p = ProbeParams {
        vec4s,
        per_group: PER_GROUP,
        groups_x,
        _pad0: 0,
    };
    let workgroups = [groups_x, total.div_ceil(groups_x), 1];
    gpu.check_workgroups("read probe", workgroups)?;
    let slots = [
        Slot::Uniform(0),
        Slot::Read(1),
        Slot::Read(2),
        Slot::Write(4),
    ];
    let pass = gpu.compile("read_probe", &PassSpec::main("read_probe", &slots), || {
        WGSL.to_string()
    });
    Dispatch::new(gpu, pass, &p, &[(1, a), (2, b), (4, out)], workgroups)
}
