//! Standalone runners: run **one** pass on host data and read its output back.
//!
//! Each function uploads its inputs, builds the pass's pipeline, records one dispatch, submits,
//! waits and returns the pass's output as a host `Vec<f32>`. They exist for per-pass tests and
//! for the benchmark (which times the same jobs repeatedly through [`crate::gpu::timer::PassTimer`]);
//! a forward through [`crate::MultiHeadAttention`] never uses them.
//!
//! Layouts (all row-major f32):
//! * `linear`: `x [m, k]`, `w [n, k]` (PyTorch `nn.Linear` weight), `bias [n]` → `y [m, n]`.
//! * attention core: `q [B, H, Lq, dk]`, `k [B, H, Lk, dk]`, `v [B, H, Lk, dv]` (head-split);
//!   `scores` → `[B, H, Lq, Lk]` (scaled and masked, before the softmax);
//!   `softmax` → same shape as its input `[rows, cols]`;
//!   `av_combine` (`probs [B, H, Lq, Lk]`, `v`) and `flash_attention` → combined heads
//!   `[B, Lq, H·dv]`.
//!
//! Masks follow [`Mask`] semantics exactly as in a forward (masked scores replaced by −1e9).
//! The `*_naive` functions run the unoptimised baselines in `shaders/baseline/` (no mask).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::timer::PassTimer;
use crate::gpu::Gpu;
use crate::kernels::{
    self, av_combine::AvParams, flash_attention::FlashParams, linear::LinearParams,
    linear::LinearVariant, linear::Segment, scores::ScoresParams, softmax::SoftmaxParams, Checks,
    MaskParams, Pass, Slot,
};
use crate::model::mask::{AttnDims, Mask};

/// Sizes of one attention-core problem on head-split inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreDims {
    pub batch: usize,
    pub heads: usize,
    pub lq: usize,
    pub lk: usize,
    /// Per-head width of queries and keys (`dk`).
    pub qk_head_dim: usize,
    /// Per-head width of values (`dv`).
    pub v_head_dim: usize,
}

impl CoreDims {
    fn q_len(&self) -> usize {
        self.batch * self.heads * self.lq * self.qk_head_dim
    }
    fn k_len(&self) -> usize {
        self.batch * self.heads * self.lk * self.qk_head_dim
    }
    fn v_len(&self) -> usize {
        self.batch * self.heads * self.lk * self.v_head_dim
    }
    fn scores_len(&self) -> usize {
        self.batch * self.heads * self.lq * self.lk
    }
    fn out_len(&self) -> usize {
        self.batch * self.lq * self.heads * self.v_head_dim
    }
    fn attn(&self) -> AttnDims {
        AttnDims {
            batch: self.batch,
            heads: self.heads,
            lq: self.lq,
            lk: self.lk,
        }
    }
    fn check(&self) -> Result<()> {
        let all = [
            self.batch,
            self.heads,
            self.lq,
            self.lk,
            self.qk_head_dim,
            self.v_head_dim,
        ];
        if all.contains(&0) {
            return Err(Error::Config(format!(
                "every size must be at least 1: {self:?}"
            )));
        }
        Ok(())
    }
}

