//! The unoptimised baselines the benchmark measures speed-ups against (`shaders/baseline/`):
//! one thread per output, no tiling, no reuse, no mask. Never used by a forward.

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;

use super::CoreProblem;

/// The baseline GEMM (`Y[M, N] = X·Wᵀ + b`).
pub const LINEAR_WGSL: &str = include_str!("../../shaders/baseline/linear_naive.wgsl");
/// The baseline attention core (three entry points over the same bindings).
pub const ATTENTION_WGSL: &str = include_str!("../../shaders/baseline/attention_naive.wgsl");

/// Mirrors `NaiveLinearParams` in `linear_naive.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct NaiveLinearParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub has_bias: u32,
}

/// Mirrors `NaiveAttnParams` in `attention_naive.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct NaiveAttnParams {
    pub lq: u32,
    pub lk: u32,
    pub dk: u32,
    pub dv: u32,
    pub heads: u32,
    pub rows: u32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub scale: f32,
    pub _pad0: u32,
    pub _pad1: u32,
}

/// What the naive GEMM reads and writes (`bias` is read only when `has_bias`).
pub struct NaiveLinearBuffers<'a> {
    pub x: &'a wgpu::Buffer,
    pub w: &'a wgpu::Buffer,
    pub bias: &'a wgpu::Buffer,
    pub y: &'a wgpu::Buffer,
}

/// `y [m, n] = x [m, k] · w [n, k]ᵀ (+ bias)`, one 16×16 workgroup per 16×16 outputs.
pub fn linear(
    gpu: &Gpu,
    (m, n, k): (usize, usize, usize),
    has_bias: bool,
    b: NaiveLinearBuffers,
) -> Result<Dispatch> {
    let p = NaiveLinearParams {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        has_bias: has_bias as u32,
    };
    let slots = [
        Slot::Uniform(0),
        Slot::Read(1),
        Slot::Read(2),
        Slot::Read(3),
        Slot::Write(4),
    ];
    let pass = gpu.compile(
        "linear_naive",
        &PassSpec::main("linear_naive", &slots),
        || LINEAR_WGSL.to_string(),
    );
    let groups = [n.div_ceil(16) as u32, m.div_ceil(16) as u32, 1];
    Dispatch::new(
        gpu,
        pass,
        &p,
        &[(1, b.x), (2, b.w), (3, b.bias), (4, b.y)],
        groups,
    )
}

/// What the naive core reads and writes.
pub struct NaiveAttentionBuffers<'a> {
    pub qkv: &'a wgpu::Buffer,
    pub scores: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
}

/// Scores, softmax and `P·V` as three dispatches (no mask).
pub fn attention(gpu: &Gpu, c: &CoreProblem, b: NaiveAttentionBuffers) -> Result<Vec<Dispatch>> {
    let rows = c.batch * c.heads * c.lq;
    let p = NaiveAttnParams {
        lq: c.lq as u32,
        lk: c.lk as u32,
        dk: c.qk_head_dim as u32,
        dv: c.v_head_dim as u32,
        heads: c.heads as u32,
        rows: rows as u32,
        q_offset: c.layout.q.offset,
        k_offset: c.layout.k.offset,
        v_offset: c.layout.v.offset,
        scale: c.scale,
        ..Default::default()
    };
    let bh = c.batch_heads();
    let steps: [(&'static str, &str, [u32; 3]); 3] = [
        (
            "scores_naive",
            "scores_main",
            [c.lk.div_ceil(16) as u32, c.lq.div_ceil(16) as u32, bh],
        ),
        (
            "softmax_naive",
            "softmax_main",
            [rows.div_ceil(64) as u32, 1, 1],
        ),
        (
            "av_naive",
            "av_main",
            [
                c.v_head_dim.div_ceil(16) as u32,
                c.lq.div_ceil(16) as u32,
                bh,
            ],
        ),
    ];
    steps
        .into_iter()
        .map(|(label, entry, groups)| {
            let slots = [
                Slot::Uniform(0),
                Slot::Read(1),
                Slot::Write(4),
                Slot::Write(5),
            ];
            let spec = PassSpec {
                entry,
                ..PassSpec::main(label, &slots)
            };
            let pass = gpu.compile(label, &spec, || ATTENTION_WGSL.to_string());
            let buffers = [(1, b.qkv), (4, b.scores), (5, b.out)];
            Dispatch::new(gpu, pass, &p, &buffers, groups)
        })
        .collect()
}
