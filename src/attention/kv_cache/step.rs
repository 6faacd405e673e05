//! A decoding step over a [`KvCache`]: checked and planned first ([`MultiHeadAttention::plan_step`]:
//! every argument, the step buffers, the mask buffer and the chain of passes), then recorded
//! into an encoder ([`MultiHeadAttention::record_step`]: the writes of the inputs, mask and
//! RoPE table, then the chain). The host form submits and reads back; the device forms copy the
//! result into a new [`GpuTensor`] and submit ([`forward_step_gpu_with`]) or leave the
//! encoder to the caller ([`forward_step_gpu_into`]).
//!
//! [`forward_step_gpu_with`]: MultiHeadAttention::forward_step_gpu_with
//! [`forward_step_gpu_into`]: MultiHeadAttention::forward_step_gpu_into

use super::KvCache;
use crate::attention::chain_buffers::{Bound, Geometry, Placement, RopeTables};
use crate::attention::gpu_tensor::GpuTensor;
use crate::attention::run::Source;
use crate::attention::workspace::dispatches;
use crate::attention::MultiHeadAttention;
use crate::error::{Error, Result};
use crate::gpu::pass::Dispatch;
use crate::kernels::decode::partials_for;
use crate::kernels::flash_attention::{carry_stride, state_bytes};
use crate::kernels::mask::{EncodedMask, MaskBuffers};
use crate::kernels::{KvChunks, QkvBuffers};
use crate::model::mask::{AttnDims, Mask};
use crate::model::tensor::Tensor;

/// What a decoding step may add to the plain causal step
/// ([`MultiHeadAttention::forward_step_with`]; with `X = GpuTensor`,
/// [`forward_step_gpu_with`](MultiHeadAttention::forward_step_gpu_with) and
/// [`forward_step_gpu_into`](MultiHeadAttention::forward_step_gpu_into)).
#[derive(Debug)]
pub struct StepOptions<'a, X = Tensor> {
    /// Keys and values from another input (seed 001's `x_k_v`), `[B, n, key_dim]`, as
    /// [`forward_step_cross`](MultiHeadAttention::forward_step_cross) takes them.
    pub x_k_v: Option<&'a X>,
    /// A mask over this step's scores `[B, H, n, len + n]` in place of the causal one — e.g. a
    /// batch of prompts padded to one length: `Mask::Causal.with_key_padding(&padding, dims)`
    /// with `padding` cut to the first `len + n` positions.
    pub mask: Option<&'a Mask>,
    /// RoPE positions of the `n` new tokens, `[B, n]`; default `len..len + n`.
    pub positions: Option<&'a [usize]>,
}

// By hand: derived impls would ask `X: Default + Clone` of the tensor type.
impl<X> Default for StepOptions<'_, X> {
    fn default() -> Self {
        StepOptions {
            x_k_v: None,
            mask: None,
            positions: None,
        }
    }
}
impl<X> Clone for StepOptions<'_, X> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<X> Copy for StepOptions<'_, X> {}

/// A checked step, ready to record: `n` new tokens after `len0`, its mask, its RoPE
/// positions and its chain of passes over the cache's buffers.
pub(crate) struct StepPlan {
    n: usize,
    lk: usize,
    mask: EncodedMask,
    positions: Vec<usize>,
    /// What dynamic and longrope RoPE take as the call's length (see `rope::seq_len`).
    seq_len: usize,
    chain: Vec<Dispatch>,
}

impl MultiHeadAttention {
    /// One decoding step of self-attention: `x_new [B, n, model_dim]` are the next `n` tokens.
    /// Their queries, keys and values are all projected from `x_new`; keys and values are appended
    /// to `cache`, and each new token `i` attends to every cached token `j ≤ len + i` (causal).
    /// Returns `[B, n, output_dim]`, the rows a causal forward over the whole sequence would give
    /// for these positions.
    ///
    /// Needs `model_dim = key_dim = value_dim` (both seed modules). For seed 001's separate
    /// `x_k_v`, see [`forward_step_cross`](Self::forward_step_cross).
    pub fn forward_step(&self, cache: &mut KvCache, x_new: &Tensor) -> Result<Tensor> {
        self.step(cache, x_new, &StepOptions::default())
    }

