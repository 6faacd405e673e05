//! `MultiHeadAttention`: the forward of both seed modules as a chain of WGSL passes.
//!
//! Read `encode_forward` top to bottom: it is the seeds' `forward`, one dispatch per line.

pub mod gpu_tensor;
pub mod kv_cache;

use std::sync::{Arc, Mutex};

use crate::attention::gpu_tensor::GpuTensor;
use crate::error::{Error, Result};
use crate::gpu::timer::PassTimer;
use crate::gpu::Gpu;
use crate::kernels::{
    self, av_combine::AvParams, flash_attention::FlashParams, linear::LinearParams,
    linear::LinearVariant, linear::Segment, scores::ScoresParams, softmax::SoftmaxParams,
    MaskParams, Pass,
};
use crate::model::config::AttentionConfig;
use crate::model::mask::{AttnDims, Mask, ResolvedMask};
use crate::model::tensor::Tensor;
use crate::model::weights::AttentionWeights;

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
/// for [`AttentionPath::MultiPass`] is `Err(Unsupported)`, and so is a [`crate::KvCache`] over
/// it. Use an `F32` module for those.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// f32 everywhere (what [`MultiHeadAttention::new`] builds).
    #[default]
    F32,
    /// f16 weights and Q/K/V; `Err(Unsupported)` where the adapter lacks `SHADER_F16` or the
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
    pub path: AttentionPath,
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

/// Which inputs are the same tensor: decides how many projection GEMMs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Sharing {
    /// query = key = value: one fused QKV GEMM.
    SelfAttention,
    /// key = value (seed 001's `x_k_v`): Q GEMM + fused KV GEMM.
    SharedKeyValue,
    /// Three inputs, three GEMMs.
    Distinct,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ShapeKey {
    batch: usize,
    lq: usize,
    lk: usize,
    sharing: Sharing,
    fused: bool,
    probs: bool,
}

/// Weights on the GPU: `[W_q | W_k | W_v]` and their biases packed so that the rows of a fused
/// QKV (or KV) projection are contiguous.
pub(crate) struct GpuWeights {
    pub(crate) w_qkv: wgpu::Buffer,
    pub(crate) b_qkv: wgpu::Buffer,
    pub(crate) w_o: Option<(wgpu::Buffer, wgpu::Buffer)>,
    /// Element offsets of W_k, W_v in `w_qkv` and of b_k, b_v in `b_qkv`.
    pub(crate) w_k_offset: u32,
    pub(crate) w_v_offset: u32,
    pub(crate) b_k_offset: u32,
    pub(crate) b_v_offset: u32,
}

/// One projection GEMM of a forward, before its buffers are bound.
struct ProjectionPlan {
    /// Which uploaded input (0 = query, 1 = key or key/value, 2 = value).
    input: usize,
    rows: usize,
    seq_len: usize,
    /// Input features.
    width: usize,
    /// Element offsets of this GEMM's weight rows and biases in `w_qkv` / `b_qkv`.
    w_offset: u32,
    bias_offset: u32,
    /// Where its output columns go in [Q | K | V].
    segments: Vec<Segment>,
}

/// One projection dispatch of a workspace.
struct Projection {
    _params: wgpu::Buffer,
    /// Which GEMM kernel: the vec4 one only where the host proved every index in range; the
    /// f16 scalar ones in an f16 module.
    pass: Arc<Pass>,
    bind: wgpu::BindGroup,
    workgroups: [u32; 3],
}

/// Buffers, uniforms and bind groups for one problem shape, reused across calls.
struct Workspace {
    key: ShapeKey,
    inputs: Vec<wgpu::Buffer>,
    qkv: wgpu::Buffer,
    scores: Option<wgpu::Buffer>,
    combined: wgpu::Buffer,
    output: Option<wgpu::Buffer>,
    staging: wgpu::Buffer,
    mask: wgpu::Buffer,
    mask_capacity_words: usize,
    projections: Vec<Projection>,
    /// The attention core's dispatches: `scores` alone, or `flash_attention` once per key range.
    core: Vec<CoreDispatch>,
    /// Running softmax state passed between the key ranges of a split fused pass.
    carry: Option<wgpu::Buffer>,
    softmax: Option<(wgpu::BindGroup, [u32; 3])>,
    av: Option<(wgpu::BindGroup, [u32; 3])>,
    out_proj: Option<Projection>,
    /// Base parameters of the attention pass; the mask part is filled per call.
    scores_params: ScoresParams,
    bytes: u64,
}

/// One dispatch of the attention core, with the parameters it is given on every call (the mask
/// part is filled in per call).
struct CoreDispatch {
    params: wgpu::Buffer,
    bind: wgpu::BindGroup,
    workgroups: [u32; 3],
    /// This key range's flash parameters (unused by `scores`).
    flash: FlashParams,
}

/// Most workspaces kept per module (one per shape, and one per concurrent caller).
const MAX_CACHED_WORKSPACES: usize = 8;

/// A multi-head attention module on the GPU: pipelines built once, weights uploaded once.
pub struct MultiHeadAttention {
    // pub(crate): `kv_cache` records the same passes against its own buffers.
    pub(crate) gpu: Gpu,
    pub(crate) config: AttentionConfig,
    // Passes are shared by every module on the same `Gpu` (see `Gpu::pass`).
    pub(crate) linear: Arc<Pass>,
    /// The vec4 GEMM without runtime bounds checks (see `kernels::linear::variant`).
    linear_vec4: Arc<Pass>,
    pub(crate) scores: Arc<Pass>,
    pub(crate) softmax: Arc<Pass>,
    pub(crate) av_combine: Arc<Pass>,
    pub(crate) flash: Option<Arc<Pass>>,
    /// `F32` or `F16` (never `PreferF16`): what this module runs.
    precision: Precision,
    /// In an f16 module: the Q/K/V projection (f16 out) and `W_o` (f32 out) passes.
    linear_f16: Option<(Arc<Pass>, Arc<Pass>)>,
    /// Keys per staged flash tile, and tiles per flash dispatch (see `tiles_per_dispatch`).
    pub(crate) flash_tile: u32,
    pub(crate) flash_tiles_per_dispatch: u32,
    pub(crate) weights: GpuWeights,
    /// Host copy of `W_o.bias`: the whole answer when there are no keys.
    output_bias: Option<Vec<f32>>,
    /// A 16-byte zero buffer bound where a pass has no bias.
    pub(crate) empty: wgpu::Buffer,
    workspaces: Mutex<Vec<Workspace>>,
}

