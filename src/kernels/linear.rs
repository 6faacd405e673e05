//! `linear`: `Y = X·Wᵀ + b`, tiled GEMM writing straight into head-split layout.

use super::{Pass, Slot, GEMM_TILE_WGSL};

pub const WGSL: &str = include_str!("../../shaders/linear.wgsl");

/// Mirrors `LinearParams` in `linear.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LinearParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub seq_len: u32,
    pub x_offset: u32,
    pub w_offset: u32,
    pub bias_offset: u32,
    pub has_bias: u32,
    pub dst_seq_len: u32,
    pub dst_pos: u32,
    pub _pad: [u32; 2],
    pub seg_start: [u32; 4],
    pub seg_head_dim: [u32; 4],
    pub seg_heads: [u32; 4],
    pub seg_dst: [u32; 4],
}

/// One output segment: `heads` heads of width `head_dim`, head-split at element `dst`.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub heads: u32,
    pub head_dim: u32,
    pub dst: u32,
}

impl LinearParams {
    /// `rows = batch·seq_len` rows of width `k`, into up to three segments (in column order).
    /// A plain `[rows, n]` output is `Segment { heads: 1, head_dim: n, dst }`.
    pub fn new(rows: u32, k: u32, seq_len: u32, segments: &[Segment]) -> Self {
        assert!((1..=3).contains(&segments.len()), "one to three segments");
        let mut p = LinearParams {
            m: rows,
            k,
            seq_len: seq_len.max(1),
            dst_seq_len: seq_len.max(1),
            ..Default::default()
        };
        let mut start = 0;
        for s in 0..3 {
            // Unused segments start past every column, so no column selects them.
            let seg = segments.get(s);
            p.seg_start[s] = if seg.is_some() { start } else { u32::MAX };
            if let Some(seg) = seg {
                p.seg_head_dim[s] = seg.head_dim;
                p.seg_heads[s] = seg.heads;
                p.seg_dst[s] = seg.dst;
                start += seg.heads * seg.head_dim;
            }
        }
        p.seg_start[3] = u32::MAX;
        p.n = start;
        p
    }
}

pub(crate) fn pass(device: &wgpu::Device) -> Pass {
    let source = format!("{GEMM_TILE_WGSL}\n{WGSL}");
    Pass::new(
        device,
        "linear",
        &source,
        &[Slot::Uniform(0), Slot::Read(1), Slot::Read(2), Slot::Read(3), Slot::Write(4)],
    )
}

/// 64×64 output tiles.
pub fn workgroups(p: &LinearParams) -> [u32; 3] {
    [p.n.div_ceil(64), p.m.div_ceil(64), 1]
}