    /// [`forward_step`](Self::forward_step) with [`StepOptions`]: keys and values from another
    /// input, a mask in place of the causal one, RoPE positions of the new tokens.
    pub fn forward_step_with(
        &self,
        cache: &mut KvCache,
        x_new: &Tensor,
        options: &StepOptions,
    ) -> Result<Tensor> {
        self.step(cache, x_new, options)
    }

    /// A decoding step of seed 001's cross form: queries from `x_q_new [B, n, model_dim]`,
    /// keys and values from `x_k_v_new [B, n, key_dim]` (the same `n` new positions), with the same
    /// causal alignment. Token by token this equals
    /// `forward_cross(x_q, x_k_v, &Mask::Causal)` over the whole sequences.
    pub fn forward_step_cross(
        &self,
        cache: &mut KvCache,
        x_q_new: &Tensor,
        x_k_v_new: &Tensor,
    ) -> Result<Tensor> {
        let options = StepOptions {
            x_k_v: Some(x_k_v_new),
            ..Default::default()
        };
        self.step(cache, x_q_new, &options)
    }

    /// [`forward_step`](Self::forward_step) on device tensors: `x_new [B, n, model_dim]` in, a
    /// new `[B, n, output_dim]` device tensor out; submitted, not waited for, nothing read back.
    pub fn forward_step_gpu(&self, cache: &mut KvCache, x_new: &GpuTensor) -> Result<GpuTensor> {
        self.forward_step_gpu_with(cache, x_new, &StepOptions::default())
    }

    /// [`forward_step_with`](Self::forward_step_with) on device tensors:
    /// [`forward_step_gpu_into`](Self::forward_step_gpu_into) a new encoder, submitted. After
    /// any error the cache is as it was.
    pub fn forward_step_gpu_with(
        &self,
        cache: &mut KvCache,
        x_new: &GpuTensor,
        options: &StepOptions<GpuTensor>,
    ) -> Result<GpuTensor> {
        let len0 = cache.len;
        let result = self.gpu.scoped("forward_step", || -> Result<GpuTensor> {
            let mut encoder = self.gpu.encoder("forward_step");
            let out = self.forward_step_gpu_into(&mut encoder, cache, x_new, options)?;
            self.gpu.queue().submit([encoder.finish()]);
            Ok(out)
        });
        let result = result.and_then(|r| r);
        if result.is_err() {
            cache.len = len0;
            cache.ledger.truncate(len0);
        }
        result
    }