pub(crate) fn storage_buffer(
    device: &wgpu::Device,
    label: &str,
    bytes: u64,
    extra: wgpu::BufferUsages,
) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        // wgpu rejects zero-sized bindings; 16 bytes is the smallest safe size everywhere.
        size: bytes.max(16).next_multiple_of(4),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | extra,
        mapped_at_creation: false,
    })
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

/// Uploads `data` as f32, or converted to f16 when `as_f16` (byte size rounded up to 4, at least 16).
fn upload_as(device: &wgpu::Device, label: &str, data: &[f32], as_f16: bool) -> wgpu::Buffer {
    if !as_f16 {
        return upload(device, label, data);
    }
    use wgpu::util::DeviceExt;
    let mut packed: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
    packed.resize(data.len().max(8).next_multiple_of(2), half::f16::ZERO);
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytemuck::cast_slice(&packed),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
    })
}

fn upload(device: &wgpu::Device, label: &str, data: &[f32]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    let mut padded = data.to_vec();
    padded.resize(data.len().max(4), 0.0);
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytemuck::cast_slice(&padded),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
    })
}

/// Checks the three inputs against the config: `[B, Lq, model_dim]`, `[B, Lk, key_dim]`,
/// `[B, Lk, value_dim]`.
pub(crate) fn check_inputs(
    c: &AttentionConfig,
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
) -> Result<()> {
    check_input_shapes(c, query.shape(), key.shape(), value.shape())
}

/// `check_inputs` on bare shapes (host or GPU tensors).
pub(crate) fn check_input_shapes(
    c: &AttentionConfig,
    query: &[usize],
    key: &[usize],
    value: &[usize],
) -> Result<()> {
    let rank3 = |name: &str, s: &[usize], width: usize, what: &str| -> Result<()> {
        if s.len() != 3 || s[2] != width {
            return Err(Error::shape(name, format!("[batch, {what}, {width}]"), s));
        }
        Ok(())
    };
    rank3("query", query, c.model_dim, "Lq")?;
    rank3("key", key, c.key_dim, "Lk")?;
    rank3("value", value, c.value_dim, "Lk")?;
    let (qs, ks, vs) = (query, key, value);
    if ks[0] != qs[0] {
        return Err(Error::shape(
            "key",
            format!("batch {} like the query", qs[0]),
            ks,
        ));
    }
    if vs[0] != qs[0] || vs[1] != ks[1] {
        return Err(Error::shape(
            "value",
            format!(
                "[{}, {}, {}] (batch and Lk of the key)",
                qs[0], ks[1], c.value_dim
            ),
            vs,
        ));
    }
    Ok(())
}

impl MultiHeadAttention {
    /// Builds the pipelines and uploads the weights (checked against the config first); f32
    /// throughout ([`Precision::F32`]).
    pub fn new(gpu: &Gpu, config: AttentionConfig, weights: &AttentionWeights) -> Result<Self> {
        Self::with_precision(gpu, config, weights, Precision::F32)
    }

