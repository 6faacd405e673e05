//! `scaled_dot_product_attention` on tensors the caller keeps in its own device buffers: the
//! attention core of [`MultiHeadAttention`](crate::MultiHeadAttention) — scores, mask, softmax,
//! `P·V` — without its projections, as `torch.nn.functional.scaled_dot_product_attention` and
//! llama.cpp's `FLASH_ATTN_EXT` are to their engines.
//!
//! * [`DeviceTensor`] names a `[B, H, L, D]` tensor inside a caller's `wgpu::Buffer`: either
//!   layout ([`Layout::Bhld`], PyTorch's; [`Layout::Blhd`], what a projection writes), an
//!   element offset, and spare rows (a KV cache slab of some capacity, attended in place).
//! * [`scaled_dot_product_attention`] records the passes and submits them;
//!   [`record_scaled_dot_product_attention`] records them into the caller's command encoder and
//!   submits nothing.
//!
//! Ownership: the caller's buffers stay the caller's; the call reads q, k, v and writes `out`
//! when the work runs. The small buffers a call makes for itself (parameters, mask, sinks,
//! scratch) are its own: wgpu keeps each alive until the last command buffer using it
//! completes, so nothing needs to be kept by the caller, and calls recorded into one encoder
//! never share one. Every argument is checked before anything is recorded.

mod chain;
mod tensor;

pub use tensor::{DeviceTensor, Elem, Layout};

use crate::attention::gpu_tensor::GpuTensor;
use crate::attention::AttentionPath;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::mask::Mask;

/// Where the causal diagonal of [`Mask::Causal`], [`Mask::SlidingWindow`] and
/// [`Mask::CausalKeep`] lies when `Lq ≠ Lk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CausalAlignment {
    /// Query `i` sees keys `j ≤ i + (Lk − Lq)`: the last query sees every key (decoding the
    /// newest tokens against a cache; the crate's own `Mask` rule).
    #[default]
    BottomRight,
    /// Query `i` sees keys `j ≤ i`: PyTorch's `is_causal=True`.
    TopLeft,
}

/// What one call computes besides the tensors.
#[derive(Debug, Clone, Default)]
pub struct SdpaOptions {
    /// Over `[B, H, Lq, Lk]`, with [`Mask`]'s polarities and broadcasting. A fully masked row of
    /// a boolean mask averages V over every key (masked scores are −1e9, as in the seeds); a
    /// row whose additive bias is −inf everywhere is NaN, as in PyTorch.
    pub mask: Mask,
    /// Where a causal mask's diagonal lies when `Lq ≠ Lk` (default bottom-right).
    pub causal_alignment: CausalAlignment,
    /// Multiplies `Q·Kᵀ`; `None` = `1/√D` (PyTorch's default).
    pub scale: Option<f32>,
    /// Logit soft-cap `c`: scores become `c · tanh(s / c)` before the mask (Gemma 2).
    pub softcap: Option<f32>,
    /// ALiBi's `max_bias`: per-head slopes `2^(−max_bias·(h+1)/H)` (BLOOM's order for head
    /// counts that are not powers of two), the bias `slope · (j − i')` generated in the shader,
    /// `i'` the key on query `i`'s causal diagonal: `i + Lk − Lq` bottom-right, `i` top-left.
    pub alibi_max_bias: Option<f32>,
    /// One logit per query head joining each softmax's denominator only (gpt-oss's sinks).
    pub sinks: Option<Vec<f32>>,
    /// `Auto`: fused (the decode pass for a few query rows, else the flash pass) unless
    /// probabilities are asked for.
    pub path: AttentionPath,
    /// Also return the probabilities `[B, H, Lq, Lk]` (runs the multi-pass core, f32 only).
    pub return_probs: bool,
}

/// What a call returns: the output went to the caller's `out`.
#[derive(Debug, Clone)]
pub struct SdpaOutput {
    /// The path that ran (`Fused` or `MultiPass`).
    pub path: AttentionPath,
    /// `[B, H, Lq, Lk]`, when asked for: a new device tensor, written when the work runs.
    pub probs: Option<GpuTensor>,
}

/// `out = softmax(mask(scale · q·kᵀ)) · v`, per (batch, query head), submitted to `gpu`'s queue
/// (it returns without waiting; reads of `out` wait for it). `q` is `[B, H, Lq, D]`, `k`
/// `[B, H_kv, Lk, D]`, `v` `[B, H_kv, Lk, Dv]` with `H_kv` dividing `H` (grouped-query
/// attention without repeating K/V), `out` `[B, H, Lq, Dv]` f32, each in either [`Layout`].
pub fn scaled_dot_product_attention(
    gpu: &Gpu,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    out: &DeviceTensor,
    options: &SdpaOptions,
) -> Result<SdpaOutput> {
    let problem = chain::Problem::check(gpu, [q, k, v, out], options)?;
    let prepared = gpu.scoped("scaled_dot_product_attention", || problem.prepare(gpu))??;
    gpu.scoped("scaled_dot_product_attention", || {
        let mut encoder = gpu.encoder("scaled_dot_product_attention");
        let output = prepared.record(&mut encoder);
        gpu.queue().submit([encoder.finish()]);
        output
    })
}

/// [`scaled_dot_product_attention`] recorded into `encoder`, which the caller finishes and
/// submits (with its own passes before and after). Nothing runs until then; calls recorded
/// into one encoder run in the order recorded, and equal the same calls submitted one by one.
///
/// An `Err` leaves `encoder` exactly as it was: every buffer, pipeline and bind group of the
/// call is made inside an error scope that is popped and checked before the first command is
/// recorded (a bind group is where wgpu rejects a buffer of another device, a destroyed one, or
/// a bad range), and recording those commands then cannot fail.
pub fn record_scaled_dot_product_attention(
    gpu: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    out: &DeviceTensor,
    options: &SdpaOptions,
) -> Result<SdpaOutput> {
    let problem = chain::Problem::check(gpu, [q, k, v, out], options)?;
    let prepared = gpu.scoped("recording scaled_dot_product_attention", || {
        problem.prepare(gpu)
    })??;
    Ok(prepared.record(encoder))
}

fn misuse(what: String) -> Error {
    Error::Misuse(what)
}