    /// A decoding step on device tensors recorded into the caller's `encoder`: the writes of
    /// this step's data (its inputs are copied, its mask and RoPE table written, inside the
    /// encoder) and every pass; nothing is submitted. The returned `[B, n, output_dim]` tensor
    /// is the caller's and holds the result once `encoder` has run. Several steps — of one
    /// cache or of several (the layers of a decoder), with the caller's own passes between
    /// them — may be recorded into one encoder.
    ///
    /// **The cache advances when the step is recorded**: [`KvCache::len`] counts this step's
    /// tokens at once, though their keys and values reach the cache only when the GPU runs
    /// the encoder. So the caller submits every encoder it recorded steps of a cache into, in
    /// the order the steps were recorded (a later step reads the rows an earlier one writes),
    /// and before any submitting step of the same cache ([`forward_step`](Self::forward_step),
    /// [`forward_step_gpu`](Self::forward_step_gpu), …: those submit their own encoder at once).
    /// An encoder that is dropped unsubmitted leaves the cache counting rows that were never
    /// written: roll it back with [`KvCache::truncate`] to the length before the step (or
    /// [`KvCache::reset`]). Nothing else needs cleaning up; the step's scratch buffers stay the
    /// cache's, and wgpu keeps alive every buffer a recorded command uses until it has run.
    ///
    /// **The sequence rule is checked**: each step's encoder carries a ticket that wgpu runs
    /// when its command buffer has run (in submission order) and drops with an encoder dropped
    /// unsubmitted. After a step whose encoder was dropped, or one that ran before a step
    /// recorded earlier, the cache's next step (any form) is `Err(Misuse)` naming the "KV cache
    /// sequence rule" and the length to [`KvCache::truncate`] to; the truncate clears it. A
    /// reordering is seen once the GPU has run both steps (this checks without waiting).
    ///
    /// Every argument is checked, and every buffer and bind group made, before the first
    /// command is recorded: an `Err` leaves `encoder` and `cache` as they were (but for running
    /// out of memory while recording, see [`crate::gpu::record`]). wgpu checks
    /// recorded commands when the encoder is finished (wgpu 30): an error there reaches the
    /// caller's error scope.
    pub fn forward_step_gpu_into(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        cache: &mut KvCache,
        x_new: &GpuTensor,
        options: &StepOptions<GpuTensor>,
    ) -> Result<GpuTensor> {
        let (b, out_dim) = (cache.batch, self.config.output_dim());
        let Some(plan) = self.plan_step(cache, x_new, options)? else {
            return GpuTensor::zeros(&self.gpu, &[b, 0, out_dim]);
        };
        // The caller's tensors, tried before anything goes into its encoder (see
        // `crate::gpu::record`).
        let mut sources = vec![("step input", x_new.buffer())];
        sources.extend(
            options
                .x_k_v
                .map(|kv| ("step key/value input", kv.buffer())),
        );
        self.gpu.check_copy_sources(&sources)?;
        let output = GpuTensor::zeros(&self.gpu, &[b, plan.n, out_dim])?;
        self.gpu.scoped("forward_step", || {
            self.record_step(encoder, cache, &plan, x_new, options.x_k_v);
            let step = &cache.step;
            let result = step.output.as_ref().unwrap_or(&step.combined);
            encoder.copy_buffer_to_buffer(result, 0, output.buffer(), 0, output.byte_len());
            cache.ledger.track(encoder, cache.len..plan.lk);
        })?;
        cache.len = plan.lk;
        Ok(output)
    }

    /// The host step: recorded, submitted and read back; the cache advances only when all
    /// of that succeeded.
    fn step(&self, cache: &mut KvCache, x_q: &Tensor, options: &StepOptions) -> Result<Tensor> {
        let (b, out_dim) = (cache.batch, self.config.output_dim());
        let Some(plan) = self.plan_step(cache, x_q, options)? else {
            return Ok(Tensor::zeros([b, 0, out_dim]));
        };
        let out_len = b * plan.n * out_dim;
        let values = self.gpu.scoped("forward_step", || -> Result<Vec<f32>> {
            let mut encoder = self.gpu.encoder("forward_step");
            self.record_step(&mut encoder, cache, &plan, x_q, options.x_k_v);
            let step = &cache.step;
            let result = step.output.as_ref().unwrap_or(&step.combined);
            encoder.copy_buffer_to_buffer(result, 0, &step.staging, 0, 4 * out_len as u64);
            cache.ledger.track(&encoder, cache.len..plan.lk);
            self.gpu.queue().submit([encoder.finish()]);
            self.gpu.read_f32(&step.staging, out_len)
        })??;
        // The wait ran this step's ticket: it overtook a recorded step not yet submitted?
        cache.ledger.check()?;
        // Only now do the appended rows count; after any error the cache is as it was.
        cache.len = plan.lk;
        Tensor::new([b, plan.n, out_dim], values)
    }

