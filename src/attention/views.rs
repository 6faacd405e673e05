//! The module on the caller's buffers: [`MultiHeadAttention::record_forward`] and
//! [`MultiHeadAttention::forward_device`] take [`DeviceTensor`] views for the activations and
//! the output. The projection GEMMs read the caller's rows where they lie (their `x_offset`),
//! and the last pass (W_o, or the attention core of a module without it) writes the caller's
//! output slab directly (its destination offset and rows per sequence): no copy in or out,
//! but for inputs whose sequences are not one block of rows (a slab of spare rows with B > 1),
//! which are copied into the workspace first.
//!
//! An activation `[B, L, E]` is a `DeviceTensor` of shape `[B, 1, L, E]` (a single "head" of
//! width E: both layouts are then the same memory), or `[B, L, H, D]` with `H·D = E` in
//! [`Layout::Blhd`] (the combined heads a `scaled_dot_product_attention` wrote, read as rows
//! of E). Row `l` of sequence `b` starts at element `offset + b·capacity·E + l·E`.

use crate::error::{Error, Result};
use crate::model::mask::Mask;
use crate::sdpa::{DeviceTensor, Elem, Layout};

use super::chain_buffers::{ChainIo, Placement};
use super::gpu_tensor::GpuTensor;
use super::plan::Sharing;
use super::run::copy_probs;
use super::{AttentionPath, ForwardOptions, MultiHeadAttention};

/// What [`MultiHeadAttention::record_forward`] returns: the output went to the caller's `out`.
#[derive(Debug, Clone)]
pub struct DeviceForwardOutput {
    /// The path that ran (`MultiPass` or `Fused`).
    pub path: AttentionPath,
    /// `[B, H, Lq, Lk]` when requested: a new device tensor, written when the work runs.
    pub probs: Option<GpuTensor>,
}

/// A view checked as `[B, L, W]` activation rows.
#[derive(Clone, Copy)]
struct Rows<'a> {
    view: DeviceTensor<'a>,
    /// `[B, L, W]`.
    shape: [usize; 3],
}

impl<'a> Rows<'a> {
    /// `Err` naming `name` unless `view` is f32 rows `[B, L, W]` (see the module docs) that fit
    /// its buffer, one storage binding (the passes bind the whole buffer) and u32 indices.
    fn of(mha: &MultiHeadAttention, view: &DeviceTensor<'a>, name: &str) -> Result<Self> {
        if view.elem != Elem::F32 {
            return Err(Error::Misuse(format!(
                "{name}: the module reads and writes f32 activations, not {:?}",
                view.elem
            )));
        }
        let [b, h, l, d] = view.shape;
        if h != 1 && view.layout == Layout::Bhld {
            return Err(Error::Misuse(format!(
                "{name}: shape {:?} in Layout::Bhld is head-split, not rows of features; pass \
                 [B, 1, L, E] (either layout) or [B, L, H, D] with H·D = E in Layout::Blhd",
                view.shape
            )));
        }
        view.check(&mha.gpu, name)?;
        mha.gpu.check_fits(
            &format!("{name}'s buffer (the module binds it whole)"),
            view.buffer.size(),
        )?;
        Ok(Rows {
            view: *view,
            shape: [b, l, h * d],
        })
    }

    /// Whether the rows of every sequence follow each other: one block the GEMM reads in place.
    fn dense(&self) -> bool {
        self.view.capacity == self.shape[1] || self.shape[0] <= 1
    }

    /// Elements between sequences.
    fn batch_stride(&self) -> usize {
        self.view.capacity * self.shape[2]
    }

    /// The same rows as `other` (then one projection reads them once).
    fn same(&self, other: &Rows) -> bool {
        self.view.buffer == other.view.buffer
            && self.view.offset == other.view.offset
            && self.shape == other.shape
            && (self.dense() && other.dense() || self.view.capacity == other.view.capacity)
    }

    /// Bytes from the first element to one past the last (`None` when empty).
    fn span(&self) -> Option<(u64, u64)> {
        let [b, l, w] = self.shape;
        if b * l * w == 0 {
            return None;
        }
        let first = self.view.offset as u64;
        let last = first + ((b - 1) * self.batch_stride() + l * w) as u64;
        Some((4 * first, 4 * last))
    }
}

