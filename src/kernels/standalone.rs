//! Standalone runners: run **one** pass (or the attention core) on host data and read its
//! output back. Each is a thin [`Job`] over the same kernel constructors a forward uses, for
//! per-pass tests and for the benchmark (which times a job repeatedly); a forward through
//! [`crate::MultiHeadAttention`] never uses them.
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

mod decode_job;
pub use decode_job::StoredKv;

use crate::error::{Error, Result};
use crate::gpu::pass::Dispatch;
use crate::gpu::timer::PassTimer;
use crate::gpu::Gpu;
use crate::kernels::linear::{LinearBuffers, LinearElems, LinearParams, LinearVariant, Segment};
use crate::kernels::mask::{EncodedMask, MaskBuffers};
pub use crate::kernels::CoreDims;
use crate::kernels::{
    av_combine, flash_attention, naive, read_probe, scores, softmax, CoreProblem, QkvBuffers,
    QkvLayout,
};
use crate::model::mask::{AttnDims, Mask};

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
    fn attn(&self) -> AttnDims {
        AttnDims {
            batch: self.batch,
            heads: self.heads,
            lq: self.lq,
            lk: self.lk,
        }
    }
    /// The kernels' problem, with `[q | k | v]` packed in one buffer.
    fn problem(&self, scale: f32) -> CoreProblem {
        CoreProblem::head_split(
            *self,
            scale,
            QkvLayout {
                q_offset: 0,
                k_offset: self.q_len() as u32,
                v_offset: (self.q_len() + self.k_len()) as u32,
                kv_stride: self.lk as u32,
                kv_group: 1,
            },
        )
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
            return Err(Error::Misuse(format!(
                "every size must be at least 1: {self:?}"
            )));
        }
        Ok(())
    }
}

/// `Y = X·Wᵀ (+ b)`: `x [m, k]`, `w [n, k]`, `bias [n]` → `[m, n]`, with the kernel a forward
/// would pick, a chosen variant (`Err` when it cannot run here: `Unsupported`, e.g. `Subgroup`
/// without SUBGROUP, or `Misuse` when its preconditions fail), or the naive baseline.
pub fn linear(
    gpu: &Gpu,
    (x, w, bias): (&[f32], &[f32], Option<&[f32]>),
    (m, n, k): (usize, usize, usize),
    kernel: LinearKernel,
) -> Result<Vec<f32>> {
    Job::linear(gpu, x, w, bias, (m, n, k), kernel)?.run_and_read()
}

/// `linear` into head-split layout, as the Q/K/V projections write: `x [rows, k]`,
/// `w [n, k]` with `n = Σ heads·head_dim` over the segments (see [`HeadSplit`]).
pub fn linear_head_split(
    gpu: &Gpu,
    (x, w, bias): (&[f32], &[f32], Option<&[f32]>),
    (rows, k): (usize, usize),
    split: HeadSplit,
    kernel: LinearKernel,
) -> Result<Vec<f32>> {
    Job::linear_split(gpu, x, w, bias, (rows, k), split, kernel)?.run_and_read()
}

/// An attention-core job's output (see [`Core`] for what each reads and returns). Masks
/// follow forward semantics; the naive core ignores them.
pub fn core(
    gpu: &Gpu,
    core: Core,
    inputs: (&[f32], &[f32], &[f32]),
    dims: CoreDims,
    scale: f32,
    mask: &Mask,
) -> Result<Vec<f32>> {
    Job::core(gpu, core, inputs, dims, scale, mask)?.run_and_read()
}

/// `softmax` pass over each row of `s [rows, cols]` (max-subtracted) → `[rows, cols]`.
pub fn softmax(gpu: &Gpu, s: &[f32], rows: usize, cols: usize) -> Result<Vec<f32>> {
    Job::softmax(gpu, s, rows, cols)?.run_and_read()
}

/// Which kernel a standalone `linear` job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearKernel {
    /// The variant a forward would pick ([`crate::kernels::linear::variant`]).
    Auto,
    /// This variant, or an error when it cannot run the problem here.
    Variant(LinearVariant),
    /// The naive baseline (`shaders/baseline/linear_naive.wgsl`).
    Naive,
}