    /// Checks a step of `x_q` (and `options`) against `cache` and makes everything it needs
    /// that can fail: grown step buffers, a mask buffer that holds its mask, its chain of
    /// passes. `None` for a step of no tokens. Changes nothing the cache's earlier steps read.
    fn plan_step<S: Source>(
        &self,
        cache: &mut KvCache,
        x_q: &S,
        options: &StepOptions<S>,
    ) -> Result<Option<StepPlan>> {
        let c = &self.config;
        if cache.owner != self.weights.w_qkv {
            return Err(Error::Misuse(
                "this KV cache was made for another attention module".into(),
            ));
        }
        // The sequence rule: the tickets of steps that have run or were dropped settle in
        // the poll (it does not wait).
        {
            let _serial = self.gpu.serialize();
            let _ = self.gpu.device().poll(wgpu::PollType::Poll);
        }
        cache.ledger.check()?;
        let b = cache.batch;
        let qs = x_q.shape();
        if qs.len() != 3 || qs[0] != b || qs[2] != c.model_dim {
            return Err(Error::shape(
                "step query input",
                format!(
                    "[{b}, n, {}] (the cache's batch, n new tokens)",
                    c.model_dim
                ),
                qs,
            ));
        }
        let n = qs[1];
        match options.x_k_v.map(|kv| kv.shape()) {
            Some(kv) if kv != [b, n, c.key_dim] => {
                return Err(Error::shape(
                    "step key/value input",
                    format!("[{b}, {n}, {}] (like the query input)", c.key_dim),
                    kv,
                ));
            }
            Some(_) => {}
            None if c.model_dim != c.key_dim => {
                return Err(Error::Misuse(format!(
                    "a self-attention step projects keys from the query input, but model_dim {} ≠ key_dim {}; \
                     use forward_step_cross",
                    c.model_dim, c.key_dim
                )));
            }
            None => {}
        }
        if cache.len + n > cache.capacity {
            return Err(Error::KvCacheFull {
                len: cache.len,
                new: n,
                capacity: cache.capacity,
            });
        }
        if n == 0 {
            return Ok(None);
        }
        let (len0, lk) = (cache.len, cache.len + n);
        // Checked (and, for the causal mask, bottom-right aligned: new token i sees cached keys
        // j ≤ i + (lk − n) = len0 + i) before anything is written.
        let dims = AttnDims {
            batch: b,
            heads: c.heads,
            lq: n,
            lk,
        };
        let mask = options.mask.unwrap_or(&Mask::Causal);
        let mask = EncodedMask::new(mask, dims)?.with_score_terms(c);
        let positions: Vec<usize> = match options.positions {
            None => (0..b).flat_map(|_| len0..lk).collect(),
            Some(_) if c.rope.is_none() => {
                return Err(Error::Misuse(
                    "positions were given, but the module has no rotary embedding (RoPE)".into(),
                ))
            }
            Some(p) if p.len() != b * n => {
                return Err(Error::shape(
                    "step positions",
                    format!("[{b}, {n}]"),
                    &[p.len()],
                ))
            }
            Some(p) => p.to_vec(),
        };
        // dynamic / longrope RoPE: the frequencies of the step's longest position; a step the
        // cache cannot rotate as transformers would is refused here.
        let seq_len = crate::model::rope::seq_len(&positions);
        if let Some(rope) = &c.rope {
            rope.check_cached_step(seq_len)?;
        }
        // Grows the step buffers when this step is longer than any before (a step recorded
        // earlier keeps the old ones alive: they hold nothing a later step reads).
        cache.reserve(self, n)?;
        self.check_step_state(cache, n, lk)?;
        if !cache.mask.holds(mask.words.len()) {
            cache.mask = MaskBuffers::new(&self.gpu, mask.words.len());
        }
        let cross = options.x_k_v.is_some();
        let chain = self.gpu.scoped("planning a KV cache step", || {
            self.step_chain(cache, n, lk, cross)
        })??;
        Ok(Some(StepPlan {
            n,
            lk,
            mask,
            positions,
            seq_len,
            chain,
        }))
    }