impl MultiHeadAttention {
    /// The module's forward on the caller's buffers, recorded into `encoder`; nothing is
    /// submitted. `query [B, Lq, model_dim]`, `key [B, Lk, key_dim]`, `value [B, Lk, value_dim]`
    /// and `out [B, Lq, output_dim]` are f32 [`DeviceTensor`]s of shape `[B, 1, L, W]` (either
    /// layout) or `[B, L, H, D]` with `H·D = W` in [`Layout::Blhd`], at any element offset and
    /// with spare rows per sequence ([`DeviceTensor::with_capacity`]). Pass one view three
    /// times for self-attention (one fused QKV GEMM reads it).
    ///
    /// The projections read the caller's rows in place, and the last pass (W_o, or the core
    /// of a module without W_o) writes `out` in place; only inputs whose sequences are not one
    /// block (capacity > L with B > 1) are copied into the module's workspace first (their
    /// buffer needs `COPY_SRC`). `mask` and `options` are the host forward's
    /// ([`forward_with`](Self::forward_with)); the probabilities, when asked for, come back as
    /// a new device tensor. The views are read and written when `encoder` runs, in the order
    /// of its commands.
    ///
    /// Errors, before anything is recorded (`encoder` is left as it was): a view of the wrong
    /// element type or shape for the config (named `query`, `key`, `value`, `out`), past its
    /// buffer's end, without `STORAGE` usage, larger than one storage binding, an `out` whose
    /// elements overlap an input's, a copied input without `COPY_SRC`, a bad mask or option.
    /// Does not split: a problem too large for one workspace is `Err(TooLarge)`.
    #[allow(clippy::too_many_arguments)]
    pub fn record_forward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        query: &DeviceTensor,
        key: &DeviceTensor,
        value: &DeviceTensor,
        out: &DeviceTensor,
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<DeviceForwardOutput> {
        let inputs = [
            Rows::of(self, query, "query")?,
            Rows::of(self, key, "key")?,
            Rows::of(self, value, "value")?,
        ];
        let out = Rows::of(self, out, "out")?;
        let [q, k, v] = &inputs;
        let sharing = Sharing::of(q.same(k), k.same(v));
        let plan = self.plan([&q.shape, &k.shape, &v.shape], sharing, mask, options)?;
        let d = plan.dims;
        let want = [d.batch, d.lq, self.config.output_dim()];
        if out.shape != want {
            return Err(Error::shape(
                "out",
                format!("{want:?} (as [B, 1, Lq, output_dim] or Blhd [B, Lq, H, D])"),
                &out.shape,
            ));
        }
        for (name, input) in ["query", "key", "value"].iter().zip(&inputs) {
            let overlap = match (out.span(), input.span()) {
                (Some(o), Some(i)) => {
                    out.view.buffer == input.view.buffer && o.0 < i.1 && i.0 < o.1
                }
                _ => false,
            };
            if overlap {
                return Err(Error::Misuse(format!(
                    "out overlaps {name} in their buffer (elements from {} and {}): the module \
                     would write its output over its input; put out elsewhere",
                    out.view.offset, input.view.offset
                )));
            }
            let copy_src = input
                .view
                .buffer
                .usage()
                .contains(wgpu::BufferUsages::COPY_SRC);
            if !input.dense() && !copy_src {
                return Err(Error::Misuse(format!(
                    "{name}: its {} sequences lie {} rows apart (capacity) and are copied into one \
                     block for the projection, but its buffer has no COPY_SRC usage; add it or \
                     pass a view whose capacity is its length",
                    input.shape[0], input.view.capacity
                )));
            }
        }
        if plan.is_empty() {
            return self.record_empty(encoder, &out, &plan);
        }
        // A copied input is read by a copy, not a bind group: wgpu would reject a destroyed or
        // foreign buffer only when the caller's encoder is finished or submitted, so it is tried
        // first, apart from the caller's encoder.
        let copied: Vec<(&str, &wgpu::Buffer)> = ["query", "key", "value"]
            .into_iter()
            .zip(&inputs)
            .filter(|(_, input)| !input.dense())
            .map(|(name, input)| (name, input.view.buffer))
            .collect();
        self.gpu.check_copy_sources(&copied)?;
        self.check_limits(plan.whole, plan.mask.window_len(d.batch, d.lq))?;
        let probs = self.new_probs(options, d)?;
        let mut ws = self.take_workspace(plan.whole)?;
        let window = plan.mask.window((0, d.batch), (0, d.lq));
        let words = &plan.mask.words[window.words];
        // Dense inputs are bound where they lie; others go to the workspace's (one per
        // distinct input, as its sharing numbers them).
        let distinct = match sharing {
            Sharing::SelfAttention => [0, 0, 0],
            Sharing::SharedKeyValue => [0, 1, 1],
            Sharing::Distinct => [0, 1, 2],
        };
        // Everything that can fail — the mask buffer, every bind group — is made and its error
        // scope popped before the first command goes into the caller's encoder.
        let chain = self.gpu.scoped("record_forward", || {
            ws.fit_mask(self, words.len())?;
            let bound: [(&wgpu::Buffer, u32); 3] = std::array::from_fn(|i| {
                let input = &inputs[i];
                match input.dense() {
                    true => (input.view.buffer, input.view.offset as u32),
                    false => (&ws.inputs[distinct[i]], 0),
                }
            });
            let io = ChainIo {
                inputs: bound.map(|(buffer, _)| buffer),
                output: out.view.buffer,
                at: Placement {
                    inputs: bound.map(|(_, offset)| offset),
                    out_offset: out.view.offset as u32,
                    out_rows: out.view.capacity as u32,
                },
            };
            ws.chain_on(self, Some(&io))
        });
        let chain = match chain.and_then(|c| c) {
            Ok(chain) => chain,
            // A workspace that saw an error is dropped (`keep_if_ok`).
            Err(e) => return self.keep_if_ok(ws, Err(e)),
        };
        let result = self.gpu.scoped("record_forward", || {
            ws.write_mask(self, encoder, words, &window.params);
            if let Some(positions) = &plan.positions {
                ws.write_rope(self, encoder, positions, d.lq, (0, 0));
            }
            let mut copied = [false; 3];
            for (i, input) in inputs.iter().enumerate() {
                if input.dense() || copied[distinct[i]] {
                    continue;
                }
                copied[distinct[i]] = true;
                let [b, l, w] = input.shape;
                for bi in 0..b {
                    let src = 4 * (input.view.offset + bi * input.batch_stride()) as u64;
                    let dst = 4 * (bi * l * w) as u64;
                    let bytes = 4 * (l * w) as u64;
                    encoder.copy_buffer_to_buffer(
                        input.view.buffer,
                        src,
                        &ws.inputs[distinct[i]],
                        dst,
                        bytes,
                    );
                }
            }
            for dispatch in &chain {
                dispatch.record(encoder, None);
            }
            copy_probs(encoder, &ws, probs.as_ref());
        });
        self.keep_if_ok(ws, result)?;
        Ok(DeviceForwardOutput {
            path: plan.path,
            probs,
        })
    }

