//! `softmax`: row-wise, max-subtracted, in place; one workgroup per row.

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;

pub const WGSL: &str = include_str!("../../shaders/softmax.wgsl");

/// Mirrors `SoftmaxParams` in `softmax.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SoftmaxParams {
    pub rows: u32,
    pub cols: u32,
    pub groups_x: u32,
    pub sinks: u32,
    pub lq: u32,
    pub heads: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

impl SoftmaxParams {
    /// Rows are spread over x then y, since one dimension holds at most `max_groups` workgroups.
    pub fn new(rows: u32, cols: u32, max_groups: u32) -> Self {
        SoftmaxParams {
            rows,
            cols,
            groups_x: rows.clamp(1, max_groups),
            ..Default::default()
        }
    }

    pub fn workgroups(&self) -> [u32; 3] {
        [self.groups_x, self.rows.div_ceil(self.groups_x), 1]
    }
}

/// The full source (the pass needs no prelude).
pub fn source() -> String {
    WGSL.to_string()
}

/// Most columns a row may have on a software rasteriser, whose loops stop after 65,535
/// iterations per invocation: a row takes three strided sweeps of `cols / 64` iterations, so
/// 2^19 columns make 24,576, well under the cap.
pub const SOFTWARE_MAX_COLS: usize = 1 << 19;

/// Attention sinks for a softmax over scores `[·, heads, lq, cols]`: one logit per head in
/// `logits`, joining each row's denominator when `on`.
#[derive(Clone, Copy)]
pub struct Sinks<'a> {
    pub logits: &'a wgpu::Buffer,
    pub on: bool,
    pub heads: usize,
    pub lq: usize,
}

impl<'a> Sinks<'a> {
    /// No sinks; `placeholder` is any storage buffer (bound, never read).
    pub fn none(placeholder: &'a wgpu::Buffer) -> Self {
        Sinks {
            logits: placeholder,
            on: false,
            heads: 1,
            lq: 1,
        }
    }
}

/// A storage buffer of zeros to bind where a pass takes sinks and the problem has none.
pub fn no_sinks(gpu: &Gpu) -> wgpu::Buffer {
    gpu.upload("no sinks", &[0.0f32; 4], wgpu::BufferUsages::empty())
}

/// Softmax over each of `rows` rows of `cols` values in `scores`, in place. `Err(Unsupported)`
/// for rows longer than [`SOFTWARE_MAX_COLS`] on a software rasteriser.
pub fn dispatch(
    gpu: &Gpu,
    rows: usize,
    cols: usize,
    scores: &wgpu::Buffer,
    sinks: Sinks,
) -> Result<Dispatch> {
    if super::is_software(gpu) && cols > SOFTWARE_MAX_COLS {
        return Err(crate::error::Error::Unsupported {
            adapter: gpu.describe(),
            what: format!(
                "a softmax over {cols} keys (a software rasteriser stops a shader's loops after \
                 65,535 iterations; at most {SOFTWARE_MAX_COLS} keys here); leave the \
                 probabilities out so the fused path runs"
            ),
        });
    }
    let p = SoftmaxParams {
        sinks: sinks.on as u32,
        lq: sinks.lq.max(1) as u32,
        heads: sinks.heads.max(1) as u32,
        ..SoftmaxParams::new(
            rows as u32,
            cols as u32,
            gpu.limits().max_compute_workgroups_per_dimension,
        )
    };
    let slots = [Slot::Uniform(0), Slot::Write(4), Slot::Read(8)];
    let pass = gpu.compile("softmax", &PassSpec::main("softmax", &slots), source);
    let bindings = [(4, scores), (8, sinks.logits)];
    Dispatch::new(gpu, pass, &p, &bindings, p.workgroups())
}

#[cfg(test)]
mod tests {
    use super::SoftmaxParams;

    #[test]
    fn rows_past_one_dimension_spill_into_y() {
        assert_eq!(SoftmaxParams::new(10, 4, 65535).workgroups(), [10, 1, 1]);
        assert_eq!(
            SoftmaxParams::new(65535, 4, 65535).workgroups(),
            [65535, 1, 1]
        );
        assert_eq!(
            SoftmaxParams::new(65536, 4, 65535).workgroups(),
            [65535, 2, 1]
        );
    }
}
