//! `MultiHeadAttention`: the forward of both seed modules as a chain of WGSL passes.
//!
//! * `mod.rs` — the public types and entry points (this file);
//! * `plan` — what a call settles before the GPU: shapes, mask, path, chunk sizes, limits;
//! * `workspace` — buffers per shape and the dispatch chain; `workspace::dispatches` reads
//!   top to bottom like the seeds' `forward`, and the KV cache builds its steps with it too;
//! * `chain_buffers` — what a chain runs over: its rows, the buffers it reads and writes;
//! * `run` — one submit per chunk, host or device tensors in and out;
//! * `views` — the forward on the caller's buffers (`DeviceTensor` views in and out);
//! * [`kv_cache`], [`gpu_tensor`], `gpu_weights`.

mod appended_kv;
mod chain_buffers;
pub mod gpu_tensor;
mod gpu_weights;
pub mod kv_cache;
mod kv_chunks;
mod kv_step_buffers;
pub mod mla_stage;
mod output_stage;
mod paged_step;
mod plan;
mod row_passes;
mod run;
mod views;
mod workspace;

use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::gpu::timer::PassTimer;
use crate::gpu::Gpu;
use crate::kernels::flash_attention::{self, Flash};
use crate::model::config::AttentionConfig;
use crate::model::mask::Mask;
use crate::model::tensor::Tensor;
use crate::model::weights::AttentionWeights;
use gpu_tensor::GpuTensor;
use gpu_weights::GpuWeights;
use workspace::Workspace;

pub use views::DeviceForwardOutput;

/// Which attention core runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionPath {
    /// Fused when probabilities are not requested and the fused kernel fits, else multi-pass.
    #[default]
    Auto,
    /// `scores` → `softmax` → `av_combine` (keeps the `[B, H, Lq, Lk]` probabilities).
    MultiPass,
    /// `flash_attention` (never allocates `[B, H, Lq, Lk]`).
    Fused,
}

/// Storage precision of a module, chosen at construction
/// ([`MultiHeadAttention::with_precision`]).
///
/// With `F16` the projection weights are uploaded as f16 and the projected, head-split Q/K/V are
/// stored as f16; every GEMM and the attention core accumulate in f32, and the softmax
/// statistics (running max and sum) are f32. Inputs, biases, the combined heads and the output
/// stay f32. Weights beyond f16's range (±65504) become infinite.
///
/// An `F16` module runs only the fused attention path: asking it for attention probabilities or
/// for [`AttentionPath::MultiPass`] is `Err(Unsupported)`, and so is a multi-pass [`crate::KvCache`] over
/// it. Use an `F32` module for those.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// f32 everywhere (what [`MultiHeadAttention::new`] builds).
    #[default]
    F32,
    /// f16 weights and Q/K/V; `Err(Unsupported)` where the device has no `SHADER_F16` or the
    /// head sizes do not fit the fused kernel.
    F16,
    /// `F16` where it is supported, else `F32` (see [`MultiHeadAttention::precision`]).
    PreferF16,
}

/// Options of one forward call.
#[derive(Debug, Clone, Default)]
pub struct ForwardOptions {
    /// Also return the attention probabilities `[B, H, Lq, Lk]` (forces the multi-pass path).
    pub return_probs: bool,
    /// Which attention core to run (default `Auto`).
    pub path: AttentionPath,
    /// RoPE positions of the keys, `[B, Lk]` row-major; the queries are the last `Lq` of them
    /// (self-attention: the same positions). Default `0..Lk` for every sequence. Only for a
    /// module with RoPE (see [`AttentionConfig::rope`](crate::AttentionConfig)).
    pub positions: Option<Vec<usize>>,
}

/// What a forward returns.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// `[B, Lq, output_dim]`.
    pub output: Tensor,
    /// `[B, H, Lq, Lk]` when requested.
    pub probs: Option<Tensor>,
    /// The path that actually ran (`MultiPass` or `Fused`).
    pub path: AttentionPath,
    /// GPU milliseconds per pass, when profiling was asked for and the adapter can time.
    pub pass_ms: Vec<(&'static str, f64)>,
}

/// What [`MultiHeadAttention::forward_gpu_with`] returns: device tensors, nothing read back.
#[derive(Debug, Clone)]
pub struct GpuForwardOutput {
    /// `[B, Lq, output_dim]`.
    pub output: GpuTensor,
    /// `[B, H, Lq, Lk]` when requested.
    pub probs: Option<GpuTensor>,
    /// The path that ran (`MultiPass` or `Fused`).
    pub path: AttentionPath,
}

/// A multi-head attention module on the GPU: pipelines built once, weights uploaded once.
pub struct MultiHeadAttention {
    gpu: Gpu,
    config: AttentionConfig,
    /// `F32` or `F16` (never `PreferF16`): what this module runs.
    precision: Precision,
    /// The fused core for these head sizes, when its tile fits the device.
    flash: Option<Flash>,
    weights: GpuWeights,
    /// Workspaces by shape, reused across calls (see `run`).
    workspaces: Mutex<Vec<Workspace>>,
}