    /// [`record_forward`](Self::record_forward) into an encoder of its own, submitted (it
    /// does not wait; reading `out` does).
    pub fn forward_device(
        &self,
        query: &DeviceTensor,
        key: &DeviceTensor,
        value: &DeviceTensor,
        out: &DeviceTensor,
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<DeviceForwardOutput> {
        self.gpu
            .scoped("forward_device", || -> Result<DeviceForwardOutput> {
                let mut encoder = self.gpu.encoder("forward_device");
                let output =
                    self.record_forward(&mut encoder, query, key, value, out, mask, options)?;
                self.gpu.queue().submit([encoder.finish()]);
                Ok(output)
            })?
    }

    /// No rows or no keys: the host's answer (W_o's bias per row, or zeros) written into
    /// `out`'s rows inside `encoder` (its buffer needs `COPY_DST` when there is anything to
    /// write).
    fn record_empty(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        out: &Rows,
        plan: &super::plan::Plan,
    ) -> Result<DeviceForwardOutput> {
        let host = self.empty_forward(plan);
        let [b, l, w] = out.shape;
        let probs = match &host.probs {
            Some(p) => Some(GpuTensor::zeros(&self.gpu, p.shape())?),
            None => None,
        };
        if b * l * w > 0 {
            if !out
                .view
                .buffer
                .usage()
                .contains(wgpu::BufferUsages::COPY_DST)
            {
                return Err(Error::Misuse(format!(
                    "out: with no keys the output is {} written from the host, and its buffer \
                     has no COPY_DST usage",
                    match self.weights.output_bias {
                        Some(_) => "W_o's bias in every row",
                        None => "zeros",
                    }
                )));
            }
            self.gpu.scoped("record_forward (empty)", || {
                for bi in 0..b {
                    let rows = &host.output.data()[bi * l * w..(bi + 1) * l * w];
                    let at = 4 * (out.view.offset + bi * out.batch_stride()) as u64;
                    self.gpu
                        .write_in(encoder, out.view.buffer, at, bytemuck::cast_slice(rows));
                }
            })?;
        }
        Ok(DeviceForwardOutput {
            path: plan.path,
            probs,
        })
    }
}
