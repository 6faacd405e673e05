//! `MultiHeadAttention`: the forward of both seed modules as a chain of WGSL passes.
//!
//! Read `encode_forward` top to bottom: it is the seeds' `forward`, one dispatch per line.

use std::sync::Mutex;

use crate::config::AttentionConfig;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::kernels::{
    self, av_combine::AvParams, flash_attention::FlashParams, linear::LinearParams,
    linear::LinearVariant, linear::Segment, scores::ScoresParams, softmax::SoftmaxParams,
    MaskParams, Pass,
};
use crate::mask::{AttnDims, Mask, ResolvedMask};
use crate::profile::PassTimer;
use crate::tensor::Tensor;
use crate::weights::AttentionWeights;

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
struct GpuWeights {
    w_qkv: wgpu::Buffer,
    b_qkv: wgpu::Buffer,
    w_o: Option<(wgpu::Buffer, wgpu::Buffer)>,
    /// Element offsets of W_k, W_v in `w_qkv` and of b_k, b_v in `b_qkv`.
    w_k_offset: u32,
    w_v_offset: u32,
    b_k_offset: u32,
    b_v_offset: u32,
}

/// One projection dispatch of a workspace.
struct Projection {
    _params: wgpu::Buffer,
    variant: LinearVariant,
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
    attn_params: wgpu::Buffer,
    attn_bind: wgpu::BindGroup,
    attn_workgroups: [u32; 3],
    softmax: Option<(wgpu::BindGroup, [u32; 3])>,
    av: Option<(wgpu::BindGroup, [u32; 3])>,
    out_proj: Option<Projection>,
    /// Base parameters of the attention pass; the mask part is filled per call.
    scores_params: ScoresParams,
    flash_params: FlashParams,
    bytes: u64,
}

/// Most workspaces kept per module (one per shape, and one per concurrent caller).
const MAX_CACHED_WORKSPACES: usize = 8;

/// A multi-head attention module on the GPU: pipelines built once, weights uploaded once.
pub struct MultiHeadAttention {
    gpu: Gpu,
    config: AttentionConfig,
    linear: Pass,
    linear_vec4: Pass,
    scores: Pass,
    softmax: Pass,
    av_combine: Pass,
    flash: Option<Pass>,
    weights: GpuWeights,
    /// A 16-byte zero buffer bound where a pass has no bias.
    empty: wgpu::Buffer,
    workspaces: Mutex<Vec<Workspace>>,
}