impl MultiHeadAttention {
    /// Builds the pipelines and uploads the weights (checked against the config first); f32
    /// throughout ([`Precision::F32`]).
    pub fn new(gpu: &Gpu, config: AttentionConfig, weights: &AttentionWeights) -> Result<Self> {
        Self::with_precision(gpu, config, weights, Precision::F32)
    }

    /// [`new`](Self::new) with a storage precision (see [`Precision`]). `F16` is
    /// `Err(Unsupported)` on a device without `SHADER_F16` or for head sizes the fused kernel
    /// cannot stage; `PreferF16` falls back to `F32` in both cases.
    pub fn with_precision(
        gpu: &Gpu,
        config: AttentionConfig,
        weights: &AttentionWeights,
        precision: Precision,
    ) -> Result<Self> {
        let config = config.validated()?;
        weights.check(&config)?;
        let flash_fits = flash_attention::kv_tile(
            config.qk_head_dim,
            config.v_head_dim,
            gpu.limits().max_compute_workgroup_storage_size,
        )
        .is_some();
        let precision = match precision {
            Precision::F32 => Precision::F32,
            Precision::PreferF16 if gpu.has_f16() && flash_fits => Precision::F16,
            Precision::PreferF16 => Precision::F32,
            Precision::F16 if !gpu.has_f16() => {
                return Err(Error::Unsupported {
                    adapter: gpu.describe(),
                    what: "f16 precision (the device has no SHADER_F16)".into(),
                })
            }
            Precision::F16 if !flash_fits => {
                return Err(Error::Unsupported {
                    adapter: gpu.describe(),
                    what: format!(
                        "f16 precision with head sizes q/k {} + v {} (f16 runs only the fused kernel, whose tile of {} K/V rows must fit the {} bytes of workgroup memory)",
                        config.qk_head_dim,
                        config.v_head_dim,
                        flash_attention::KEY_GROUP,
                        gpu.limits().max_compute_workgroup_storage_size
                    ),
                })
            }
            Precision::F16 => Precision::F16,
        };
        let half = precision == Precision::F16;
        let weights = GpuWeights::upload(gpu, &config, weights, half)?;
        let flash = gpu.scoped("building the attention module", || {
            Flash::new(gpu, config.qk_head_dim, config.v_head_dim, half)
        })?;
        Ok(MultiHeadAttention {
            gpu: gpu.clone(),
            config,
            precision,
            flash,
            weights,
            workspaces: Mutex::new(Vec::new()),
        })
    }

    /// The sizes and options the module was built with.
    pub fn config(&self) -> &AttentionConfig {
        &self.config
    }
    /// The GPU the module runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    /// The precision this module runs: `F32` or `F16` (a `PreferF16` request resolved).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Seed 000's `forward(Q, K, V, mask)`: `[B, Lq, d]`, `[B, Lk, d]`, `[B, Lk, d]` → `[B, Lq, d]`.
    /// Pass the same tensor three times for self-attention (one fused QKV GEMM runs).
    pub fn forward(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: &Mask,
    ) -> Result<Tensor> {
        Ok(self
            .forward_with(query, key, value, mask, &ForwardOptions::default())?
            .output)
    }

    /// Seed 001's `forward(x_q, x_k_v, attn_mask)`: keys and values both come from `x_k_v`.
    pub fn forward_cross(&self, x_q: &Tensor, x_k_v: &Tensor, mask: &Mask) -> Result<Tensor> {
        self.forward(x_q, x_k_v, x_k_v, mask)
    }

    /// The general forward: options choose the path and whether probabilities come back.
    pub fn forward_with(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        self.run_host([query, key, value], mask, options, None)
    }

    /// `forward_with`, also returning GPU milliseconds per pass (empty without TIMESTAMP_QUERY).
    pub fn forward_profiled(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        // Room for the projections, every key range of a split fused pass, softmax, av and W_o.
        let mut timer = PassTimer::new(&self.gpu, 64);
        self.run_host([query, key, value], mask, options, timer.as_mut())
    }

    /// `forward` on device tensors: `[B, Lq, model_dim]`, `[B, Lk, key_dim]`, `[B, Lk, value_dim]`
    /// → a new `[B, Lq, output_dim]` device tensor. All passes go into one command encoder and
    /// one submit (it does not wait); nothing is read back, so layers chain on the GPU (to
    /// record into an encoder of your own, see [`forward_gpu_into`](Self::forward_gpu_into)):
    ///
    /// ```
    /// # use wgpu_mha::{AttentionConfig, AttentionWeights, Gpu, GpuTensor, Mask, MultiHeadAttention, Tensor};
    /// # fn main() -> wgpu_mha::Result<()> {
    /// # let gpu = Gpu::new()?;
    /// # let config = AttentionConfig::classic(64, 4)?;
    /// # let layer1 = MultiHeadAttention::new(&gpu, config, &AttentionWeights::random(&config, 1))?;
    /// # let layer2 = MultiHeadAttention::new(&gpu, config, &AttentionWeights::random(&config, 2))?;
    /// let x = GpuTensor::upload(&gpu, &Tensor::random([1, 8, 64], 0))?;
    /// let h = layer1.forward_gpu(&x, &x, &x, &Mask::Causal)?;
    /// let y = layer2.forward_gpu(&h, &h, &h, &Mask::Causal)?;
    /// let y: Tensor = y.read(&gpu)?; // the only readback
    /// # Ok(()) }
    /// ```
    ///
    /// Passing the same tensor (or clones of it) as query, key and value runs one fused QKV GEMM,
    /// as [`forward`](Self::forward) does.
    pub fn forward_gpu(
        &self,
        query: &GpuTensor,
        key: &GpuTensor,
        value: &GpuTensor,
        mask: &Mask,
    ) -> Result<GpuTensor> {
        Ok(self
            .forward_gpu_with(query, key, value, mask, &ForwardOptions::default())?
            .output)
    }