    /// [`new`](Self::new) with a storage precision (see [`Precision`]). `F16` is
    /// `Err(Unsupported)` on an adapter without `SHADER_F16` or for head sizes the fused kernel
    /// cannot stage; `PreferF16` falls back to `F32` in both cases.
    pub fn with_precision(
        gpu: &Gpu,
        config: AttentionConfig,
        weights: &AttentionWeights,
        precision: Precision,
    ) -> Result<Self> {
        let config = config.validated()?;
        weights.check(&config)?;
        let flash_fits = kernels::flash_attention::kv_tile(
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
                    what: "f16 precision (the adapter lacks SHADER_F16)".into(),
                })
            }
            Precision::F16 if !flash_fits => {
                return Err(Error::Unsupported {
                    adapter: gpu.describe(),
                    what: format!(
                        "f16 precision with head sizes q/k {} + v {} (f16 runs only the fused kernel, whose tile of {} K/V rows must fit the {} bytes of workgroup memory)",
                        config.qk_head_dim,
                        config.v_head_dim,
                        kernels::flash_attention::KEY_GROUP,
                        gpu.limits().max_compute_workgroup_storage_size
                    ),
                })
            }
            Precision::F16 => Precision::F16,
        };
        let half = precision == Precision::F16;
        let elem = if half { 2 } else { 4 };
        let limit = gpu.limits().max_storage_buffer_binding_size;
        let weight_bytes = elem
            * (weights.q.weight.len() + weights.k.weight.len() + weights.v.weight.len()) as u64;
        if weight_bytes > limit {
            return Err(Error::TooLarge {
                what: "the Q/K/V projection weights".into(),
                needed: weight_bytes,
                limit,
            });
        }
        if let Some(o) = &weights.o {
            let needed = elem * o.weight.len() as u64;
            if needed > limit {
                return Err(Error::TooLarge {
                    what: "the output projection weight".into(),
                    needed,
                    limit,
                });
            }
        }
        let device = gpu.device();
        gpu.scoped("building the attention module", || {
            let mut w_qkv = weights.q.weight.clone();
            w_qkv.extend_from_slice(&weights.k.weight);
            w_qkv.extend_from_slice(&weights.v.weight);
            let bias_of = |l: &crate::model::weights::Linear| l.bias.clone().unwrap_or_default();
            let mut b_qkv = bias_of(&weights.q);
            b_qkv.extend(bias_of(&weights.k));
            b_qkv.extend(bias_of(&weights.v));
            let gpu_weights = GpuWeights {
                w_qkv: upload_as(device, "W_qkv", &w_qkv, half),
                b_qkv: upload(device, "b_qkv", &b_qkv),
                w_o: weights.o.as_ref().map(|o| {
                    (
                        upload_as(device, "W_o", &o.weight, half),
                        upload(device, "b_o", &bias_of(o)),
                    )
                }),
                w_k_offset: weights.q.weight.len() as u32,
                w_v_offset: (weights.q.weight.len() + weights.k.weight.len()) as u32,
                b_k_offset: config.qk_width() as u32,
                b_v_offset: 2 * config.qk_width() as u32,
            };
            let flash_tile = kernels::flash_attention::kv_tile(
                config.qk_head_dim,
                config.v_head_dim,
                gpu.limits().max_compute_workgroup_storage_size,
            );
            let flash = flash_tile.map(|tile| {
                kernels::flash_attention::pass(
                    gpu,
                    config.qk_head_dim,
                    config.v_head_dim,
                    tile,
                    half,
                )
            });
            let linear_f16 = half.then(|| {
                use kernels::linear::F16Output;
                (
                    kernels::linear::pass_f16(gpu, F16Output::Half),
                    kernels::linear::pass_f16(gpu, F16Output::Full),
                )
            });
            let flash_tile = flash_tile.unwrap_or(1);
            let software = gpu.info().device_type == wgpu::DeviceType::Cpu;
            let flash_tiles_per_dispatch = kernels::flash_attention::tiles_per_dispatch(
                config.qk_head_dim,
                config.v_head_dim,
                flash_tile,
                kernels::flash_attention::rows_per_thread(gpu),
                software,
            );
            MultiHeadAttention {
                gpu: gpu.clone(),
                config,
                linear: kernels::linear::pass(gpu, LinearVariant::Scalar),
                linear_vec4: kernels::linear::pass(gpu, LinearVariant::Vec4),
                scores: kernels::scores::pass(gpu),
                softmax: kernels::softmax::pass(gpu),
                av_combine: kernels::av_combine::pass(gpu),
                flash,
                precision,
                linear_f16,
                flash_tile,
                flash_tiles_per_dispatch,
                weights: gpu_weights,
                output_bias: weights.o.as_ref().and_then(|o| o.bias.clone()),
                empty: storage_buffer(device, "empty", 16, wgpu::BufferUsages::empty()),
                workspaces: Mutex::new(Vec::new()),
            }
        })
    }

    pub fn config(&self) -> &AttentionConfig {
        &self.config
    }
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
        self.run(query, key, value, mask, options, None)
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
        self.run(query, key, value, mask, options, timer.as_mut())
    }

    /// `forward` on device tensors: `[B, Lq, model_dim]`, `[B, Lk, key_dim]`, `[B, Lk, value_dim]`
    /// → a new `[B, Lq, output_dim]` device tensor. All passes go into one command encoder and
    /// one submit; nothing is read back, so layers chain on the GPU:
    ///
    /// ```no_run
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
        let (dims, resolved, path) =
            self.plan(query.shape(), key.shape(), value.shape(), mask, options)?;
        let AttnDims {
            batch,
            heads,
            lq,
            lk,
        } = dims;
        let fused = path == AttentionPath::Fused;
        if batch == 0 || lq == 0 || lk == 0 {
            let host = self.empty_forward(dims, options, path);
            return Ok(GpuForwardOutput {
                output: GpuTensor::upload(&self.gpu, &host.output)?,
                probs: host
                    .probs
                    .map(|p| GpuTensor::upload(&self.gpu, &p))
                    .transpose()?,
                path,
            });
        }
        let same =
            |a: &GpuTensor, b: &GpuTensor| a.buffer() == b.buffer() && a.shape() == b.shape();
        let sharing = if same(query, key) && same(key, value) {
            Sharing::SelfAttention
        } else if same(key, value) {
            Sharing::SharedKeyValue
        } else {
            Sharing::Distinct
        };
        let shape = ShapeKey {
            batch,
            lq,
            lk,
            sharing,
            fused,
            probs: options.return_probs,
        };
        let output = GpuTensor::zeros(&self.gpu, &[batch, lq, self.config.output_dim()])?;
        let probs = match options.return_probs {
            true => Some(GpuTensor::zeros(&self.gpu, &[batch, heads, lq, lk])?),
            false => None,
        };
        let mut ws = self.take_workspace(shape)?;
        let result = self.gpu.scoped("forward_gpu", || {
            self.write_mask(&mut ws, &resolved, &resolved.words);
            let mut encoder =
                self.gpu
                    .device()
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("forward_gpu"),
                    });
            let sources: Vec<&GpuTensor> = match sharing {
                Sharing::SelfAttention => vec![query],
                Sharing::SharedKeyValue => vec![query, key],
                Sharing::Distinct => vec![query, key, value],
            };
            for (buffer, tensor) in ws.inputs.iter().zip(sources) {
                encoder.copy_buffer_to_buffer(tensor.buffer(), 0, buffer, 0, tensor.byte_len());
            }
            self.encode_forward(&ws, &mut encoder, None);
            let result = ws.output.as_ref().unwrap_or(&ws.combined);
            encoder.copy_buffer_to_buffer(result, 0, output.buffer(), 0, output.byte_len());
            if let (Some(probs), Some(scores)) = (&probs, &ws.scores) {
                encoder.copy_buffer_to_buffer(scores, 0, probs.buffer(), 0, probs.byte_len());
            }
            self.gpu.queue().submit([encoder.finish()]);
        });
        // Queue order keeps the next call's uploads behind this submission, so the workspace
        // can be reused at once.
        if result.is_ok() {
            self.return_workspace(ws);
        }
        result?;
        Ok(GpuForwardOutput {
            output,
            probs,
            path,
        })
    }

    /// Bytes of GPU memory held by this module's cached workspaces.
    pub fn workspace_bytes(&self) -> u64 {
        self.workspaces
            .lock()
            .map(|w| w.iter().map(|ws| ws.bytes).sum())
            .unwrap_or(0)
    }

    fn run(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: &Mask,
        options: &ForwardOptions,
        timer: Option<&mut PassTimer>,
    ) -> Result<ForwardOutput> {
        let (dims, resolved, path) =
            self.plan(query.shape(), key.shape(), value.shape(), mask, options)?;
        let AttnDims { batch, lq, lk, .. } = dims;
        let fused = path == AttentionPath::Fused;
        if batch == 0 || lq == 0 || lk == 0 {
            return Ok(self.empty_forward(dims, options, path));
        }
        let sharing = if std::ptr::eq(query, key) && std::ptr::eq(key, value) {
            Sharing::SelfAttention
        } else if std::ptr::eq(key, value) {
            Sharing::SharedKeyValue
        } else {
            Sharing::Distinct
        };
        let whole = ShapeKey {
            batch,
            lq,
            lk,
            sharing,
            fused,
            probs: options.return_probs,
        };
        let (batch_chunk, query_chunk) = self.plan_chunks(whole)?;
        if batch_chunk == batch && query_chunk == lq {
            return self.run_chunk(whole, query, key, value, &resolved, &resolved.words, timer);
        }
        self.run_chunked(
            whole,
            (batch_chunk, query_chunk),
            query,
            key,
            value,
            &resolved,
        )
    }

    /// The largest (batch, query) block sizes whose workspace fits the device: whole batches
    /// first, then query blocks (queries are independent given all keys). `Err(TooLarge)` only
    /// when one batch of one query does not fit.
    fn plan_chunks(&self, whole: ShapeKey) -> Result<(usize, usize)> {
        let mut batch = whole.batch;
        loop {
            match self.check_limits(ShapeKey { batch, ..whole }) {
                Ok(()) => return Ok((batch, whole.lq)),
                Err(e) if batch == 1 => {
                    let _ = e;
                    break;
                }
                Err(_) => batch = batch.div_ceil(2),
            }
        }
        // One batch at a time no longer shares the query with key/value once queries split.
        let sharing = match whole.sharing {
            Sharing::SelfAttention => Sharing::SharedKeyValue,
            s => s,
        };
        let mut queries = whole.lq;
        loop {
            let key = ShapeKey {
                batch: 1,
                lq: queries,
                sharing,
                ..whole
            };
            match self.check_limits(key) {
                Ok(()) => return Ok((1, queries)),
                Err(e) if queries == 1 => return Err(e),
                Err(_) => queries = queries.div_ceil(2),
            }
        }
    }

    /// Runs the problem as blocks of `(batch_chunk, query_chunk)`, each its own submit, and
    /// assembles the outputs (and probabilities) on the host.
    fn run_chunked(
        &self,
        whole: ShapeKey,
        (batch_chunk, query_chunk): (usize, usize),
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: &ResolvedMask,
    ) -> Result<ForwardOutput> {
        let c = &self.config;
        let (batch, lq, lk, heads) = (whole.batch, whole.lq, whole.lk, c.heads);
        let out_dim = c.output_dim();
        let mut output = Tensor::zeros([batch, lq, out_dim]);
        let mut probs = whole.probs.then(|| Tensor::zeros([batch, heads, lq, lk]));
        let path = if whole.fused {
            AttentionPath::Fused
        } else {
            AttentionPath::MultiPass
        };
        for b0 in (0..batch).step_by(batch_chunk) {
            let nb = batch_chunk.min(batch - b0);
            let kv_rows = |t: &Tensor| slice_rows(t, b0..b0 + nb, 0..lk);
            let k = kv_rows(key);
            let v = if whole.sharing == Sharing::Distinct {
                kv_rows(value)
            } else {
                k.clone()
            };
            for i0 in (0..lq).step_by(query_chunk) {
                let nq = query_chunk.min(lq - i0);
                let q = slice_rows(query, b0..b0 + nb, i0..i0 + nq);
                let sharing = match whole.sharing {
                    Sharing::SelfAttention if nq == lq => Sharing::SelfAttention,
                    Sharing::Distinct => Sharing::Distinct,
                    _ => Sharing::SharedKeyValue,
                };
                let shape = ShapeKey {
                    batch: nb,
                    lq: nq,
                    sharing,
                    ..whole
                };
                let (q_in, k_in, v_in) = match sharing {
                    Sharing::SelfAttention => (&k, &k, &k),
                    Sharing::SharedKeyValue => (&q, &k, &k),
                    Sharing::Distinct => (&q, &k, &v),
                };
                let part = self.run_chunk(
                    shape,
                    q_in,
                    k_in,
                    v_in,
                    &mask.chunk(b0, i0),
                    &mask.words,
                    None,
                )?;
                // Scatter the block's rows back into place.
                for b in 0..nb {
                    let src = &part.output.data()[b * nq * out_dim..(b + 1) * nq * out_dim];
                    let dst = ((b0 + b) * lq + i0) * out_dim;
                    output.data_mut()[dst..dst + nq * out_dim].copy_from_slice(src);
                }
                if let (Some(all), Some(p)) = (probs.as_mut(), part.probs.as_ref()) {
                    for b in 0..nb {
                        for h in 0..heads {
                            let src = &p.data()[((b * heads + h) * nq) * lk..][..nq * lk];
                            let dst = (((b0 + b) * heads + h) * lq + i0) * lk;
                            all.data_mut()[dst..dst + nq * lk].copy_from_slice(src);
                        }
                    }
                }
            }
        }
        Ok(ForwardOutput {
            output,
            probs,
            path,
            pass_ms: Vec::new(),
        })
    }

    /// One workspace, one encoder, one submit, one readback.
    #[allow(clippy::too_many_arguments)]
    fn run_chunk(
        &self,
        shape: ShapeKey,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: &ResolvedMask,
        mask_words: &[u32],
        mut timer: Option<&mut PassTimer>,
    ) -> Result<ForwardOutput> {
        let ShapeKey { batch, lq, lk, .. } = shape;
        let path = if shape.fused {
            AttentionPath::Fused
        } else {
            AttentionPath::MultiPass
        };
        let mut ws = self.take_workspace(shape)?;
        let result = self.gpu.scoped("forward", || -> Result<_> {
            self.write_inputs(&mut ws, query, key, value, mask, mask_words);
            let mut encoder =
                self.gpu
                    .device()
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("forward"),
                    });
            self.encode_forward(&ws, &mut encoder, timer.as_deref_mut());
            self.encode_readback(&ws, &mut encoder);
            if let Some(t) = timer.as_deref() {
                t.resolve(&mut encoder);
            }
            self.gpu.queue().submit([encoder.finish()]);
            let out_len = batch * lq * self.config.output_dim();
            let probs_len = if shape.probs {
                batch * self.config.heads * lq * lk
            } else {
                0
            };
            let mut values = self.gpu.read_f32(&ws.staging, out_len + probs_len)?;
            let probs = values.split_off(out_len);
            let pass_ms = match timer {
                Some(t) => t.read(&self.gpu)?,
                None => Vec::new(),
            };
            Ok(ForwardOutput {
                output: Tensor::new([batch, lq, self.config.output_dim()], values)?,
                probs: if shape.probs {
                    Some(Tensor::new([batch, self.config.heads, lq, lk], probs)?)
                } else {
                    None
                },
                path,
                pass_ms,
            })
        });
        // A workspace that saw an error may hold half-written state; drop it then.
        if matches!(result, Ok(Ok(_))) {
            self.return_workspace(ws);
        }
        result?
    }

    fn linear_pass(&self, variant: LinearVariant) -> Arc<Pass> {
        match variant {
            LinearVariant::Scalar => self.linear.clone(),
            LinearVariant::Vec4 => self.linear_vec4.clone(),
            LinearVariant::Subgroup => kernels::linear::pass(&self.gpu, variant),
        }
    }

    /// The seeds' `forward`, one dispatch per step, all in one encoder.
    fn encode_forward(
        &self,
        ws: &Workspace,
        encoder: &mut wgpu::CommandEncoder,
        mut timer: Option<&mut PassTimer>,
    ) {
        // Q, K, V = split_heads(W_q(query)), split_heads(W_k(key)), split_heads(W_v(value))
        for p in &ws.projections {
            p.pass
                .dispatch(encoder, &p.bind, p.workgroups, timer.as_deref_mut());
        }
        if ws.key.fused {
            // combined = combine_heads(softmax(mask(Q·Kᵀ·scale))·V), without the scores buffer
            // (once per key range when long keys are split; see `tiles_per_dispatch`)
            if let Some(flash) = &self.flash {
                for d in &ws.core {
                    flash.dispatch(encoder, &d.bind, d.workgroups, timer.as_deref_mut());
                }
            }
        } else {
            // scores = mask(Q·Kᵀ·scale)
            for d in &ws.core {
                self.scores
                    .dispatch(encoder, &d.bind, d.workgroups, timer.as_deref_mut());
            }
            // probs = softmax(scores), in place
            if let Some((bind, groups)) = &ws.softmax {
                self.softmax
                    .dispatch(encoder, bind, *groups, timer.as_deref_mut());
            }
            // combined = combine_heads(probs · V)
            if let Some((bind, groups)) = &ws.av {
                self.av_combine
                    .dispatch(encoder, bind, *groups, timer.as_deref_mut());
            }
        }
        // output = W_o(combined), when the module has an output projection
        if let Some(p) = &ws.out_proj {
            p.pass.dispatch(encoder, &p.bind, p.workgroups, timer);
        }
    }

    /// Copies the output (and the probabilities when asked for) into the staging buffer.
    fn encode_readback(&self, ws: &Workspace, encoder: &mut wgpu::CommandEncoder) {
        let result = ws.output.as_ref().unwrap_or(&ws.combined);
        let out_bytes = (ws.key.batch * ws.key.lq * self.config.output_dim() * 4) as u64;
        encoder.copy_buffer_to_buffer(result, 0, &ws.staging, 0, out_bytes);
        if let (true, Some(scores)) = (ws.key.probs, &ws.scores) {
            let probs_bytes = (ws.key.batch * self.config.heads * ws.key.lq * ws.key.lk * 4) as u64;
            encoder.copy_buffer_to_buffer(scores, 0, &ws.staging, out_bytes, probs_bytes);
        }
    }

    /// Picks fused or multi-pass, and refuses problems that fit neither.
    /// What every forward settles before anything touches the GPU: the input shapes are
    /// checked, the mask is checked and lowered, and the path is chosen.
    fn plan(
        &self,
        query: &[usize],
        key: &[usize],
        value: &[usize],
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<(AttnDims, ResolvedMask, AttentionPath)> {
        check_input_shapes(&self.config, query, key, value)?;
        let dims = AttnDims {
            batch: query[0],
            heads: self.config.heads,
            lq: query[1],
            lk: key[1],
        };
        let resolved = mask.resolve(dims)?;
        let path = if self.choose_path(options)? {
            AttentionPath::Fused
        } else {
            AttentionPath::MultiPass
        };
        Ok((dims, resolved, path))
    }

    fn choose_path(&self, options: &ForwardOptions) -> Result<bool> {
        let fused_ok = self.flash.is_some();
        let multi_pass = options.return_probs || options.path == AttentionPath::MultiPass;
        if self.precision == Precision::F16 && multi_pass {
            return Err(Error::Unsupported {
                adapter: self.gpu.describe(),
                what: "the multi-pass path (attention probabilities or AttentionPath::MultiPass) in an f16 module; build it with Precision::F32".into(),
            });
        }
        match options.path {
            AttentionPath::Fused if options.return_probs => Err(Error::Config(
                "the fused path cannot return attention probabilities; use Auto or MultiPass".into(),
            )),
            AttentionPath::Fused if !fused_ok => Err(Error::Unsupported {
                adapter: self.gpu.describe(),
                what: format!(
                    "fused attention with head sizes q/k {} + v {} (a tile of {} K/V rows must fit the {} bytes of workgroup memory)",
                    self.config.qk_head_dim,
                    self.config.v_head_dim,
                    kernels::flash_attention::KEY_GROUP,
                    self.gpu.limits().max_compute_workgroup_storage_size
                ),
            }),
            AttentionPath::Fused => Ok(true),
            AttentionPath::MultiPass => Ok(false),
            AttentionPath::Auto => Ok(fused_ok && !options.return_probs),
        }
    }

    /// Empty problems, answered on the host with PyTorch's semantics: no rows → empty output;
    /// no keys → the attention output is 0 (a sum over nothing), so the module returns W_o's
    /// bias (classic) or zeros (per-head).
    fn empty_forward(
        &self,
        d: AttnDims,
        options: &ForwardOptions,
        path: AttentionPath,
    ) -> ForwardOutput {
        let out_dim = self.config.output_dim();
        let mut output = Tensor::zeros([d.batch, d.lq, out_dim]);
        if let Some(b_o) = &self.output_bias {
            for row in output.data_mut().chunks_mut(out_dim) {
                row.copy_from_slice(b_o);
            }
        }
        ForwardOutput {
            output,
            probs: options
                .return_probs
                .then(|| Tensor::zeros([d.batch, d.heads, d.lq, d.lk])),
            path,
            pass_ms: Vec::new(),
        }
    }

    fn take_workspace(&self, key: ShapeKey) -> Result<Workspace> {
        if let Ok(mut cache) = self.workspaces.lock() {
            if let Some(pos) = cache.iter().position(|w| w.key == key) {
                return Ok(cache.swap_remove(pos));
            }
        }
        self.gpu
            .scoped("allocating workspace", || self.new_workspace(key))?
    }

    fn return_workspace(&self, ws: Workspace) {
        if let Ok(mut cache) = self.workspaces.lock() {
            if cache.len() >= MAX_CACHED_WORKSPACES {
                cache.remove(0);
            }
            cache.push(ws);
        }
    }

    fn write_inputs(
        &self,
        ws: &mut Workspace,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: &ResolvedMask,
        mask_words: &[u32],
    ) {
        let queue = self.gpu.queue();
        let sources: Vec<&Tensor> = match ws.key.sharing {
            Sharing::SelfAttention => vec![query],
            Sharing::SharedKeyValue => vec![query, key],
            Sharing::Distinct => vec![query, key, value],
        };
        for (buffer, tensor) in ws.inputs.iter().zip(sources) {
            queue.write_buffer(buffer, 0, bytemuck::cast_slice(tensor.data()));
        }
        self.write_mask(ws, mask, mask_words);
    }

    /// Uploads the mask words and the attention pass's parameters for this call. `mask` holds
    /// this chunk's offsets; `mask_words` are the whole problem's (see `ResolvedMask::chunk`).
    fn write_mask(&self, ws: &mut Workspace, mask: &ResolvedMask, mask_words: &[u32]) {
        let queue = self.gpu.queue();
        if mask_words.len() > ws.mask_capacity_words {
            // Grow the mask buffer and rebind the pass that reads it.
            let device = self.gpu.device();
            ws.mask = storage_buffer(
                device,
                "mask",
                (mask_words.len() * 4) as u64,
                wgpu::BufferUsages::empty(),
            );
            ws.mask_capacity_words = mask_words.len();
            for i in 0..ws.core.len() {
                let bind = self.attention_bind_group(ws, &ws.core[i].params, &ws.mask);
                ws.core[i].bind = bind;
            }
        }
        if !mask_words.is_empty() {
            queue.write_buffer(&ws.mask, 0, bytemuck::cast_slice(mask_words));
        }
        let mask_params = MaskParams::from_resolved(mask);
        for d in &ws.core {
            if ws.key.fused {
                let p = FlashParams {
                    mask: mask_params,
                    ..d.flash
                };
                queue.write_buffer(&d.params, 0, bytemuck::bytes_of(&p));
            } else {
                let p = ScoresParams {
                    mask: mask_params,
                    ..ws.scores_params
                };
                queue.write_buffer(&d.params, 0, bytemuck::bytes_of(&p));
            }
        }
    }

    /// The bind group of one attention-core dispatch (scores or flash), which reads the mask.
    fn attention_bind_group(
        &self,
        ws: &Workspace,
        params: &wgpu::Buffer,
        mask: &wgpu::Buffer,
    ) -> wgpu::BindGroup {
        self.core_bind_group(
            ws.key.fused,
            params,
            &ws.qkv,
            ws.scores.as_ref(),
            &ws.combined,
            ws.carry.as_ref(),
            mask,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn core_bind_group(
        &self,
        fused: bool,
        params: &wgpu::Buffer,
        qkv: &wgpu::Buffer,
        scores: Option<&wgpu::Buffer>,
        combined: &wgpu::Buffer,
        carry: Option<&wgpu::Buffer>,
        mask: &wgpu::Buffer,
    ) -> wgpu::BindGroup {
        let device = self.gpu.device();
        match (fused, &self.flash, scores) {
            (true, Some(flash), _) => flash.bind(
                device,
                &[params, qkv, combined, carry.unwrap_or(&self.empty), mask],
            ),
            (_, _, Some(scores)) => self.scores.bind(device, &[params, qkv, scores, mask]),
            // Unreachable by construction (fused needs flash, multi-pass allocates scores);
            // bind the output so the group is still valid.
            _ => self.scores.bind(device, &[params, qkv, combined, mask]),
        }
    }

    /// The flash dispatches' key-tile ranges for `lk` keys.
    pub(crate) fn flash_ranges(&self, lk: usize) -> Vec<(u32, u32, u32)> {
        kernels::flash_attention::key_ranges(lk, self.flash_tile, self.flash_tiles_per_dispatch)
    }

    /// Bytes per element of the projected Q/K/V buffer.
    fn qkv_elem_bytes(&self) -> u64 {
        match self.precision {
            Precision::F16 => 2,
            _ => 4,
        }
    }

    /// Whether one shape's workspace and dispatches fit the device's limits.
    fn check_limits(&self, key: ShapeKey) -> Result<()> {
        let c = &self.config;
        let limits = self.gpu.limits();
        let (b, lq, lk, h) = (key.batch, key.lq, key.lk, c.heads);
        let (dk, dv) = (c.qk_head_dim, c.v_head_dim);
        let q_elems = b * h * lq * dk;
        let k_elems = b * h * lk * dk;
        let v_elems = b * h * lk * dv;
        let sizes = [
            ("query input", b * lq * c.model_dim),
            ("key input", b * lk * c.key_dim),
            ("value input", b * lk * c.value_dim),
            ("projected Q, K, V", q_elems + k_elems + v_elems),
            ("combined heads", b * lq * c.v_width()),
            ("output", b * lq * c.output_dim()),
            (
                "attention scores",
                if key.fused { 0 } else { b * h * lq * lk },
            ),
            (
                "flash carry state",
                if key.fused && self.flash_ranges(lk).len() > 1 {
                    b * h * lq * kernels::flash_attention::carry_stride(dv)
                } else {
                    0
                },
            ),
        ];
        let qkv_elem = self.qkv_elem_bytes();
        for (what, elems) in sizes {
            let elem = if what == "projected Q, K, V" {
                qkv_elem
            } else {
                4
            };
            let needed = elem * elems as u64;
            let limit = limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size);
            if needed > limit {
                return Err(Error::TooLarge {
                    what: what.into(),
                    needed,
                    limit,
                });
            }
        }
        let max_groups = limits.max_compute_workgroups_per_dimension;
        // Largest workgroup count along one dimension: (batch, head) pairs for the attention
        // passes, 64-row tiles for the projections.
        let groups = (b * h).max((b * lq.max(lk)).div_ceil(64));
        if groups as u64 > max_groups as u64 {
            return Err(Error::TooLarge {
                what: format!(
                    "a dispatch of {groups} workgroups along one dimension (count, not bytes)"
                ),
                needed: groups as u64,
                limit: max_groups as u64,
            });
        }

        Ok(())
    }

    /// Allocates every buffer and bind group of one shape (which `check_limits` accepted).
    fn new_workspace(&self, key: ShapeKey) -> Result<Workspace> {
        self.check_limits(key)?;
        let c = &self.config;
        let device = self.gpu.device();
        let limits = self.gpu.limits();
        let (b, lq, lk, h) = (key.batch, key.lq, key.lk, c.heads);
        let (dk, dv) = (c.qk_head_dim, c.v_head_dim);

        let q_elems = b * h * lq * dk;
        let k_elems = b * h * lk * dk;
        let v_elems = b * h * lk * dv;
        let none = wgpu::BufferUsages::empty();
        let widths: Vec<(&str, usize)> = match key.sharing {
            Sharing::SelfAttention => vec![("query input", b * lq * c.model_dim)],
            Sharing::SharedKeyValue => vec![
                ("query input", b * lq * c.model_dim),
                ("key/value input", b * lk * c.key_dim),
            ],
            Sharing::Distinct => vec![
                ("query input", b * lq * c.model_dim),
                ("key input", b * lk * c.key_dim),
                ("value input", b * lk * c.value_dim),
            ],
        };
        let inputs: Vec<wgpu::Buffer> = widths
            .iter()
            .map(|(label, n)| storage_buffer(device, label, 4 * *n as u64, none))
            .collect();
        let qkv = storage_buffer(
            device,
            "Q|K|V head-split",
            self.qkv_elem_bytes() * (q_elems + k_elems + v_elems) as u64,
            none,
        );
        let scores = (!key.fused).then(|| {
            storage_buffer(
                device,
                "scores",
                4 * (b * h * lq * lk) as u64,
                wgpu::BufferUsages::COPY_SRC,
            )
        });
        let combined = storage_buffer(
            device,
            "combined heads",
            4 * (b * lq * c.v_width()) as u64,
            wgpu::BufferUsages::COPY_SRC,
        );
        let output = c.output_projection.then(|| {
            storage_buffer(
                device,
                "output",
                4 * (b * lq * c.output_dim()) as u64,
                wgpu::BufferUsages::COPY_SRC,
            )
        });
        let staging_elems = b * lq * c.output_dim() + if key.probs { b * h * lq * lk } else { 0 };
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: (4 * staging_elems as u64).max(16),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });

        // Projections into [Q | K | V], each head-split.
        let (q_dst, k_dst, v_dst) = (0u32, q_elems as u32, (q_elems + k_elems) as u32);
        let seg = |heads: usize, head_dim: usize, dst: u32| Segment {
            heads: heads as u32,
            head_dim: head_dim as u32,
            dst,
        };
        let w = &self.weights;
        let has_bias = c.bias as u32;
        // Which GEMMs project the inputs: one per distinct input tensor, each writing its
        // segments of [Q | K | V]. W_k and W_v rows follow W_q's in `w_qkv`, so a fused
        // projection is one GEMM over consecutive weight rows.
        let query_rows = ProjectionPlan {
            input: 0,
            rows: b * lq,
            seq_len: lq,
            width: c.model_dim,
            w_offset: 0,
            bias_offset: 0,
            segments: vec![seg(h, dk, q_dst)],
        };
        let key_rows = |input: usize, segments: Vec<Segment>| ProjectionPlan {
            input,
            rows: b * lk,
            seq_len: lk,
            width: c.key_dim,
            w_offset: w.w_k_offset,
            bias_offset: w.b_k_offset,
            segments,
        };
        let plans = match key.sharing {
            Sharing::SelfAttention => vec![ProjectionPlan {
                segments: vec![seg(h, dk, q_dst), seg(h, dk, k_dst), seg(h, dv, v_dst)],
                ..query_rows
            }],
            Sharing::SharedKeyValue => vec![
                query_rows,
                key_rows(1, vec![seg(h, dk, k_dst), seg(h, dv, v_dst)]),
            ],
            Sharing::Distinct => vec![
                query_rows,
                key_rows(1, vec![seg(h, dk, k_dst)]),
                ProjectionPlan {
                    width: c.value_dim,
                    w_offset: w.w_v_offset,
                    bias_offset: w.b_v_offset,
                    ..key_rows(2, vec![seg(h, dv, v_dst)])
                },
            ],
        };
        let bias_buffer = if c.bias { &w.b_qkv } else { &self.empty };
        let projections = plans
            .into_iter()
            .map(
                |ProjectionPlan {
                     input,
                     rows,
                     seq_len,
                     width,
                     w_offset,
                     bias_offset,
                     segments,
                 }| {
                    let mut p =
                        LinearParams::new(rows as u32, width as u32, seq_len as u32, &segments);
                    p.w_offset = w_offset;
                    p.bias_offset = bias_offset;
                    p.has_bias = has_bias;
                    let params = kernels::uniform_buffer(device, "linear params", &p);
                    let bound = kernels::linear::BoundElems::of(
                        &inputs[input],
                        &w.w_qkv,
                        bias_buffer,
                        &qkv,
                    );
                    let (pass, variant) = match &self.linear_f16 {
                        Some((qkv_f16, _)) => (qkv_f16.clone(), LinearVariant::Scalar),
                        None => {
                            let variant = kernels::linear::variant(&self.gpu, &p, &bound);
                            (self.linear_pass(variant), variant)
                        }
                    };
                    let bind = pass.bind(
                        device,
                        &[&params, &inputs[input], &w.w_qkv, bias_buffer, &qkv],
                    );
                    Projection {
                        _params: params,
                        pass,
                        bind,
                        workgroups: kernels::linear::workgroups(&p, variant),
                    }
                },
            )
            .collect();

        let bh = (b * h) as u32;
        let scores_params = ScoresParams {
            lq: lq as u32,
            lk: lk as u32,
            head_dim: dk as u32,
            heads: h as u32,
            q_offset: q_dst,
            k_offset: k_dst,
            scale: c.scale(),
            z_offset: 0,
            kv_stride: lk as u32,
            _pad: [0; 3],
            mask: MaskParams::default(),
        };
        let mask = storage_buffer(device, "mask", 16, none);
        let ranges = if key.fused {
            self.flash_ranges(lk)
        } else {
            vec![(0, 0, 0)]
        };
        let carry = (ranges.len() > 1).then(|| {
            let elems = b * h * lq * kernels::flash_attention::carry_stride(dv);
            storage_buffer(device, "flash carry state", 4 * elems as u64, none)
        });
        let core = ranges
            .into_iter()
            .map(|(tile_begin, tile_end, carry_flags)| {
                let flash = FlashParams {
                    lq: lq as u32,
                    lk: lk as u32,
                    heads: h as u32,
                    scale: c.scale(),
                    q_offset: q_dst,
                    k_offset: k_dst,
                    v_offset: v_dst,
                    z_offset: 0,
                    kv_stride: lk as u32,
                    tile_begin,
                    tile_end,
                    carry_flags,
                    mask: MaskParams::default(),
                };
                let (params, workgroups) = if key.fused {
                    (
                        kernels::uniform_buffer(device, "flash params", &flash),
                        kernels::flash_attention::workgroups(
                            &flash,
                            bh,
                            kernels::flash_attention::rows_per_thread(&self.gpu),
                        ),
                    )
                } else {
                    (
                        kernels::uniform_buffer(device, "scores params", &scores_params),
                        kernels::scores::workgroups(&scores_params, bh),
                    )
                };
                let bind = self.core_bind_group(
                    key.fused,
                    &params,
                    &qkv,
                    scores.as_ref(),
                    &combined,
                    carry.as_ref(),
                    &mask,
                );
                CoreDispatch {
                    params,
                    bind,
                    workgroups,
                    flash,
                }
            })
            .collect();

        let (softmax, av) = match &scores {
            Some(scores) => {
                let sp = SoftmaxParams::new(
                    (b * h * lq) as u32,
                    lk as u32,
                    limits.max_compute_workgroups_per_dimension,
                );
                let sp_buf = kernels::uniform_buffer(device, "softmax params", &sp);
                let softmax = (
                    self.softmax.bind(device, &[&sp_buf, scores]),
                    kernels::softmax::workgroups(&sp),
                );
                let ap = AvParams {
                    lq: lq as u32,
                    lk: lk as u32,
                    head_dim: dv as u32,
                    heads: h as u32,
                    v_offset: v_dst,
                    z_offset: 0,
                    kv_stride: lk as u32,
                    _pad: 0,
                };
                let ap_buf = kernels::uniform_buffer(device, "av params", &ap);
                let av = (
                    self.av_combine
                        .bind(device, &[&ap_buf, scores, &qkv, &combined]),
                    kernels::av_combine::workgroups(&ap, bh),
                );
                (Some(softmax), Some(av))
            }
            None => (None, None),
        };

        let out_proj = match (&w.w_o, &output) {
            (Some((w_o, b_o)), Some(output)) => {
                let mut p = LinearParams::new(
                    (b * lq) as u32,
                    c.v_width() as u32,
                    lq as u32,
                    &[seg(1, c.model_dim, 0)],
                );
                p.has_bias = has_bias;
                let params = kernels::uniform_buffer(device, "W_o params", &p);
                let bias = if c.bias { b_o } else { &self.empty };
                let bound = kernels::linear::BoundElems::of(&combined, w_o, bias, output);
                let (pass, variant) = match &self.linear_f16 {
                    Some((_, out_f16)) => (out_f16.clone(), LinearVariant::Scalar),
                    None => {
                        let variant = kernels::linear::variant(&self.gpu, &p, &bound);
                        (self.linear_pass(variant), variant)
                    }
                };
                let bind = pass.bind(device, &[&params, &combined, w_o, bias, output]);
                Some(Projection {
                    _params: params,
                    pass,
                    bind,
                    workgroups: kernels::linear::workgroups(&p, variant),
                })
            }
            _ => None,
        };

        let bytes = inputs.iter().map(|x| x.size()).sum::<u64>()
            + qkv.size()
            + scores.as_ref().map_or(0, |s| s.size())
            + combined.size()
            + output.as_ref().map_or(0, |o| o.size())
            + carry.as_ref().map_or(0, |c| c.size())
            + staging.size();
        Ok(Workspace {
            key,
            inputs,
            qkv,
            scores,
            combined,
            output,
            staging,
            mask,
            mask_capacity_words: 4,
            projections,
            core,
            carry,
            softmax,
            av,
            out_proj,
            scores_params,
            bytes,
        })
    }
}
