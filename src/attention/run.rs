//! Running a plan: one workspace, one encoder and one submit per chunk, for host tensors
//! (read back, split into chunks when the device needs it) and device tensors (never read
//! back; recorded into the caller's encoder, or into one made and submitted here). Every public
//! forward entry point ends here, and every one records through [`MultiHeadAttention::record`]:
//! per-call data is written inside the encoder (see [`crate::gpu::record`]).

use crate::error::Result;
use crate::gpu::timer::PassTimer;
use crate::model::tensor::Tensor;

use super::gpu_tensor::GpuTensor;
use super::plan::{Plan, Shape, Sharing};
use super::workspace::Workspace;
use super::{ForwardOptions, ForwardOutput, GpuForwardOutput, MultiHeadAttention};
use crate::model::mask::{AttnDims, Mask};

/// Most workspaces kept per module (one per shape, and one per concurrent caller).
const MAX_CACHED_WORKSPACES: usize = 8;

/// An input tensor a forward can read: on the host or already on the device.
pub(crate) trait Source {
    fn shape(&self) -> &[usize];
    /// Whether two inputs are the same tensor (then one projection GEMM reads it once).
    fn same(&self, other: &Self) -> bool;
    /// Records a copy into `dst` as a command of `encoder` (host data through
    /// [`crate::Gpu::write_in`], never `queue.write_buffer`: see [`crate::gpu::record`]).
    fn copy_into(&self, gpu: &crate::Gpu, encoder: &mut wgpu::CommandEncoder, dst: &wgpu::Buffer);
}

impl Source for Tensor {
    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
    fn same(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
    fn copy_into(&self, gpu: &crate::Gpu, encoder: &mut wgpu::CommandEncoder, dst: &wgpu::Buffer) {
        gpu.write_in(encoder, dst, 0, bytemuck::cast_slice(self.data()));
    }
}

impl Source for GpuTensor {
    fn shape(&self) -> &[usize] {
        GpuTensor::shape(self)
    }
    fn same(&self, other: &Self) -> bool {
        self.buffer() == other.buffer() && self.shape() == other.shape()
    }
    fn copy_into(&self, _: &crate::Gpu, encoder: &mut wgpu::CommandEncoder, dst: &wgpu::Buffer) {
        encoder.copy_buffer_to_buffer(self.buffer(), 0, dst, 0, self.byte_len());
    }
}

/// The shapes and sharing of three inputs.
fn shapes_of<S: Source>(inputs: [&S; 3]) -> ([&[usize]; 3], Sharing) {
    let [q, k, v] = inputs;
    (
        [q.shape(), k.shape(), v.shape()],
        Sharing::of(q.same(k), k.same(v)),
    )
}

impl MultiHeadAttention {
    /// Host tensors in, host tensors out; split into chunks where the device needs it.
    pub(crate) fn run_host(
        &self,
        inputs: [&Tensor; 3],
        mask: &Mask,
        options: &ForwardOptions,
        timer: Option<&mut PassTimer>,
    ) -> Result<ForwardOutput> {
        let (shapes, sharing) = shapes_of(inputs);
        let plan = self.plan(shapes, sharing, mask, options)?;
        if plan.is_empty() {
            return Ok(self.empty_forward(&plan));
        }
        let (batch_chunk, query_chunk) = self.plan_chunks(&plan)?;
        if (batch_chunk, query_chunk) == (plan.whole.batch, plan.whole.lq) {
            return self.run_chunk(plan.whole, inputs, &plan, (0, 0), timer);
        }
        self.run_chunked(&plan, (batch_chunk, query_chunk), inputs)
    }