    /// Seed 001's `forward(x_q, x_k_v, attn_mask)` on device tensors.
    pub fn forward_cross_gpu(
        &self,
        x_q: &GpuTensor,
        x_k_v: &GpuTensor,
        mask: &Mask,
    ) -> Result<GpuTensor> {
        self.forward_gpu(x_q, x_k_v, x_k_v, mask)
    }

    /// `forward_with` on device tensors; probabilities, when requested, come back as a device
    /// tensor `[B, H, Lq, Lk]` too.
    pub fn forward_gpu_with(
        &self,
        query: &GpuTensor,
        key: &GpuTensor,
        value: &GpuTensor,
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<GpuForwardOutput> {
        self.run_device([query, key, value], mask, options)
    }

    /// [`forward_gpu_with`](Self::forward_gpu_with) recorded into the caller's `encoder`:
    /// every pass, and every write of this call's data, becomes a command of `encoder`;
    /// nothing is submitted, and the returned tensors hold the results once the caller has
    /// submitted `encoder` and the GPU has run it.
    ///
    /// ```
    /// # use wgpu_mha::{AttentionConfig, AttentionWeights, ForwardOptions, Gpu, GpuTensor, Mask, MultiHeadAttention, Tensor};
    /// # fn main() -> wgpu_mha::Result<()> {
    /// # let gpu = Gpu::new()?;
    /// # let config = AttentionConfig::classic(64, 4)?;
    /// # let mha = MultiHeadAttention::new(&gpu, config, &AttentionWeights::random(&config, 1))?;
    /// let x = GpuTensor::upload(&gpu, &Tensor::random([1, 8, 64], 0))?;
    /// let mut encoder = gpu.device().create_command_encoder(&Default::default());
    /// let options = ForwardOptions::default();
    /// let h = mha.forward_gpu_into(&mut encoder, &x, &x, &x, &Mask::Causal, &options)?;
    /// let y = mha.forward_gpu_into(&mut encoder, &h.output, &h.output, &h.output, &Mask::Causal, &options)?;
    /// // ... the engine's own passes on `y.output.buffer()` ...
    /// gpu.queue().submit([encoder.finish()]);
    /// let y: Tensor = y.output.read(&gpu)?;
    /// # Ok(()) }
    /// ```
    ///
    /// Who owns what (see [`crate::gpu::record`]):
    /// * the returned tensors are the caller's: new buffers, written only by this call's
    ///   commands;
    /// * the module's scratch (a workspace per shape, reused across calls) stays the module's.
    ///   Every call writes its inputs, mask and RoPE tables into it *inside its encoder* and
    ///   copies its results out of it, so any number of calls may be recorded into one encoder,
    ///   or into several encoders submitted in any order, and each computes its own result;
    /// * wgpu keeps every buffer a recorded command uses alive until the command buffer has
    ///   run (or the encoder is dropped unsubmitted: then nothing happens, and nothing is
    ///   left to clean up). The inputs are read when the GPU runs the commands, not now:
    ///   commands the caller records into `encoder` before this call are seen by it, later
    ///   ones are not.
    ///
    /// Errors: every argument is checked, and every buffer and bind group this call needs is
    /// made, before its first command is recorded, so an `Err` leaves `encoder` as it was
    /// (but for running out of memory while recording: see [`crate::gpu::record`]).
    /// wgpu checks recorded commands when the encoder is finished (wgpu 30): an error there
    /// reaches the caller's error scope, not this call. Probabilities, when requested, come
    /// back as a device tensor; [`forward_profiled`](Self::forward_profiled)'s timing has no
    /// recording form. To read inputs from and write the output into buffers of your own (at
    /// offsets, in slabs), see [`record_forward`](Self::record_forward).
    pub fn forward_gpu_into(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        query: &GpuTensor,
        key: &GpuTensor,
        value: &GpuTensor,
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<GpuForwardOutput> {
        self.record_device(encoder, [query, key, value], mask, options)
    }

    /// Bytes of GPU memory held by this module's cached workspaces.
    pub fn workspace_bytes(&self) -> u64 {
        self.workspaces
            .lock()
            .map(|w| w.iter().map(Workspace::bytes).sum())
            .unwrap_or(0)
    }
}