/// `Y = X·Wᵀ (+ b)` with the optimised tiled GEMM: `x [m, k]`, `w [n, k]`, `bias [n]` → `[m, n]`.
pub fn linear(
    gpu: &Gpu,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<Vec<f32>> {
    Job::linear(gpu, x, w, bias, m, n, k, false)?.run_and_read(None)
}

/// [`linear`] with a chosen variant instead of the one a forward would pick. `Err` when the
/// variant cannot run here: `Unsupported` (e.g. `Subgroup` without SUBGROUP), or `Config`
/// when its preconditions fail (the vec4 variants need K % 4 == 0).
#[allow(clippy::too_many_arguments)]
pub fn linear_variant(
    gpu: &Gpu,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
    variant: LinearVariant,
) -> Result<Vec<f32>> {
    Job::linear_split(
        gpu,
        x,
        w,
        bias,
        m,
        k,
        m,
        &[(1, n)],
        LinearKernel::Variant(variant),
    )?
    .run_and_read(None)
}

/// `linear` into head-split layout, as the Q/K/V projections write: `x [batch·seq_len, k]`,
/// `w [n, k]` with `n = Σ heads·head_dim` over `segments` `(heads, head_dim)` (one to three),
/// output the segments one after another, each `[batch, heads, seq_len, head_dim]`.
/// `variant: None` picks as a forward does.
#[allow(clippy::too_many_arguments)]
pub fn linear_head_split(
    gpu: &Gpu,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    batch: usize,
    seq_len: usize,
    k: usize,
    segments: &[(usize, usize)],
    variant: Option<LinearVariant>,
) -> Result<Vec<f32>> {
    let kernel = variant.map_or(LinearKernel::Auto, LinearKernel::Variant);
    Job::linear_split(
        gpu,
        x,
        w,
        bias,
        batch * seq_len,
        k,
        seq_len,
        segments,
        kernel,
    )?
    .run_and_read(None)
}

/// Which kernel a standalone `linear` job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearKernel {
    /// The variant a forward would pick ([`kernels::linear::variant`]).
    Auto,
    /// This variant, or an error when it cannot run the problem here.
    Variant(LinearVariant),
    /// The naive baseline (`shaders/baseline/linear_naive.wgsl`).
    Naive,
}

/// The baseline of [`linear`]: one thread per output element, no tiling (same layouts).
pub fn linear_naive(
    gpu: &Gpu,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<Vec<f32>> {
    Job::linear(gpu, x, w, bias, m, n, k, true)?.run_and_read(None)
}

/// `scores` pass: `mask(scale · Q·Kᵀ)` → `[B, H, Lq, Lk]`.
pub fn scores(
    gpu: &Gpu,
    q: &[f32],
    k: &[f32],
    dims: CoreDims,
    scale: f32,
    mask: &Mask,
) -> Result<Vec<f32>> {
    Job::scores(gpu, q, k, dims, scale, mask)?.run_and_read(None)
}

/// `softmax` pass over each row of `s [rows, cols]` (max-subtracted) → `[rows, cols]`.
pub fn softmax(gpu: &Gpu, s: &[f32], rows: usize, cols: usize) -> Result<Vec<f32>> {
    Job::softmax(gpu, s, rows, cols)?.run_and_read(None)
}

/// `av_combine` pass: `probs [B, H, Lq, Lk] · v [B, H, Lk, dv]` → combined `[B, Lq, H·dv]`.
pub fn av_combine(gpu: &Gpu, probs: &[f32], v: &[f32], dims: CoreDims) -> Result<Vec<f32>> {
    Job::av_combine(gpu, probs, v, dims)?.run_and_read(None)
}

/// `flash_attention` pass (fused scores, mask, softmax and P·V) → combined `[B, Lq, H·dv]`.
pub fn flash_attention(
    gpu: &Gpu,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: CoreDims,
    scale: f32,
    mask: &Mask,
) -> Result<Vec<f32>> {
    Job::flash(gpu, q, k, v, dims, scale, mask)?.run_and_read(None)
}

/// The optimised multi-pass core (`scores` → `softmax` → `av_combine`) → `[B, Lq, H·dv]`.
pub fn attention_multipass(
    gpu: &Gpu,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: CoreDims,
    scale: f32,
    mask: &Mask,
) -> Result<Vec<f32>> {
    Job::multipass(gpu, q, k, v, dims, scale, mask)?.run_and_read(None)
}

/// The baseline multi-pass core (one thread per output, no tiling, no mask) → `[B, Lq, H·dv]`.
pub fn attention_naive(
    gpu: &Gpu,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: CoreDims,
    scale: f32,
) -> Result<Vec<f32>> {
    Job::naive_attention(gpu, q, k, v, dims, scale)?.run_and_read(None)
}

/// Checks the sizes and the head-split input lengths of an attention-core job.
fn check_qkv(
    gpu: &Gpu,
    dims: CoreDims,
    scores_buffer: bool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Result<()> {
    Job::check_core(gpu, dims, scores_buffer)?;
    expect_len("q", q.len(), dims.q_len())?;
    expect_len("k", k.len(), dims.k_len())?;
    expect_len("v", v.len(), dims.v_len())
}

fn expect_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::Config(format!(
            "{what} has {got} elements, expected {want}"
        )));
    }
    Ok(())
}