    /// Device tensors in, new device tensors out, nothing read back: [`record_device`]
    /// into a new encoder, submitted at once (the submit-and-go form).
    ///
    /// [`record_device`]: Self::record_device
    pub(crate) fn run_device(
        &self,
        inputs: [&GpuTensor; 3],
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<GpuForwardOutput> {
        self.gpu.scoped("forward", || -> Result<GpuForwardOutput> {
            let mut encoder = self.gpu.encoder("forward");
            let out = self.record_device(&mut encoder, inputs, mask, options)?;
            self.gpu.queue().submit([encoder.finish()]);
            Ok(out)
        })?
    }

    /// Device tensors in, new device tensors out, recorded into `encoder` and not submitted.
    /// Everything that can fail (the plan, limits, the outputs, the workspace and its chain)
    /// comes before the first recorded command, so an `Err` leaves `encoder` as it was. Does
    /// not split: a problem too large for one workspace is `Err(TooLarge)`.
    ///
    /// The workspace goes back to the module's cache at once: a later call may record into
    /// it (in this encoder or another) because every call writes its inputs, mask and tables
    /// inside its own encoder and copies its results out into its own new tensors.
    pub(crate) fn record_device(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        inputs: [&GpuTensor; 3],
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<GpuForwardOutput> {
        let (shapes, sharing) = shapes_of(inputs);
        let plan = self.plan(shapes, sharing, mask, options)?;
        if plan.is_empty() {
            let host = self.empty_forward(&plan);
            let output = GpuTensor::zeros(&self.gpu, host.output.shape())?;
            // New buffers are zeros; only W_o's bias needs writing.
            let probs = match &host.probs {
                Some(p) => Some(GpuTensor::zeros(&self.gpu, p.shape())?),
                None => None,
            };
            self.gpu.scoped("forward (empty)", || {
                let bytes = bytemuck::cast_slice(host.output.data());
                self.gpu.write_in(encoder, output.buffer(), 0, bytes);
            })?;
            return Ok(GpuForwardOutput {
                output,
                probs,
                path: plan.path,
            });
        }
        let d = plan.dims;
        self.check_limits(plan.whole, plan.mask.window_len(d.batch, d.lq))?;
        let output = GpuTensor::zeros(&self.gpu, &[d.batch, d.lq, self.config.output_dim()])?;
        let probs = self.new_probs(options, d)?;
        // The caller's tensors, tried before anything goes into its encoder (see
        // `crate::gpu::record`), and the workspace's mask room made (which may rebuild its
        // bind groups) inside a scope of its own.
        let [q, k, v] = inputs;
        self.gpu.check_copy_sources(&[
            ("query", q.buffer()),
            ("key", k.buffer()),
            ("value", v.buffer()),
        ])?;
        let mut ws = self.take_workspace(plan.whole)?;
        let words = plan.mask.window((0, d.batch), (0, d.lq)).words.len();
        self.gpu
            .scoped("forward (mask room)", || ws.fit_mask(self, words))
            .and_then(|r| r)?;
        let result = self.gpu.scoped("forward", || {
            self.record(
                &mut ws,
                inputs,
                &plan,
                (0, 0),
                None,
                encoder,
                |ws, encoder| {
                    let result = ws.result();
                    encoder.copy_buffer_to_buffer(result, 0, output.buffer(), 0, output.byte_len());
                    copy_probs(encoder, ws, probs.as_ref());
                },
            )
        });
        self.keep_if_ok(ws, result.and_then(|r| r))?;
        Ok(GpuForwardOutput {
            output,
            probs,
            path: plan.path,
        })
    }

    /// The new `[B, H, Lq, Lk]` device tensor a device forward copies its probabilities into,
    /// when `options` asks for them.
    pub(super) fn new_probs(
        &self,
        options: &ForwardOptions,
        d: AttnDims,
    ) -> Result<Option<GpuTensor>> {
        if !options.return_probs {
            return Ok(None);
        }
        GpuTensor::zeros(&self.gpu, &[d.batch, d.heads, d.lq, d.lk]).map(Some)
    }

    /// One workspace, one submit, one readback of host tensors: the chunk of `shape` whose first
    /// batch and query are `at`.
    fn run_chunk(
        &self,
        shape: Shape,
        inputs: [&Tensor; 3],
        plan: &Plan,
        at: (usize, usize),
        mut timer: Option<&mut PassTimer>,
    ) -> Result<ForwardOutput> {
        let Shape { batch, lq, lk, .. } = shape;
        let (heads, out_dim) = (self.config.heads, self.config.output_dim());
        let out_len = batch * lq * out_dim;
        let probs_len = if shape.probs {
            batch * heads * lq * lk
        } else {
            0
        };
        let mut ws = self.take_workspace(shape)?;
        let result = self
            .submit(
                &mut ws,
                inputs,
                plan,
                at,
                timer.as_deref_mut(),
                |ws, encoder| {
                    let out_bytes = 4 * out_len as u64;
                    encoder.copy_buffer_to_buffer(ws.result(), 0, &ws.staging, 0, out_bytes);
                    if let (true, Some(scores)) = (shape.probs, &ws.scores) {
                        let probs_bytes = 4 * probs_len as u64;
                        encoder.copy_buffer_to_buffer(
                            scores,
                            0,
                            &ws.staging,
                            out_bytes,
                            probs_bytes,
                        );
                    }
                },
            )
            .and_then(|()| {
                let mut values = self.gpu.read_f32(&ws.staging, out_len + probs_len)?;
                let probs = values.split_off(out_len);
                Ok(ForwardOutput {
                    output: Tensor::new([batch, lq, out_dim], values)?,
                    probs: match shape.probs {
                        true => Some(Tensor::new([batch, heads, lq, lk], probs)?),
                        false => None,
                    },
                    path: plan.path,
                    pass_ms: match timer {
                        Some(t) => t.read(&self.gpu)?,
                        None => Vec::new(),
                    },
                })
            });
        self.keep_if_ok(ws, result)
    }

    /// [`record`](Self::record) into a new encoder, submitted, inside one error scope.
    fn submit(
        &self,
        ws: &mut Workspace,
        inputs: [&Tensor; 3],
        plan: &Plan,
        at: (usize, usize),
        timer: Option<&mut PassTimer>,
        finish: impl FnOnce(&Workspace, &mut wgpu::CommandEncoder),
    ) -> Result<()> {
        self.gpu.scoped("forward", || -> Result<()> {
            let mut encoder = self.gpu.encoder("forward");
            self.record(ws, inputs, plan, at, timer, &mut encoder, finish)?;
            self.gpu.queue().submit([encoder.finish()]);
            Ok(())
        })?
    }

    /// Records into `encoder` the writes of the inputs, of the chunk's window of the mask
    /// (the chunk of `ws.shape` whose first batch and query are `at`) and of its RoPE tables,
    /// then the chain and `finish` (copies out of the workspace). The only fallible step (a
    /// mask buffer that must grow) comes first: an `Err` records nothing.
    #[allow(clippy::too_many_arguments)]
    fn record<S: Source>(
        &self,
        ws: &mut Workspace,
        inputs: [&S; 3],
        plan: &Plan,
        (b0, i0): (usize, usize),
        mut timer: Option<&mut PassTimer>,
        encoder: &mut wgpu::CommandEncoder,
        finish: impl FnOnce(&Workspace, &mut wgpu::CommandEncoder),
    ) -> Result<()> {
        let window = plan.mask.window((b0, ws.shape.batch), (i0, ws.shape.lq));
        let words = &plan.mask.words[window.words];
        ws.fit_mask(self, words.len())?;
        ws.write_mask(self, encoder, words, &window.params);
        if let Some(positions) = &plan.positions {
            ws.write_rope(self, encoder, positions, plan.dims.lq, (b0, i0));
        }
        let sources = match ws.shape.sharing {
            Sharing::SelfAttention => &inputs[..1],
            Sharing::SharedKeyValue => &inputs[..2],
            Sharing::Distinct => &inputs[..],
        };
        for (buffer, source) in ws.inputs.iter().zip(sources) {
            source.copy_into(&self.gpu, encoder, buffer);
        }
        for d in &ws.dispatches {
            d.record(encoder, timer.as_deref_mut());
        }
        finish(ws, encoder);
        if let Some(t) = timer.as_deref() {
            t.resolve(encoder);
        }
        Ok(())
    }

    /// Runs the problem as blocks of `(batch_chunk, query_chunk)`, each its own submit, and
    /// assembles the outputs (and probabilities) on the host.
    fn run_chunked(
        &self,
        plan: &Plan,
        (batch_chunk, query_chunk): (usize, usize),
        [query, key, value]: [&Tensor; 3],
    ) -> Result<ForwardOutput> {
        let whole = plan.whole;
        let (batch, lq, lk, heads) = (whole.batch, whole.lq, whole.lk, self.config.heads);
        let out_dim = self.config.output_dim();
        let mut output = Tensor::zeros([batch, lq, out_dim]);
        let mut probs = whole.probs.then(|| Tensor::zeros([batch, heads, lq, lk]));
        let lk_in = whole.input_keys(&self.config);
        for b0 in (0..batch).step_by(batch_chunk) {
            let nb = batch_chunk.min(batch - b0);
            let k = slice_rows(key, b0..b0 + nb, 0..lk_in);
            let v = match whole.sharing {
                Sharing::Distinct => slice_rows(value, b0..b0 + nb, 0..lk_in),
                _ => k.clone(),
            };
            for i0 in (0..lq).step_by(query_chunk) {
                let nq = query_chunk.min(lq - i0);
                let q = slice_rows(query, b0..b0 + nb, i0..i0 + nq);
                let sharing = whole.sharing.of_query_block(nq, lq);
                let shape = Shape {
                    batch: nb,
                    lq: nq,
                    sharing,
                    ..whole
                };
                let inputs = match sharing {
                    Sharing::SelfAttention => [&k, &k, &k],
                    Sharing::SharedKeyValue => [&q, &k, &k],
                    Sharing::Distinct => [&q, &k, &v],
                };
                let part = self.run_chunk(shape, inputs, plan, (b0, i0), None)?;
                // Scatter the block's rows back into place.
                for b in 0..nb {
                    let src = &part.output.data()[b * nq * out_dim..(b + 1) * nq * out_dim];
                    let dst = ((b0 + b) * lq + i0) * out_dim;
                    output.data_mut()[dst..dst + nq * out_dim].copy_from_slice(src);
                }
                if let (Some(all), Some(p)) = (probs.as_mut(), part.probs.as_ref()) {
                    for bh in 0..nb * heads {
                        let src = &p.data()[bh * nq * lk..][..nq * lk];
                        let dst = ((b0 * heads + bh) * lq + i0) * lk;
                        all.data_mut()[dst..dst + nq * lk].copy_from_slice(src);
                    }
                }
            }
        }
        Ok(ForwardOutput {
            output,
            probs,
            path: plan.path,
            pass_ms: Vec::new(),
        })
    }

    /// Empty problems, answered on the host with PyTorch's semantics: no rows → empty output;
    /// no keys → the attention output is 0 (a sum over nothing), so the module returns W_o's
    /// bias (classic) or zeros (per-head).
    pub(super) fn empty_forward(&self, plan: &Plan) -> ForwardOutput {
        let d = plan.dims;
        let out_dim = self.config.output_dim();
        let mut output = Tensor::zeros([d.batch, d.lq, out_dim]);
        if let Some(b_o) = &self.weights.output_bias {
            for row in output.data_mut().chunks_mut(out_dim) {
                row.copy_from_slice(b_o);
            }
        }
        ForwardOutput {
            output,
            probs: plan
                .whole
                .probs
                .then(|| Tensor::zeros([d.batch, d.heads, d.lq, d.lk])),
            path: plan.path,
            pass_ms: Vec::new(),
        }
    }

    pub(super) fn take_workspace(&self, shape: Shape) -> Result<Workspace> {
        if let Ok(mut cache) = self.workspaces.lock() {
            if let Some(pos) = cache.iter().position(|w| w.shape == shape) {
                return Ok(cache.swap_remove(pos));
            }
        }
        self.gpu
            .scoped("allocating workspace", || Workspace::new(self, shape))?
    }

    /// Returns the workspace to the cache when the call succeeded; a workspace that saw an
    /// error may hold half-written state, so it is dropped then.
    pub(super) fn keep_if_ok<T>(&self, ws: Workspace, result: Result<T>) -> Result<T> {
        if result.is_ok() {
            if let Ok(mut cache) = self.workspaces.lock() {
                if cache.len() >= MAX_CACHED_WORKSPACES {
                    cache.remove(0);
                }
                cache.push(ws);
            }
        }
        result
    }
}

/// Rows `[batches, positions]` of a `[B, L, W]` tensor, as a new tensor.
fn slice_rows(
    t: &Tensor,
    batches: std::ops::Range<usize>,
    positions: std::ops::Range<usize>,
) -> Tensor {
    let (l, w) = (t.shape()[1], t.shape()[2]);
    let mut data = Vec::with_capacity(batches.len() * positions.len() * w);
    for b in batches.clone() {
        data.extend_from_slice(
            &t.data()[(b * l + positions.start) * w..(b * l + positions.end) * w],
        );
    }
    Tensor::from_parts([batches.len(), positions.len(), w], data)
}

/// Copies the probabilities `ws` computed into `probs`, inside `encoder`, when both exist.
pub(super) fn copy_probs(
    encoder: &mut wgpu::CommandEncoder,
    ws: &Workspace,
    probs: Option<&GpuTensor>,
) {
    if let (Some(probs), Some(scores)) = (probs, &ws.scores) {
        encoder.copy_buffer_to_buffer(scores, 0, probs.buffer(), 0, probs.byte_len());
    }
}