fn storage_buffer(
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
    let rank3 = |name: &str, t: &Tensor, width: usize, what: &str| -> Result<()> {
        let s = t.shape();
        if s.len() != 3 || s[2] != width {
            return Err(Error::shape(name, format!("[batch, {what}, {width}]"), s));
        }
        Ok(())
    };
    rank3("query", query, c.model_dim, "Lq")?;
    rank3("key", key, c.key_dim, "Lk")?;
    rank3("value", value, c.value_dim, "Lk")?;
    let (qs, ks, vs) = (query.shape(), key.shape(), value.shape());
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
    /// Builds the pipelines and uploads the weights (checked against the config first).
    pub fn new(gpu: &Gpu, config: AttentionConfig, weights: &AttentionWeights) -> Result<Self> {
        let config = config.validated()?;
        weights.check(&config)?;
        let limit = gpu.limits().max_storage_buffer_binding_size;
        let weight_bytes =
            4 * (weights.q.weight.len() + weights.k.weight.len() + weights.v.weight.len()) as u64;
        if weight_bytes > limit {
            return Err(Error::TooLarge {
                what: "the Q/K/V projection weights".into(),
                needed: weight_bytes,
                limit,
            });
        }
        let device = gpu.device();
        gpu.scoped("building the attention module", || {
            let mut w_qkv = weights.q.weight.clone();
            w_qkv.extend_from_slice(&weights.k.weight);
            w_qkv.extend_from_slice(&weights.v.weight);
            let bias_of = |l: &crate::weights::Linear| l.bias.clone().unwrap_or_default();
            let mut b_qkv = bias_of(&weights.q);
            b_qkv.extend(bias_of(&weights.k));
            b_qkv.extend(bias_of(&weights.v));
            let gpu_weights = GpuWeights {
                w_qkv: upload(device, "W_qkv", &w_qkv),
                b_qkv: upload(device, "b_qkv", &b_qkv),
                w_o: weights.o.as_ref().map(|o| {
                    (
                        upload(device, "W_o", &o.weight),
                        upload(device, "b_o", &bias_of(o)),
                    )
                }),
                w_k_offset: weights.q.weight.len() as u32,
                w_v_offset: (weights.q.weight.len() + weights.k.weight.len()) as u32,
                b_k_offset: config.qk_width() as u32,
                b_v_offset: 2 * config.qk_width() as u32,
            };
            let flash = kernels::flash_attention::kv_tile(config.qk_head_dim, config.v_head_dim)
                .map(|tile| {
                    kernels::flash_attention::pass(
                        device,
                        config.qk_head_dim,
                        config.v_head_dim,
                        tile,
                    )
                });
            MultiHeadAttention {
                gpu: gpu.clone(),
                config,
                linear: kernels::linear::pass(device, LinearVariant::Scalar),
                linear_vec4: kernels::linear::pass(device, LinearVariant::Vec4),
                scores: kernels::scores::pass(device),
                softmax: kernels::softmax::pass(device),
                av_combine: kernels::av_combine::pass(device),
                flash,
                weights: gpu_weights,
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
        let mut timer = PassTimer::new(&self.gpu, 8);
        self.run(query, key, value, mask, options, timer.as_mut())
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
        mut timer: Option<&mut PassTimer>,
    ) -> Result<ForwardOutput> {
        // Everything about the input is checked before anything touches the GPU.
        check_inputs(&self.config, query, key, value)?;
        let (batch, lq, lk) = (query.shape()[0], query.shape()[1], key.shape()[1]);
        let dims = AttnDims {
            batch,
            heads: self.config.heads,
            lq,
            lk,
        };
        let resolved = mask.resolve(dims)?;
        let fused = self.choose_path(dims, options)?;
        let path = if fused {
            AttentionPath::Fused
        } else {
            AttentionPath::MultiPass
        };
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
        let shape = ShapeKey {
            batch,
            lq,
            lk,
            sharing,
            fused,
            probs: options.return_probs,
        };
        let mut ws = self.take_workspace(shape)?;
        let result = self.gpu.scoped("forward", || -> Result<_> {
            self.write_inputs(&mut ws, query, key, value, &resolved);
            let mut encoder =
                self.gpu
                    .device()
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("forward"),
                    });
            self.encode_forward(&ws, &mut encoder, timer.as_deref_mut());
            if let Some(t) = timer.as_deref() {
                t.resolve(&mut encoder);
            }
            self.gpu.queue().submit([encoder.finish()]);
            let out_len = batch * lq * self.config.output_dim();
            let probs_len = if options.return_probs {
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
                probs: if options.return_probs {
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

    fn linear_pass(&self, variant: LinearVariant) -> &Pass {
        match variant {
            LinearVariant::Scalar => &self.linear,
            LinearVariant::Vec4 => &self.linear_vec4,
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
            self.linear_pass(p.variant).dispatch(
                encoder,
                &p.bind,
                p.workgroups,
                timer.as_deref_mut(),
            );
        }
        if ws.key.fused {
            // combined = combine_heads(softmax(mask(Q·Kᵀ·scale))·V), without the scores buffer
            if let Some(flash) = &self.flash {
                flash.dispatch(
                    encoder,
                    &ws.attn_bind,
                    ws.attn_workgroups,
                    timer.as_deref_mut(),
                );
            }
        } else {
            // scores = mask(Q·Kᵀ·scale)
            self.scores.dispatch(
                encoder,
                &ws.attn_bind,
                ws.attn_workgroups,
                timer.as_deref_mut(),
            );
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
            self.linear_pass(p.variant).dispatch(
                encoder,
                &p.bind,
                p.workgroups,
                timer.as_deref_mut(),
            );
        }
        let result = ws.output.as_ref().unwrap_or(&ws.combined);
        let out_bytes = (ws.key.batch * ws.key.lq * self.config.output_dim() * 4) as u64;
        encoder.copy_buffer_to_buffer(result, 0, &ws.staging, 0, out_bytes);
        if let (true, Some(scores)) = (ws.key.probs, &ws.scores) {
            let probs_bytes = (ws.key.batch * self.config.heads * ws.key.lq * ws.key.lk * 4) as u64;
            encoder.copy_buffer_to_buffer(scores, 0, &ws.staging, out_bytes, probs_bytes);
        }
    }

    /// Picks fused or multi-pass, and refuses problems that fit neither.
    fn choose_path(&self, d: AttnDims, options: &ForwardOptions) -> Result<bool> {
        let limit = self.gpu.limits().max_storage_buffer_binding_size;
        let scores_bytes = 4 * (d.batch * d.heads * d.lq * d.lk) as u64;
        let fused_ok = self.flash.is_some();
        match options.path {
            AttentionPath::Fused if options.return_probs => Err(Error::Config(
                "the fused path cannot return attention probabilities; use Auto or MultiPass".into(),
            )),
            AttentionPath::Fused if !fused_ok => Err(Error::Unsupported {
                adapter: self.gpu.describe(),
                what: format!(
                    "fused attention with head sizes q/k {} + v {} (a K/V row must fit 16 KiB of workgroup memory)",
                    self.config.qk_head_dim, self.config.v_head_dim
                ),
            }),
            AttentionPath::Fused => Ok(true),
            AttentionPath::MultiPass | AttentionPath::Auto if scores_bytes > limit => {
                if options.path == AttentionPath::Auto && fused_ok && !options.return_probs {
                    Ok(true)
                } else {
                    Err(Error::TooLarge {
                        what: format!(
                            "the attention scores [B, H, Lq, Lk] = [{}, {}, {}, {}]",
                            d.batch, d.heads, d.lq, d.lk
                        ),
                        needed: scores_bytes,
                        limit,
                    })
                }
            }
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
        if let Some(b_o) = self.host_output_bias() {
            for row in output.data_mut().chunks_mut(out_dim) {
                row.copy_from_slice(&b_o);
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

    fn host_output_bias(&self) -> Option<Vec<f32>> {
        let (_, b_o) = self.weights.w_o.as_ref()?;
        if !self.config.bias {
            return None;
        }
        let n = self.config.model_dim;
        let staging = self.gpu.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("b_o readback"),
            size: (n * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .gpu
            .device()
            .create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(b_o, 0, &staging, 0, (n * 4) as u64);
        self.gpu.queue().submit([encoder.finish()]);
        self.gpu.read_f32(&staging, n).ok()
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
        if mask.words.len() > ws.mask_capacity_words {
            // Grow the mask buffer and rebind the pass that reads it.
            let device = self.gpu.device();
            ws.mask = storage_buffer(
                device,
                "mask",
                (mask.words.len() * 4) as u64,
                wgpu::BufferUsages::empty(),
            );
            ws.mask_capacity_words = mask.words.len();
            ws.attn_bind = self.attention_bind_group(
                ws.key.fused,
                &ws.attn_params,
                &ws.qkv,
                ws.scores.as_ref(),
                &ws.combined,
                &ws.mask,
            );
        }
        if !mask.words.is_empty() {
            queue.write_buffer(&ws.mask, 0, bytemuck::cast_slice(&mask.words));
        }
        let mask_params = MaskParams::from_resolved(mask);
        if ws.key.fused {
            let p = FlashParams {
                mask: mask_params,
                ..ws.flash_params
            };
            queue.write_buffer(&ws.attn_params, 0, bytemuck::bytes_of(&p));
        } else {
            let p = ScoresParams {
                mask: mask_params,
                ..ws.scores_params
            };
            queue.write_buffer(&ws.attn_params, 0, bytemuck::bytes_of(&p));
        }
    }

    /// The bind group of the attention core (scores or flash), which reads the mask buffer.
    fn attention_bind_group(
        &self,
        fused: bool,
        params: &wgpu::Buffer,
        qkv: &wgpu::Buffer,
        scores: Option<&wgpu::Buffer>,
        combined: &wgpu::Buffer,
        mask: &wgpu::Buffer,
    ) -> wgpu::BindGroup {
        let device = self.gpu.device();
        match (fused, &self.flash, scores) {
            (true, Some(flash), _) => flash.bind(device, &[params, qkv, combined, mask]),
            (_, _, Some(scores)) => self.scores.bind(device, &[params, qkv, scores, mask]),
            // Unreachable by construction (fused needs flash, multi-pass allocates scores);
            // bind the output so the group is still valid.
            _ => self.scores.bind(device, &[params, qkv, combined, mask]),
        }
    }

    /// Allocates every buffer and bind group of one shape; checks device limits first.
    fn new_workspace(&self, key: ShapeKey) -> Result<Workspace> {
        let c = &self.config;
        let device = self.gpu.device();
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
        ];
        for (what, elems) in sizes {
            let needed = 4 * elems as u64;
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
        if (b * h) as u64 > max_groups as u64 || (b * lq).div_ceil(64) as u64 > max_groups as u64 {
            return Err(Error::TooLarge {
                what: format!(
                    "dispatch over {} (batch, head) pairs and {} rows",
                    b * h,
                    b * lq
                ),
                needed: ((b * h).max((b * lq).div_ceil(64))) as u64,
                limit: max_groups as u64,
            });
        }

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
            4 * (q_elems + k_elems + v_elems) as u64,
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
        // (input index, rows, seq_len, in width, W offset, bias offset, segments)
        let plans: Vec<(usize, usize, usize, usize, u32, u32, Vec<Segment>)> = match key.sharing {
            Sharing::SelfAttention => vec![(
                0,
                b * lq,
                lq,
                c.model_dim,
                0,
                0,
                vec![seg(h, dk, q_dst), seg(h, dk, k_dst), seg(h, dv, v_dst)],
            )],
            Sharing::SharedKeyValue => vec![
                (0, b * lq, lq, c.model_dim, 0, 0, vec![seg(h, dk, q_dst)]),
                (
                    1,
                    b * lk,
                    lk,
                    c.key_dim,
                    w.w_k_offset,
                    w.b_k_offset,
                    vec![seg(h, dk, k_dst), seg(h, dv, v_dst)],
                ),
            ],
            Sharing::Distinct => vec![
                (0, b * lq, lq, c.model_dim, 0, 0, vec![seg(h, dk, q_dst)]),
                (
                    1,
                    b * lk,
                    lk,
                    c.key_dim,
                    w.w_k_offset,
                    w.b_k_offset,
                    vec![seg(h, dk, k_dst)],
                ),
                (
                    2,
                    b * lk,
                    lk,
                    c.value_dim,
                    w.w_v_offset,
                    w.b_v_offset,
                    vec![seg(h, dv, v_dst)],
                ),
            ],
        };
        let bias_buffer = if c.bias { &w.b_qkv } else { &self.empty };
        let projections = plans
            .into_iter()
            .map(
                |(input, rows, seq_len, width, w_offset, bias_offset, segments)| {
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
                    let variant = kernels::linear::variant(&p, &bound);
                    let bind = self.linear_pass(variant).bind(
                        device,
                        &[&params, &inputs[input], &w.w_qkv, bias_buffer, &qkv],
                    );
                    Projection {
                        _params: params,
                        variant,
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
        let flash_params = FlashParams {
            lq: lq as u32,
            lk: lk as u32,
            heads: h as u32,
            scale: c.scale(),
            q_offset: q_dst,
            k_offset: k_dst,
            v_offset: v_dst,
            z_offset: 0,
            kv_stride: lk as u32,
            _pad: [0; 3],
            mask: MaskParams::default(),
        };
        let (attn_params, attn_workgroups) = if key.fused {
            (
                kernels::uniform_buffer(device, "flash params", &flash_params),
                kernels::flash_attention::workgroups(&flash_params, bh),
            )
        } else {
            (
                kernels::uniform_buffer(device, "scores params", &scores_params),
                kernels::scores::workgroups(&scores_params, bh),
            )
        };
        let mask = storage_buffer(device, "mask", 16, none);

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
                let variant = kernels::linear::variant(&p, &bound);
                let bind = self
                    .linear_pass(variant)
                    .bind(device, &[&params, &combined, w_o, bias, output]);
                Some(Projection {
                    _params: params,
                    variant,
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
            + staging.size();
        let attn_bind = self.attention_bind_group(
            key.fused,
            &attn_params,
            &qkv,
            scores.as_ref(),
            &combined,
            &mask,
        );
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
            attn_bind,
            attn_params,
            attn_workgroups,
            softmax,
            av,
            out_proj,
            scores_params,
            flash_params,
            bytes,
        })
    }
}
