//! # wgpu-mha
//!
//! Transformer multi-head attention on any GPU (Vulkan, Metal, DX12, GL) through wgpu, as a
//! pipeline of WGSL compute passes over storage buffers. It reproduces two PyTorch modules:
//!
//! * **classic** — `MultiHeadAttention(d_model, num_heads)` with `W_q, W_k, W_v, W_o`
//!   ([`AttentionConfig::classic`]), mask `0 = masked` ([`Mask::Attend`]);
//! * **per-head** — `MultiHeadAttention(emb_size, q_k_size, v_size, head)`, cross-attention
//!   without an output projection ([`AttentionConfig::per_head`]), mask `true = masked`
//!   ([`Mask::Block`]).
//!
//! ```
//! use wgpu_mha::{AttentionConfig, AttentionWeights, Gpu, Mask, MultiHeadAttention, Tensor};
//! # fn main() -> wgpu_mha::Result<()> {
//! let gpu = Gpu::new()?;
//! let config = AttentionConfig::classic(512, 8)?;
//! let weights = AttentionWeights::random(&config, 0);
//! let mha = MultiHeadAttention::new(&gpu, config, &weights)?;
//! let x = Tensor::random([2, 16, 512], 1);
//! let y = mha.forward(&x, &x, &x, &Mask::Causal)?; // [2, 16, 512]
//! # Ok(()) }
//! ```
//!
//! Inference helpers: [`GpuTensor`] keeps activations on the device so layers chain without
//! readback ([`MultiHeadAttention::forward_gpu`]); [`KvCache`] keeps projected keys and values on
//! the device for token-by-token causal decoding ([`MultiHeadAttention::forward_step`]). To run
//! inside an engine's own submissions, [`MultiHeadAttention::forward_gpu_into`] and
//! [`MultiHeadAttention::forward_step_gpu_into`] record into the caller's command encoder and
//! submit nothing (ownership rules in [`gpu::record`]).
//!
//! Masked scores are *replaced* by −1e9 as the seeds do, so a query whose keys are all masked
//! returns the mean of V (never NaN), on every path.
//!
//! ## Map of the API
//!
//! * **A module**: [`MultiHeadAttention`] from an [`AttentionConfig`] and [`AttentionWeights`]
//!   (or [`Precision::F16`]); inputs are [`Tensor`]s on the host or [`GpuTensor`]s on the
//!   device, masks a [`Mask`]; [`ForwardOptions`] picks the [`AttentionPath`] and asks for the
//!   weights.
//! * **A device**: [`Gpu`] (`Gpu::new`, [`GpuOptions`], or the caller's own device through
//!   `Gpu::from_device`); [`list_adapters`]; what each path needs of the device: [`PATH_NEEDS`].
//!   Recording into the caller's encoder: [`gpu::record`].
//! * **The attention core on the caller's buffers**: [`scaled_dot_product_attention`] and
//!   [`record_scaled_dot_product_attention`] over [`DeviceTensor`]s, with [`SdpaOptions`].
//! * **Decoding**: [`KvCache`] (f32, f16 or quantized, [`KvDtype`]) stepped with
//!   [`MultiHeadAttention::forward_step`] and [`StepOptions`].
//! * **Serving many sequences**: [`serve`] — a paged pool ([`serve::PagedKvPool`]), FlashInfer's
//!   CSR page tables ([`serve::PageTable`]), one plan per step reused by every layer
//!   ([`serve::BatchAttention`]), merged partial states ([`serve::merge_states`]).
//! * **Checkpoints and files**: Hugging Face checkpoints as saved ([`io::hf::HfCheckpoint`],
//!   [`io::hf::HfAttention`]), PyTorch state dicts ([`LoadedWeights`]), case files ([`Case`]),
//!   [`SafetensorsFile`].
//! * **The f64 reference** every test compares against: [`reference`](mod@reference).
//! * **Errors**: one value-carrying [`Error`]; bad input is an `Err` naming it before anything
//!   is dispatched.

#![warn(missing_docs)]

pub mod attention;
pub mod error;
pub mod gpu;
pub mod io;
// The passes' launchers: public for the CLI's benchmarks and the tests, not an API (hidden
// from the docs; their contract is the shaders' headers and `attention`'s use of them).
#[doc(hidden)]
pub mod kernels;
pub mod kv_dtype;
pub mod model;
pub mod reference;
pub mod sdpa;
pub mod serve;

pub use attention::gpu_tensor::{GpuTensor, ReadFuture};
pub use attention::kv_cache::{KvCache, KvCacheBytes, KvView, StepOptions};
pub use attention::{
    AttentionPath, DeviceForwardOutput, ForwardOptions, ForwardOutput, GpuForwardOutput,
    MultiHeadAttention, Precision,
};
pub use error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
pub use gpu::list_adapters;
pub use gpu::timer::PassTimer;
pub use gpu::{
    DeviceOptions, Gpu, GpuOptions, KernelClass, LiveObjects, PathNeeds, PipelineCacheDir,
    PATH_NEEDS,
};
pub use io::case::{Case, CaseResult, CaseVariant};
pub use io::layouts::{LoadedWeights, WeightLayout};
pub use io::safetensors::SafetensorsFile;
pub use kv_dtype::KvDtype;
pub use model::config::AttentionConfig;
pub use model::mask::{Mask, MaskTensor, PaddingMask};
pub use model::qk_norm::{NormKind, NormScope, QkNorm, QkNormWeights};
pub use model::tensor::{max_abs_diff, max_abs_error, Tensor};
pub use model::weights::{AttentionWeights, BiasKv, Linear};
pub use sdpa::{
    record_scaled_dot_product_attention, scaled_dot_product_attention, CausalAlignment,
    DeviceTensor, Elem, Layout, SdpaOptions, SdpaOutput,
};

/// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's pages (docs/): their Rust blocks compile as doctests too.
#[cfg(doctest)]
pub mod guide_doctests {
    #[doc = include_str!("../docs/README.md")]
    pub struct Readme;
    #[doc = include_str!("../docs/benchmarks.md")]
    pub struct Benchmarks;
    #[doc = include_str!("../docs/browser.md")]
    pub struct Browser;
    #[doc = include_str!("../docs/embedding.md")]
    pub struct Embedding;
    #[doc = include_str!("../docs/errors-and-limits.md")]
    pub struct ErrorsAndLimits;
    #[doc = include_str!("../docs/getting-started.md")]
    pub struct GettingStarted;
    #[doc = include_str!("../docs/how-it-runs.md")]
    pub struct HowItRuns;
    #[doc = include_str!("../docs/huggingface.md")]
    pub struct Huggingface;
    #[doc = include_str!("../docs/masks.md")]
    pub struct Masks;
    #[doc = include_str!("../docs/python.md")]
    pub struct Python;
    #[doc = include_str!("../docs/serving.md")]
    pub struct Serving;
    #[doc = include_str!("../docs/testing.md")]
    pub struct Testing;
}