fn upload(gpu: &Gpu, label: &str, data: &[f32]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    let mut padded = data.to_vec();
    // At least 16 bytes, and whole vec4s so vec4 views of the buffer cover every element.
    padded.resize(data.len().max(4).next_multiple_of(4), 0.0);
    gpu.device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::cast_slice(&padded),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        })
}

fn output(gpu: &Gpu, label: &str, len: usize) -> wgpu::Buffer {
    gpu.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: (4 * len.max(4).next_multiple_of(4)) as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

fn check_buffer(gpu: &Gpu, what: &str, elems: usize) -> Result<()> {
    let limit = gpu
        .limits()
        .max_storage_buffer_binding_size
        .min(gpu.limits().max_buffer_size);
    let needed = 4 * elems as u64;
    if needed > limit {
        return Err(Error::TooLarge {
            what: what.into(),
            needed,
            limit,
        });
    }
    Ok(())
}

fn check_groups(gpu: &Gpu, groups: [u32; 3]) -> Result<()> {
    let max = gpu.limits().max_compute_workgroups_per_dimension;
    if groups.iter().any(|&g| g > max) {
        return Err(Error::TooLarge {
            what: format!("dispatch of {groups:?} workgroups"),
            needed: groups.iter().copied().max().unwrap_or(0) as u64,
            limit: max as u64,
        });
    }
    Ok(())
}

/// `[q | k | v]` packed into one buffer (the layout the attention passes read).
fn pack_qkv(q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let mut all = Vec::with_capacity(q.len() + k.len() + v.len());
    all.extend_from_slice(q);
    all.extend_from_slice(k);
    all.extend_from_slice(v);
    all
}

/// One or more dispatches on buffers that stay alive; can be run (and timed) repeatedly.
pub struct Job {
    gpu: Gpu,
    steps: Vec<(Arc<Pass>, wgpu::BindGroup, [u32; 3])>,
    _buffers: Vec<wgpu::Buffer>,
    result: wgpu::Buffer,
    result_len: usize,
    staging: wgpu::Buffer,
    /// Re-uploaded before each run when a pass works in place (softmax).
    restore: Option<(wgpu::Buffer, wgpu::Buffer, u64)>,
    /// The `linear` variant a linear job runs (`None`: another pass, or the naive GEMM).
    linear_variant: Option<LinearVariant>,
}

impl Job {
    fn new(
        gpu: &Gpu,
        steps: Vec<(Arc<Pass>, wgpu::BindGroup, [u32; 3])>,
        buffers: Vec<wgpu::Buffer>,
        result: wgpu::Buffer,
        result_len: usize,
    ) -> Self {
        let staging = gpu.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("standalone readback"),
            size: (4 * result_len.max(4)) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Job {
            gpu: gpu.clone(),
            steps,
            _buffers: buffers,
            result,
            result_len,
            staging,
            restore: None,
            linear_variant: None,
        }
    }

    /// The `linear` variant this job runs, if it is an optimised linear job.
    pub fn linear_variant(&self) -> Option<LinearVariant> {
        self.linear_variant
    }

    /// Number of dispatches one run records.
    pub fn passes(&self) -> u32 {
        self.steps.len() as u32
    }

    /// Records every dispatch (timed when a timer is given), submits and waits.
    pub fn run(&self, mut timer: Option<&mut PassTimer>) -> Result<Vec<(&'static str, f64)>> {
        self.gpu.scoped("standalone pass", || -> Result<_> {
            let mut encoder =
                self.gpu
                    .device()
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("standalone"),
                    });
            if let Some((src, dst, bytes)) = &self.restore {
                encoder.copy_buffer_to_buffer(src, 0, dst, 0, *bytes);
            }
            for (pass, bind, groups) in &self.steps {
                pass.dispatch(&mut encoder, bind, *groups, timer.as_deref_mut());
            }
            let bytes = 4 * self.result_len as u64;
            if bytes > 0 {
                encoder.copy_buffer_to_buffer(&self.result, 0, &self.staging, 0, bytes);
            }
            if let Some(t) = timer.as_deref() {
                t.resolve(&mut encoder);
            }
            self.gpu.queue().submit([encoder.finish()]);
            self.gpu.wait()?;
            match timer {
                Some(t) => t.read(&self.gpu),
                None => Ok(Vec::new()),
            }
        })?
    }

    /// The output of the last run.
    pub fn read(&self) -> Result<Vec<f32>> {
        self.gpu.read_f32(&self.staging, self.result_len)
    }

    fn run_and_read(&self, timer: Option<&mut PassTimer>) -> Result<Vec<f32>> {
        self.run(timer)?;
        self.read()
    }

    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        gpu: &Gpu,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        m: usize,
        n: usize,
        k: usize,
        naive: bool,
    ) -> Result<Self> {
        let kernel = if naive {
            LinearKernel::Naive
        } else {
            LinearKernel::Auto
        };
        Self::linear_split(gpu, x, w, bias, m, k, m, &[(1, n)], kernel)
    }

    /// `linear` over `rows = batch·seq_len` rows into head-split segments `(heads, head_dim)`,
    /// laid one after another, each `[batch, heads, seq_len, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_split(
        gpu: &Gpu,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        rows: usize,
        k: usize,
        seq_len: usize,
        segments: &[(usize, usize)],
        kernel: LinearKernel,
    ) -> Result<Self> {
        let n: usize = segments.iter().map(|&(h, d)| h * d).sum();
        if rows == 0 || n == 0 || k == 0 || seq_len == 0 || segments.iter().any(|s| s.1 == 0) {
            return Err(Error::Config(format!(
                "linear sizes must be at least 1: m {rows}, n {n}, k {k}, seq_len {seq_len}, \
                 segments {segments:?}"
            )));
        }
        if !rows.is_multiple_of(seq_len) || !(1..=3).contains(&segments.len()) {
            return Err(Error::Config(format!(
                "linear: {rows} rows are not whole sequences of {seq_len}, or not 1 to 3 \
                 segments ({segments:?})"
            )));
        }
        if kernel == LinearKernel::Naive && (segments != [(1, n)] || seq_len != rows) {
            return Err(Error::Config(
                "the naive linear writes a plain [m, n] output only".into(),
            ));
        }
        expect_len("x", x.len(), rows * k)?;
        expect_len("w", w.len(), n * k)?;
        if let Some(b) = bias {
            expect_len("bias", b.len(), n)?;
        }
        for (what, elems) in [("x", rows * k), ("w", n * k), ("y", rows * n)] {
            check_buffer(gpu, what, elems)?;
        }
        gpu.scoped("standalone linear", || {
            let device = gpu.device();
            let xb = upload(gpu, "x", x);
            let wb = upload(gpu, "w", w);
            let bb = upload(gpu, "bias", bias.unwrap_or(&[]));
            let yb = output(gpu, "y", rows * n);
            let mut chosen = None;
            let (pass, params, groups) = if kernel == LinearKernel::Naive {
                let p = NaiveLinearParams {
                    m: rows as u32,
                    n: n as u32,
                    k: k as u32,
                    has_bias: bias.is_some() as u32,
                };
                let pass = gpu.pass("linear_naive", || naive_linear_pass(device));
                (
                    pass,
                    kernels::uniform_buffer(device, "naive linear params", &p),
                    [n.div_ceil(16) as u32, rows.div_ceil(16) as u32, 1],
                )
            } else {
                let mut dst = 0;
                let segs: Vec<Segment> = segments
                    .iter()
                    .map(|&(heads, head_dim)| {
                        let seg = Segment {
                            heads: heads as u32,
                            head_dim: head_dim as u32,
                            dst: dst as u32,
                        };
                        dst += rows * heads * head_dim;
                        seg
                    })
                    .collect();
                let mut p = LinearParams::new(rows as u32, k as u32, seq_len as u32, &segs);
                p.has_bias = bias.is_some() as u32;
                let bound = kernels::linear::BoundElems::of(&xb, &wb, &bb, &yb);
                let variant = match kernel {
                    LinearKernel::Variant(v) => {
                        v.check(gpu, &p, &bound)?;
                        v
                    }
                    _ => kernels::linear::variant(gpu, &p, &bound),
                };
                chosen = Some(variant);
                let pass = kernels::linear::pass(gpu, variant);
                (
                    pass,
                    kernels::uniform_buffer(device, "linear params", &p),
                    kernels::linear::workgroups(&p, variant),
                )
            };
            check_groups(gpu, groups)?;
            let bind = pass.bind(device, &[&params, &xb, &wb, &bb, &yb]);
            let mut job = Job::new(
                gpu,
                vec![(pass, bind, groups)],
                vec![params, xb, wb, bb],
                yb,
                rows * n,
            );
            job.linear_variant = chosen;
            Ok(job)
        })?
    }

    fn scores_params(dims: CoreDims, scale: f32, mask: MaskParams) -> ScoresParams {
        ScoresParams {
            lq: dims.lq as u32,
            lk: dims.lk as u32,
            head_dim: dims.qk_head_dim as u32,
            heads: dims.heads as u32,
            q_offset: 0,
            k_offset: dims.q_len() as u32,
            scale,
            z_offset: 0,
            kv_stride: dims.lk as u32,
            _pad: [0; 3],
            mask,
        }
    }

    fn av_params(dims: CoreDims, v_offset: usize) -> AvParams {
        AvParams {
            lq: dims.lq as u32,
            lk: dims.lk as u32,
            head_dim: dims.v_head_dim as u32,
            heads: dims.heads as u32,
            v_offset: v_offset as u32,
            z_offset: 0,
            kv_stride: dims.lk as u32,
            _pad: 0,
        }
    }

    fn check_core(gpu: &Gpu, dims: CoreDims, scores: bool) -> Result<()> {
        dims.check()?;
        check_buffer(gpu, "q|k|v", dims.q_len() + dims.k_len() + dims.v_len())?;
        check_buffer(gpu, "output", dims.out_len())?;
        if scores {
            check_buffer(gpu, "scores [B, H, Lq, Lk]", dims.scores_len())?;
        }
        Ok(())
    }

    pub fn scores(
        gpu: &Gpu,
        q: &[f32],
        k: &[f32],
        dims: CoreDims,
        scale: f32,
        mask: &Mask,
    ) -> Result<Self> {
        Self::check_core(gpu, dims, true)?;
        expect_len("q", q.len(), dims.q_len())?;
        expect_len("k", k.len(), dims.k_len())?;
        let resolved = mask.resolve(dims.attn())?;
        gpu.scoped("standalone scores", || {
            let device = gpu.device();
            let qk = upload(gpu, "q|k", &pack_qkv(q, k, &[]));
            let mask_buf = upload(gpu, "mask", bytemuck::cast_slice(&resolved.words));
            let s = output(gpu, "scores", dims.scores_len());
            let p = Self::scores_params(dims, scale, MaskParams::from_resolved(&resolved));
            let params = kernels::uniform_buffer(device, "scores params", &p);
            let pass = kernels::scores::pass(gpu);
            let groups = kernels::scores::workgroups(&p, (dims.batch * dims.heads) as u32);
            check_groups(gpu, groups)?;
            let bind = pass.bind(device, &[&params, &qk, &s, &mask_buf]);
            Ok(Job::new(
                gpu,
                vec![(pass, bind, groups)],
                vec![params, qk, mask_buf],
                s,
                dims.scores_len(),
            ))
        })?
    }

    pub fn softmax(gpu: &Gpu, s: &[f32], rows: usize, cols: usize) -> Result<Self> {
        if rows == 0 || cols == 0 {
            return Err(Error::Config(format!(
                "softmax sizes must be at least 1: rows {rows}, cols {cols}"
            )));
        }
        expect_len("s", s.len(), rows * cols)?;
        check_buffer(gpu, "s", rows * cols)?;
        gpu.scoped("standalone softmax", || {
            let device = gpu.device();
            let original = upload(gpu, "s (input)", s);
            let work = output(gpu, "s (in place)", rows * cols);
            let p = SoftmaxParams::new(
                rows as u32,
                cols as u32,
                gpu.limits().max_compute_workgroups_per_dimension,
            );
            let params = kernels::uniform_buffer(device, "softmax params", &p);
            let pass = kernels::softmax::pass(gpu);
            let groups = kernels::softmax::workgroups(&p);
            check_groups(gpu, groups)?;
            let bind = pass.bind(device, &[&params, &work]);
            let mut job = Job::new(
                gpu,
                vec![(pass, bind, groups)],
                vec![params],
                work.clone(),
                rows * cols,
            );
            // softmax works in place: every run starts again from the input.
            job.restore = Some((original, work, (4 * rows * cols) as u64));
            Ok(job)
        })?
    }

    pub fn av_combine(gpu: &Gpu, probs: &[f32], v: &[f32], dims: CoreDims) -> Result<Self> {
        Self::check_core(gpu, dims, true)?;
        expect_len("probs", probs.len(), dims.scores_len())?;
        expect_len("v", v.len(), dims.v_len())?;
        gpu.scoped("standalone av_combine", || {
            let device = gpu.device();
            let pb = upload(gpu, "probs", probs);
            let vb = upload(gpu, "v", v);
            let out = output(gpu, "combined", dims.out_len());
            let p = Self::av_params(dims, 0);
            let params = kernels::uniform_buffer(device, "av params", &p);
            let pass = kernels::av_combine::pass(gpu);
            let groups = kernels::av_combine::workgroups(&p, (dims.batch * dims.heads) as u32);
            check_groups(gpu, groups)?;
            let bind = pass.bind(device, &[&params, &pb, &vb, &out]);
            Ok(Job::new(
                gpu,
                vec![(pass, bind, groups)],
                vec![params, pb, vb],
                out,
                dims.out_len(),
            ))
        })?
    }

    pub fn flash(
        gpu: &Gpu,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: CoreDims,
        scale: f32,
        mask: &Mask,
    ) -> Result<Self> {
        check_qkv(gpu, dims, false, q, k, v)?;
        let resolved = mask.resolve(dims.attn())?;
        let Some(tile) = kernels::flash_attention::kv_tile(
            dims.qk_head_dim,
            dims.v_head_dim,
            gpu.limits().max_compute_workgroup_storage_size,
        ) else {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: format!(
                    "fused attention with head sizes q/k {} + v {}",
                    dims.qk_head_dim, dims.v_head_dim
                ),
            });
        };
        gpu.scoped("standalone flash_attention", || {
            let device = gpu.device();
            let qkv = upload(gpu, "q|k|v", &pack_qkv(q, k, v));
            let mask_buf = upload(gpu, "mask", bytemuck::cast_slice(&resolved.words));
            let out = output(gpu, "combined", dims.out_len());
            let base = FlashParams {
                lq: dims.lq as u32,
                lk: dims.lk as u32,
                heads: dims.heads as u32,
                scale,
                q_offset: 0,
                k_offset: dims.q_len() as u32,
                v_offset: (dims.q_len() + dims.k_len()) as u32,
                z_offset: 0,
                kv_stride: dims.lk as u32,
                tile_begin: 0,
                tile_end: 0,
                carry_flags: 0,
                mask: MaskParams::from_resolved(&resolved),
            };
            // Key ranges split over dispatches exactly as a forward splits them (see
            // `tiles_per_dispatch`), so what is timed is what a forward runs.
            let software = gpu.info().device_type == wgpu::DeviceType::Cpu;
            let per_dispatch = kernels::flash_attention::tiles_per_dispatch(
                dims.qk_head_dim,
                dims.v_head_dim,
                tile,
                kernels::flash_attention::rows_per_thread(gpu),
                software,
            );
            let ranges = kernels::flash_attention::key_ranges(dims.lk, tile, per_dispatch);
            let carry_len = if ranges.len() > 1 {
                dims.batch
                    * dims.heads
                    * dims.lq
                    * kernels::flash_attention::carry_stride(dims.v_head_dim)
            } else {
                1
            };
            let carry = output(gpu, "flash carry", carry_len);
            let pass =
                kernels::flash_attention::pass(gpu, dims.qk_head_dim, dims.v_head_dim, tile, false);
            let groups = kernels::flash_attention::workgroups(
                &base,
                (dims.batch * dims.heads) as u32,
                kernels::flash_attention::rows_per_thread(gpu),
            );
            check_groups(gpu, groups)?;
            let mut steps = Vec::with_capacity(ranges.len());
            let mut buffers = Vec::with_capacity(ranges.len() + 3);
            for (tile_begin, tile_end, carry_flags) in ranges {
                let p = FlashParams {
                    tile_begin,
                    tile_end,
                    carry_flags,
                    ..base
                };
                let params = kernels::uniform_buffer(device, "flash params", &p);
                let bind = pass.bind(device, &[&params, &qkv, &out, &carry, &mask_buf]);
                steps.push((pass.clone(), bind, groups));
                buffers.push(params);
            }
            buffers.extend([qkv, mask_buf, carry]);
            Ok(Job::new(gpu, steps, buffers, out, dims.out_len()))
        })?
    }

    pub fn multipass(
        gpu: &Gpu,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: CoreDims,
        scale: f32,
        mask: &Mask,
    ) -> Result<Self> {
        check_qkv(gpu, dims, true, q, k, v)?;
        let resolved = mask.resolve(dims.attn())?;
        gpu.scoped("standalone multi-pass attention", || {
            let device = gpu.device();
            let bh = (dims.batch * dims.heads) as u32;
            let qkv = upload(gpu, "q|k|v", &pack_qkv(q, k, v));
            let mask_buf = upload(gpu, "mask", bytemuck::cast_slice(&resolved.words));
            let s = output(gpu, "scores", dims.scores_len());
            let out = output(gpu, "combined", dims.out_len());
            let sp = Self::scores_params(dims, scale, MaskParams::from_resolved(&resolved));
            let sp_buf = kernels::uniform_buffer(device, "scores params", &sp);
            let scores = kernels::scores::pass(gpu);
            let s_groups = kernels::scores::workgroups(&sp, bh);
            let s_bind = scores.bind(device, &[&sp_buf, &qkv, &s, &mask_buf]);
            let mp = SoftmaxParams::new(
                (dims.batch * dims.heads * dims.lq) as u32,
                dims.lk as u32,
                gpu.limits().max_compute_workgroups_per_dimension,
            );
            let mp_buf = kernels::uniform_buffer(device, "softmax params", &mp);
            let softmax = kernels::softmax::pass(gpu);
            let m_groups = kernels::softmax::workgroups(&mp);
            let m_bind = softmax.bind(device, &[&mp_buf, &s]);
            let ap = Self::av_params(dims, dims.q_len() + dims.k_len());
            let ap_buf = kernels::uniform_buffer(device, "av params", &ap);
            let av = kernels::av_combine::pass(gpu);
            let a_groups = kernels::av_combine::workgroups(&ap, bh);
            let a_bind = av.bind(device, &[&ap_buf, &s, &qkv, &out]);
            for g in [s_groups, m_groups, a_groups] {
                check_groups(gpu, g)?;
            }
            Ok(Job::new(
                gpu,
                vec![
                    (scores, s_bind, s_groups),
                    (softmax, m_bind, m_groups),
                    (av, a_bind, a_groups),
                ],
                vec![sp_buf, mp_buf, ap_buf, qkv, mask_buf, s],
                out,
                dims.out_len(),
            ))
        })?
    }

    pub fn naive_attention(
        gpu: &Gpu,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: CoreDims,
        scale: f32,
    ) -> Result<Self> {
        check_qkv(gpu, dims, true, q, k, v)?;
        gpu.scoped("standalone naive attention", || {
            let device = gpu.device();
            let bh = (dims.batch * dims.heads) as u32;
            let qkv = upload(gpu, "q|k|v", &pack_qkv(q, k, v));
            let s = output(gpu, "scores", dims.scores_len());
            let out = output(gpu, "combined", dims.out_len());
            let rows = dims.batch * dims.heads * dims.lq;
            let p = NaiveAttnParams {
                lq: dims.lq as u32,
                lk: dims.lk as u32,
                dk: dims.qk_head_dim as u32,
                dv: dims.v_head_dim as u32,
                heads: dims.heads as u32,
                rows: rows as u32,
                q_offset: 0,
                k_offset: dims.q_len() as u32,
                v_offset: (dims.q_len() + dims.k_len()) as u32,
                scale,
                _pad: [0; 2],
            };
            let params = kernels::uniform_buffer(device, "naive attention params", &p);
            let slots = [
                Slot::Uniform(0),
                Slot::Read(1),
                Slot::Write(4),
                Slot::Write(5),
            ];
            let make = |label: &'static str, entry: &str| {
                gpu.pass(label, || {
                    Pass::build(
                        device,
                        label,
                        NAIVE_ATTENTION_WGSL,
                        entry,
                        Checks::Checked,
                        &slots,
                    )
                })
            };
            let passes = [
                (
                    make("scores_naive", "scores_main"),
                    [dims.lk.div_ceil(16) as u32, dims.lq.div_ceil(16) as u32, bh],
                ),
                (
                    make("softmax_naive", "softmax_main"),
                    [rows.div_ceil(64) as u32, 1, 1],
                ),
                (
                    make("av_naive", "av_main"),
                    [
                        dims.v_head_dim.div_ceil(16) as u32,
                        dims.lq.div_ceil(16) as u32,
                        bh,
                    ],
                ),
            ];
            let mut steps = Vec::new();
            for (pass, groups) in passes {
                check_groups(gpu, groups)?;
                let bind = pass.bind(device, &[&params, &qkv, &s, &out]);
                steps.push((pass, bind, groups));
            }
            Ok(Job::new(
                gpu,
                steps,
                vec![params, qkv, s],
                out,
                dims.out_len(),
            ))
        })?
    }
}

/// The baseline GEMM of the benchmark (`shaders/baseline/linear_naive.wgsl`).
pub const NAIVE_LINEAR_WGSL: &str = include_str!("../../shaders/baseline/linear_naive.wgsl");
/// The baseline attention core (`shaders/baseline/attention_naive.wgsl`).
pub const NAIVE_ATTENTION_WGSL: &str = include_str!("../../shaders/baseline/attention_naive.wgsl");

/// Mirrors `NaiveLinearParams` in `linear_naive.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct NaiveLinearParams {
    m: u32,
    n: u32,
    k: u32,
    has_bias: u32,
}

/// Mirrors `NaiveAttnParams` in `attention_naive.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct NaiveAttnParams {
    lq: u32,
    lk: u32,
    dk: u32,
    dv: u32,
    heads: u32,
    rows: u32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    scale: f32,
    _pad: [u32; 2],
}

fn naive_linear_pass(device: &wgpu::Device) -> Pass {
    Pass::new(
        device,
        "linear_naive",
        NAIVE_LINEAR_WGSL,
        &[
            Slot::Uniform(0),
            Slot::Read(1),
            Slot::Read(2),
            Slot::Read(3),
            Slot::Write(4),
        ],
    )
}