/// Which attention-core passes a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Core {
    /// `scores` alone: `q`, `k` in, `[B, H, Lq, Lk]` (scaled, masked) out.
    Scores,
    /// `av_combine` alone: probabilities `[B, H, Lq, Lk]` (in the `q` slot) and `v` in.
    /// It and every core below return combined heads `[B, Lq, H·dv]`.
    AvCombine,
    /// `flash_attention`, its key ranges split as a forward splits them.
    Fused,
    /// `scores` → `softmax` → `av_combine`.
    MultiPass,
    /// The naive baseline core.
    Naive,
}

/// How a linear job lays its output out: `segments` `(heads, head_dim)` of sequences of
/// `seq_len` rows, one after another, each `[batch, heads, seq_len, head_dim]`.
#[derive(Debug, Clone, Copy)]
pub struct HeadSplit<'a> {
    pub seq_len: usize,
    pub segments: &'a [(usize, usize)],
}

fn expect_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::Misuse(format!(
            "{what} has {got} elements, expected {want}"
        )));
    }
    Ok(())
}

/// One or more dispatches on buffers that stay alive; can be run (and timed) repeatedly.
pub struct Job {
    gpu: Gpu,
    steps: Vec<Dispatch>,
    _buffers: Vec<wgpu::Buffer>,
    result: wgpu::Buffer,
    result_len: usize,
    staging: wgpu::Buffer,
    /// Re-uploaded before each run when a pass works in place (softmax).
    restore: Option<(wgpu::Buffer, u64)>,
    /// The `linear` variant a linear job runs (`None`: another pass, or the naive GEMM).
    linear_variant: Option<LinearVariant>,
}

