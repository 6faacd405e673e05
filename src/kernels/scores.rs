//! `scores`: `S = mask(scale · Q·Kᵀ)` per (batch, head), `[B, H, Lq, Lk]`.

use crate::error::Result;
use crate::gpu::pass::Slot::{Read, Uniform, Write};
use crate::gpu::pass::{Binding, Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;

use super::mask::MaskBuffers;
use super::source::Prelude;
use super::{gemm_prelude, CoreProblem, QkvBuffers, RowStrides, GEMM_TILE, GEMM_TILE_WGSL};

pub const WGSL: &str = include_str!("../../shaders/scores.wgsl");
/// The entry point of the per-(batch, head) GEMMs (`scores`, `av_combine`), after the GEMM
/// tile; the body supplies `out_cols` and `epilogue`.
pub const GEMM_HEADS_WGSL: &str = include_str!("../../shaders/gemm_heads.wgsl");

/// Mirrors `ScoresParams` in `scores.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ScoresParams {
    /// Where Q's and K's rows lie.
    pub q: RowStrides,
    pub k: RowStrides,
    pub lq: u32,
    pub lk: u32,
    pub head_dim: u32,
    pub heads: u32,
    pub scale: f32,
    pub z_offset: u32,
    pub k_begin: u32,
    pub k_end: u32,
    /// Query heads per key head (see [`crate::kernels::QkvLayout::kv_group`]).
    pub kv_group: u32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

impl ScoresParams {
    pub fn new(c: &CoreProblem) -> Self {
        ScoresParams {
            lq: c.lq as u32,
            lk: c.lk as u32,
            head_dim: c.qk_head_dim as u32,
            heads: c.heads as u32,
            q: c.layout.q,
            k: c.layout.k,
            scale: c.scale,
            k_end: c.qk_head_dim as u32,
            kv_group: c.layout.kv_group,
            ..Default::default()
        }
    }
}

/// What the pass reads and writes.
pub struct ScoresBuffers<'a> {
    /// Head-split Q and K at the problem's offsets (V is not read).
    pub qkv: QkvBuffers<'a>,
    /// `[B, H, Lq, Lk]`.
    pub scores: &'a wgpu::Buffer,
    pub mask: &'a MaskBuffers,
}

/// The full source: prelude, shared GEMM tile and entry point, mask rule, body.
pub fn source() -> String {
    let prelude = super::mask::prelude(gemm_prelude(Prelude::new()));
    prelude.source(&[
        super::ROWS_WGSL,
        GEMM_TILE_WGSL,
        GEMM_HEADS_WGSL,
        super::mask::WGSL,
        WGSL,
    ])
}

/// Bindings: params, Q, K, scores, mask words, mask params.
pub(crate) const SLOTS: &[Slot] = &[Uniform(0), Read(1), Read(2), Write(4), Read(6), Uniform(7)];

/// 64×64 tiles of `[Lq, Lk]`, one z layer per (batch, head); one dispatch per range of the
/// head dimension (see `kernels::depth_split`), the last one scaling and masking.
pub fn dispatches(gpu: &Gpu, c: &CoreProblem, b: ScoresBuffers) -> Result<Vec<Dispatch>> {
    let p = ScoresParams::new(c);
    let groups = [
        p.lk.div_ceil(GEMM_TILE),
        p.lq.div_ceil(GEMM_TILE),
        c.batch_heads(),
    ];
    let [words, params] = b.mask.bindings();
    let pass = gpu.compile("scores", &PassSpec::main("scores", SLOTS), source);
    let at = |k_begin, k_end| ScoresParams {
        k_begin,
        k_end,
        ..p
    };
    let r = &c.layout.ranges;
    let buffers = [
        (1, Binding::new(b.qkv.q, r.q)),
        (2, Binding::new(b.qkv.k, r.k)),
        (4, b.scores.into()),
        (words.0, words.1.into()),
        (params.0, params.1.into()),
    ];
    super::depth_split(gpu, &pass, p.head_dim, at, &buffers, groups)
}