    /// `Err(TooLarge)` when the fused pass's state for a step of `n` tokens over `lk` keys
    /// does not fit the cache's (see `KvCache::with_path`).
    fn check_step_state(&self, cache: &KvCache, n: usize, lk: usize) -> Result<()> {
        let c = &self.config;
        let b = cache.batch;
        let state = match (cache.fused, &self.flash) {
            (true, Some(_)) if self.decodes(n) => partials_for(
                &self.gpu,
                c.kv_group(),
                n,
                b * c.heads * n,
                lk,
                c.qk_head_dim,
                c.v_head_dim,
            ),
            (true, Some(f)) if f.key_ranges(lk).len() > 1 || !cache.k_chunks.is_empty() => {
                b * c.heads * n * carry_stride(c.v_head_dim)
            }
            _ => 0,
        };
        let room = state_bytes(&cache.step.carry, c.heads, c.sinks);
        if 4 * state as u64 > room {
            return Err(Error::TooLarge {
                what: format!(
                    "the fused-pass state of a KV cache step of {n} tokens over {lk} keys (step \
                     in fewer tokens)"
                ),
                needed: 4 * state as u64,
                limit: room,
            });
        }
        Ok(())
    }

    /// The forward's chain of passes over the cache's buffers, for `n` new tokens of `lk`;
    /// keys and values projected from their own input (`cross`) or from the queries'.
    fn step_chain(
        &self,
        cache: &KvCache,
        n: usize,
        lk: usize,
        cross: bool,
    ) -> Result<Vec<Dispatch>> {
        let c = &self.config;
        let step = &cache.step;
        let geometry = Geometry {
            batch: cache.batch,
            lq: n,
            lk,
            kv_pos: lk - n,
            appended: 0,
            layout: cache.layout(c),
            fused: cache.fused,
        };
        let qkv = match &cache.kv {
            Some(kv) => QkvBuffers {
                q: &step.qkv,
                k: kv,
                v: kv,
            },
            None => QkvBuffers::packed(&step.qkv),
        };
        let kv_input = if cross { &step.x_kv } else { &step.x_q };
        let bound = Bound {
            query: &step.x_q,
            key: kv_input,
            value: kv_input,
            qkv,
            scores: cache.scores.as_ref(),
            combined: &step.combined,
            gate: step.gate.as_ref(),
            output: step.output.as_ref(),
            carry: &step.carry,
            mask: &cache.mask,
            rope: step.rope.as_ref().map(|t| RopeTables { q: t, k: t }),
            chunks: (!cache.k_chunks.is_empty()).then_some(KvChunks {
                k: &cache.k_chunks,
                v: &cache.v_chunks,
                keys: cache.chunk_keys,
                format: cache.format,
            }),
            at: Placement::default(),
        };
        dispatches(self, &geometry, &bound)
    }

    /// Records a planned step into `encoder`: the writes of its inputs, mask and RoPE table
    /// into the cache's step buffers, then its chain. Infallible: `plan_step` made everything.
    fn record_step<S: Source>(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        cache: &KvCache,
        plan: &StepPlan,
        x_q: &S,
        x_kv: Option<&S>,
    ) {
        let step = &cache.step;
        let gpu = &self.gpu;
        x_q.copy_into(gpu, encoder, &step.x_q);
        if let Some(kv) = x_kv {
            kv.copy_into(gpu, encoder, &step.x_kv);
        }
        cache
            .mask
            .write_in(gpu, encoder, &plan.mask.words, &plan.mask.params);
        if let (Some(rope), Some(table)) = (&self.config.rope, &step.rope) {
            let table_data = rope.table(&plan.positions, plan.seq_len);
            gpu.write_in(encoder, table, 0, bytemuck::cast_slice(&table_data));
        }
        for d in &plan.chain {
            d.record(encoder, None);
        }
    }
}