impl Job {
    fn new(
        gpu: &Gpu,
        steps: Vec<Dispatch>,
        buffers: Vec<wgpu::Buffer>,
        result: wgpu::Buffer,
        result_len: usize,
    ) -> Self {
        Job {
            gpu: gpu.clone(),
            steps,
            _buffers: buffers,
            result,
            result_len,
            staging: gpu.staging("standalone readback", 4 * result_len as u64),
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
            let mut encoder = self.gpu.encoder("standalone");
            if let Some((src, bytes)) = &self.restore {
                encoder.copy_buffer_to_buffer(src, 0, &self.result, 0, *bytes);
            }
            for step in &self.steps {
                step.record(&mut encoder, timer.as_deref_mut());
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

    fn run_and_read(&self) -> Result<Vec<f32>> {
        self.run(None)?;
        self.read()
    }

    /// A plain `[m, n]` linear job.
    pub fn linear(
        gpu: &Gpu,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        (m, n, k): (usize, usize, usize),
        kernel: LinearKernel,
    ) -> Result<Self> {
        let split = HeadSplit {
            seq_len: m,
            segments: &[(1, n)],
        };
        Self::linear_split(gpu, x, w, bias, (m, k), split, kernel)
    }

    /// `linear` over `rows` rows of width `k` into head-split segments.
    pub fn linear_split(
        gpu: &Gpu,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        (rows, k): (usize, usize),
        split: HeadSplit,
        kernel: LinearKernel,
    ) -> Result<Self> {
        let HeadSplit { seq_len, segments } = split;
        let n: usize = segments.iter().map(|&(h, d)| h * d).sum();
        if rows == 0 || n == 0 || k == 0 || seq_len == 0 || segments.iter().any(|s| s.1 == 0) {
            return Err(Error::Misuse(format!(
                "linear sizes must be at least 1: m {rows}, n {n}, k {k}, seq_len {seq_len}, \
                 segments {segments:?}"
            )));
        }
        if !rows.is_multiple_of(seq_len) || !(1..=3).contains(&segments.len()) {
            return Err(Error::Misuse(format!(
                "linear: {rows} rows are not whole sequences of {seq_len}, or not 1 to 3 \
                 segments ({segments:?})"
            )));
        }
        let plain = segments == [(1, n)] && seq_len == rows;
        if kernel == LinearKernel::Naive && !plain {
            return Err(Error::Misuse(
                "the naive linear writes a plain [m, n] output only".into(),
            ));
        }
        expect_len("x", x.len(), rows * k)?;
        expect_len("w", w.len(), n * k)?;
        if let Some(b) = bias {
            expect_len("bias", b.len(), n)?;
        }
        for (what, elems) in [("x", rows * k), ("w", n * k), ("y", rows * n)] {
            gpu.check_fits(what, 4 * elems as u64)?;
        }
        gpu.scoped("standalone linear", || {
            let none = wgpu::BufferUsages::empty();
            let xb = gpu.upload("x", x, none);
            let wb = gpu.upload("w", w, none);
            let bb = gpu.upload("bias", bias.unwrap_or(&[]), none);
            let yb = gpu.storage("y", 4 * (rows * n) as u64, wgpu::BufferUsages::COPY_SRC);
            let (steps, variant) = match kernel {
                LinearKernel::Naive => {
                    let b = naive::NaiveLinearBuffers {
                        x: &xb,
                        w: &wb,
                        bias: &bb,
                        y: &yb,
                    };
                    (
                        vec![naive::linear(gpu, (rows, n, k), bias.is_some(), b)?],
                        None,
                    )
                }
                LinearKernel::Auto | LinearKernel::Variant(_) => {
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
                    let p = LinearParams::new(rows as u32, k as u32, seq_len as u32, &segs)
                        .weights_at(0, 0, bias.is_some());
                    let request = match kernel {
                        LinearKernel::Variant(v) => Some(v),
                        _ => None,
                    };
                    let buffers = LinearBuffers {
                        x: &xb,
                        w: &wb,
                        bias: Some(&bb),
                        y: &yb,
                    };
                    let (d, v) = crate::kernels::linear::dispatch(
                        gpu,
                        LinearElems::F32,
                        request,
                        &p,
                        buffers,
                    )?;
                    (d, Some(v))
                }
            };
            let mut job = Job::new(gpu, steps, vec![xb, wb, bb], yb, rows * n);
            job.linear_variant = variant;
            Ok(job)
        })?
    }

    /// An attention-core job. `inputs` are `(q, k, v)`; for [`Core::AvCombine`] the
    /// probabilities take `q`'s place and `k` is empty, for [`Core::Scores`] `v` is empty.
    pub fn core(
        gpu: &Gpu,
        core: Core,
        (q, k, v): (&[f32], &[f32], &[f32]),
        dims: CoreDims,
        scale: f32,
        mask: &Mask,
    ) -> Result<Self> {
        dims.check()?;
        let c = dims.problem(scale);
        let scores_len = c.scores_len();
        let (want_q, want_k, want_v) = match core {
            Core::Scores => (dims.q_len(), dims.k_len(), 0),
            Core::AvCombine => (scores_len, 0, dims.v_len()),
            _ => (dims.q_len(), dims.k_len(), dims.v_len()),
        };
        let q_name = if core == Core::AvCombine {
            "probs"
        } else {
            "q"
        };
        expect_len(q_name, q.len(), want_q)?;
        expect_len("k", k.len(), want_k)?;
        expect_len("v", v.len(), want_v)?;
        let encoded = EncodedMask::new(mask, dims.attn())?;
        gpu.check_fits("q|k|v", 4 * (want_q + want_k + want_v) as u64)?;
        gpu.check_fits("output", 4 * c.combined_len() as u64)?;
        if core != Core::Fused {
            gpu.check_fits("scores [B, H, Lq, Lk]", 4 * scores_len as u64)?;
        }
        let flash = match core {
            Core::Fused => Some(
                flash_attention::Flash::new(gpu, c.qk_head_dim, c.v_head_dim, false).ok_or_else(
                    || Error::Unsupported {
                        adapter: gpu.describe(),
                        what: format!(
                            "fused attention with head sizes q/k {} + v {}",
                            c.qk_head_dim, c.v_head_dim
                        ),
                    },
                )?,
            ),
            _ => None,
        };
        gpu.scoped("standalone attention core", || -> Result<Self> {
            let copy = wgpu::BufferUsages::COPY_SRC;
            let mut packed = Vec::with_capacity(q.len() + k.len() + v.len());
            for part in [q, k, v] {
                packed.extend_from_slice(part);
            }
            let qkv = gpu.upload("q|k|v", &packed, copy);
            let mask_buffers = MaskBuffers::new(gpu, encoded.words.len());
            mask_buffers.write(gpu.queue(), &encoded.words, &encoded.params);
            let scores_buf = gpu.storage("scores", 4 * scores_len as u64, copy);
            let out = gpu.storage("combined", 4 * c.combined_len() as u64, copy);
            let carry_len = flash.as_ref().map_or(0, |f| f.carry_len(&c));
            let carry = gpu.storage("flash carry", 4 * carry_len as u64, copy);
            let no_sinks = softmax::no_sinks(gpu);
            let scores_step = || {
                let b = scores::ScoresBuffers {
                    qkv: QkvBuffers::packed(&qkv),
                    scores: &scores_buf,
                    mask: &mask_buffers,
                };
                scores::dispatches(gpu, &c, b)
            };
            // av_combine reads the probabilities from `scores` (multi-pass) or from the packed
            // input (alone: they stand where q would), and V at its offset in `qkv`.
            let av_step = |probs: &wgpu::Buffer, c: &CoreProblem| {
                let b = av_combine::AvBuffers {
                    probs,
                    v: &qkv,
                    out: &out,
                };
                av_combine::dispatches(gpu, c, b)
            };
            let (steps, result, len) = match core {
                Core::Scores => (scores_step()?, &scores_buf, scores_len),
                Core::AvCombine => {
                    let mut c = c;
                    c.layout.v.offset = scores_len as u32;
                    let steps = av_step(&qkv, &c)?;
                    (steps, &out, c.combined_len())
                }
                Core::Fused => {
                    let b = flash_attention::FlashBuffers {
                        qkv: QkvBuffers::packed(&qkv),
                        out: &out,
                        carry: &carry,
                        mask: &mask_buffers,
                        chunks: None,
                        sinks: false,
                    };
                    let flash = flash
                        .as_ref()
                        .ok_or_else(|| Error::Misuse("no flash pass".into()))?;
                    (flash.dispatches(gpu, &c, &b)?, &out, c.combined_len())
                }
                Core::MultiPass => {
                    let rows = c.batch * c.heads * c.lq;
                    let mut steps = scores_step()?;
                    let sinks = softmax::Sinks::none(&no_sinks);
                    steps.push(softmax::dispatch(gpu, rows, c.lk, &scores_buf, sinks)?);
                    steps.extend(av_step(&scores_buf, &c)?);
                    (steps, &out, c.combined_len())
                }
                Core::Naive => {
                    let b = naive::NaiveAttentionBuffers {
                        qkv: &qkv,
                        scores: &scores_buf,
                        out: &out,
                    };
                    (naive::attention(gpu, &c, b)?, &out, c.combined_len())
                }
            };
            let result = result.clone();
            let keep = vec![
                qkv,
                mask_buffers.words,
                mask_buffers.params,
                scores_buf,
                out,
                carry,
            ];
            Ok(Job::new(gpu, steps, keep, result, len))
        })?
    }

    /// The fused core over f16 queries, keys and values (rounded to f16 on upload, each in its
    /// own buffer; the pass keeps f32 scores and accumulators), no mask: the baseline of a step
    /// that reads f16 K/V.
    pub fn fused_f16_kv(
        gpu: &Gpu,
        (q, k, v): (&[f32], &[f32], &[f32]),
        dims: CoreDims,
        scale: f32,
    ) -> Result<Self> {
        dims.check()?;
        expect_len("q", q.len(), dims.q_len())?;
        expect_len("k", k.len(), dims.k_len())?;
        expect_len("v", v.len(), dims.v_len())?;
        gpu.check_fits("q|k|v", 2 * (q.len() + k.len() + v.len()) as u64)?;
        let mut c = dims.problem(scale);
        (c.layout.q.offset, c.layout.k.offset, c.layout.v.offset) = (0, 0, 0);
        let flash = flash_attention::Flash::new(gpu, c.qk_head_dim, c.v_head_dim, true)
            .ok_or_else(|| Error::Unsupported {
                adapter: gpu.describe(),
                what: format!(
                    "fused attention over f16 keys and values, head size {}",
                    c.qk_head_dim
                ),
            })?;
        let encoded = EncodedMask::new(&Mask::None, dims.attn())?;
        gpu.scoped("standalone fused core, f16 K/V", || -> Result<Self> {
            let copy = wgpu::BufferUsages::COPY_SRC;
            let qb = gpu.upload_f32_as("q (f16)", q, true);
            let kb = gpu.upload_f32_as("k (f16)", k, true);
            let vb = gpu.upload_f32_as("v (f16)", v, true);
            let mask_buffers = MaskBuffers::new(gpu, encoded.words.len());
            mask_buffers.write(gpu.queue(), &encoded.words, &encoded.params);
            let out = gpu.storage("combined", 4 * c.combined_len() as u64, copy);
            let carry = gpu.storage("flash carry", 4 * flash.carry_len(&c) as u64, copy);
            let b = flash_attention::FlashBuffers {
                qkv: QkvBuffers {
                    q: &qb,
                    k: &kb,
                    v: &vb,
                },
                out: &out,
                carry: &carry,
                mask: &mask_buffers,
                chunks: None,
                sinks: false,
            };
            let steps = flash.dispatches(gpu, &c, &b)?;
            let result = out.clone();
            let keep = vec![
                qb,
                kb,
                vb,
                mask_buffers.words,
                mask_buffers.params,
                out,
                carry,
            ];
            Ok(Job::new(gpu, steps, keep, result, c.combined_len()))
        })?
    }

    /// A softmax job over `s [rows, cols]`; every run starts again from `s` (it works in place).
    /// The read probe in `shape` over two zeroed buffers of `bytes` each (rounded down to
    /// vec4s).
    pub fn read_probe(gpu: &Gpu, bytes: u64, shape: read_probe::ProbeShape) -> Result<Self> {
        gpu.check_fits("a read-probe buffer", bytes)?;
        let vec4s = u32::try_from(bytes / 16).map_err(|_| Error::TooLarge {
            what: "a read-probe buffer (vec4s)".into(),
            needed: bytes / 16,
            limit: u32::MAX as u64,
        })?;
        gpu.scoped("read probe", || -> Result<Self> {
            let none = wgpu::BufferUsages::empty();
            let (a, b) = (
                gpu.storage("probe a", bytes, none),
                gpu.storage("probe b", bytes, none),
            );
            let out_len = shape.out_len(vec4s);
            let out = gpu.storage(
                "probe sums",
                4 * out_len as u64,
                wgpu::BufferUsages::COPY_SRC,
            );
            let step = read_probe::dispatch(gpu, shape, vec4s, &a, &b, &out)?;
            Ok(Job::new(gpu, vec![step], vec![a, b], out, out_len))
        })?
    }

    pub fn softmax(gpu: &Gpu, s: &[f32], rows: usize, cols: usize) -> Result<Self> {
        if rows == 0 || cols == 0 {
            return Err(Error::Misuse(format!(
                "softmax sizes must be at least 1: rows {rows}, cols {cols}"
            )));
        }
        expect_len("s", s.len(), rows * cols)?;
        gpu.check_fits("s", 4 * (rows * cols) as u64)?;
        gpu.scoped("standalone softmax", || -> Result<Self> {
            let copy = wgpu::BufferUsages::COPY_SRC;
            let original = gpu.upload("s (input)", s, copy);
            let work = gpu.storage("s (in place)", 4 * (rows * cols) as u64, copy);
            let no_sinks = softmax::no_sinks(gpu);
            let step = softmax::dispatch(gpu, rows, cols, &work, softmax::Sinks::none(&no_sinks))?;
            let mut job = Job::new(gpu, vec![step], Vec::new(), work, rows * cols);
            job.restore = Some((original, (4 * rows * cols) as u64));
            Ok(job)
        })?
    }
}
