//! `KvCache`: projected keys and values kept on the GPU for incremental (causal) decoding.
//!
//! A cache holds, per (batch, head), up to `capacity` projected key rows and value rows in the
//! head-split layout `[B, H, capacity, d]`. Each [`MultiHeadAttention::forward_step`] projects the
//! `n` new tokens once: their queries into a scratch area, their keys and values straight into the
//! cache at positions `len .. len + n` (the projection GEMM's `dst_pos`/`dst_seq_len`). Attention
//! then reads the first `len + n` rows of the cache (`kv_stride = capacity`) with the causal mask
//! aligned bottom-right: new token `i` sees cached keys `j ≤ len + i`. Decoding a sequence token by
//! token therefore gives the same outputs as one causal forward over the whole sequence.
//!
//! One step is one command encoder, one submit and one readback of the `[B, n, out]` output.
//! Growing past `capacity` is an [`Error::KvCacheFull`] and leaves the cache unchanged.

use crate::attention::{storage_buffer, AttentionPath, MultiHeadAttention};
use crate::error::{Error, Result};
use crate::kernels::{
    self, av_combine::AvParams, flash_attention::FlashParams, linear::LinearParams,
    linear::Segment, scores::ScoresParams, softmax::SoftmaxParams, MaskParams,
};
use crate::model::mask::{AttnDims, Mask};
use crate::model::tensor::Tensor;

/// Projected keys and values of the tokens seen so far, on the GPU, for one module.
///
/// Made by [`KvCache::new`] for one [`MultiHeadAttention`] and used only with that module (its
/// buffers are bound to the module's weights; using it with another module is an error).
pub struct KvCache {
    batch: usize,
    capacity: usize,
    len: usize,
    fused: bool,
    /// The owning module's packed weight buffer, to recognise it.
    owner: wgpu::Buffer,
    /// `[K: B·H·C·dk | V: B·H·C·dv | Q scratch: B·H·C·dk]`.
    _kv: wgpu::Buffer,
    k_offset: u32,
    v_offset: u32,
    q_offset: u32,
    /// New tokens' query input `[B, n, model_dim]` and, for cross steps, key/value input.
    x_q: wgpu::Buffer,
    x_kv: wgpu::Buffer,
    combined: wgpu::Buffer,
    output: Option<wgpu::Buffer>,
    staging: wgpu::Buffer,
    _scores: Option<wgpu::Buffer>,
    q_params: wgpu::Buffer,
    q_bind: wgpu::BindGroup,
    kv_params: wgpu::Buffer,
    /// The K/V projection reading `x_q` (self-attention steps) or `x_kv` (cross steps).
    kv_bind_self: wgpu::BindGroup,
    kv_bind_cross: wgpu::BindGroup,
    attn_params: wgpu::Buffer,
    attn_bind: wgpu::BindGroup,
    softmax: Option<(wgpu::Buffer, wgpu::BindGroup)>,
    av: Option<(wgpu::Buffer, wgpu::BindGroup)>,
    out_proj: Option<(wgpu::Buffer, wgpu::BindGroup)>,
    _mask: wgpu::Buffer,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("batch", &self.batch)
            .field("capacity", &self.capacity)
            .field("len", &self.len)
            .field("fused", &self.fused)
            .finish()
    }
}

impl KvCache {
    /// An empty cache for `batch` sequences of up to `capacity` tokens each, on the fused
    /// attention path when the module has one.
    ///
    /// The module must be f32: a cache over a [`Precision::F16`](crate::Precision::F16) module
    /// is `Err(Unsupported)`.
    pub fn new(mha: &MultiHeadAttention, batch: usize, capacity: usize) -> Result<Self> {
        Self::with_path(mha, batch, capacity, AttentionPath::Auto)
    }

    /// [`new`](Self::new) with an explicit attention path. `MultiPass` allocates a scores buffer
    /// of `B·H·capacity²` floats; `Fused` needs no such buffer.
    pub fn with_path(
        mha: &MultiHeadAttention,
        batch: usize,
        capacity: usize,
        path: AttentionPath,
    ) -> Result<Self> {
        let c = mha.config;
        if mha.precision() == crate::attention::Precision::F16 {
            return Err(Error::Unsupported {
                adapter: mha.gpu().describe(),
                what: "a KV cache over an f16 module; build the module with Precision::F32".into(),
            });
        }
        if batch == 0 || capacity == 0 {
            return Err(Error::Config(format!(
                "a KV cache needs batch ≥ 1 and capacity ≥ 1 (got batch {batch}, capacity {capacity})"
            )));
        }
        if c.key_dim != c.value_dim {
            return Err(Error::Config(format!(
                "a KV cache projects keys and values from one input, but key_dim {} ≠ value_dim {}",
                c.key_dim, c.value_dim
            )));
        }
        // The cache runs the fused kernel as one dispatch over its capacity; where the module
        // would split that many keys (see `tiles_per_dispatch`), it uses the multi-pass core.
        let one_dispatch = mha.flash_ranges(capacity).len() == 1;
        let fused = match path {
            AttentionPath::Auto => mha.flash.is_some() && one_dispatch,
            AttentionPath::Fused if !one_dispatch => {
                return Err(Error::Unsupported {
                    adapter: mha.gpu.describe(),
                    what: format!(
                        "a fused KV cache of {capacity} keys in one dispatch (at most {} here); use Auto or MultiPass",
                        mha.flash_tile * mha.flash_tiles_per_dispatch
                    ),
                })
            }
            AttentionPath::Fused if mha.flash.is_none() => {
                return Err(Error::Unsupported {
                    adapter: mha.gpu.describe(),
                    what: format!(
                        "fused attention with head sizes q/k {} + v {}",
                        c.qk_head_dim, c.v_head_dim
                    ),
                })
            }
            AttentionPath::Fused => true,
            AttentionPath::MultiPass => false,
        };
        let (b, h, cap, dk, dv) = (batch, c.heads, capacity, c.qk_head_dim, c.v_head_dim);
        let k_elems = b * h * cap * dk;
        let v_elems = b * h * cap * dv;
        let limits = mha.gpu.limits();
        let limit = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let sizes = [
            ("the KV cache with its query scratch", 2 * k_elems + v_elems),
            ("the cache's query input", b * cap * c.model_dim),
            ("the cache's combined heads", b * cap * c.v_width()),
            ("the cache's output", b * cap * c.output_dim()),
            (
                "the cache's attention scores",
                if fused { 0 } else { b * h * cap * cap },
            ),
        ];
        for (what, elems) in sizes {
            let needed = 4 * elems as u64;
            if needed > limit {
                return Err(Error::TooLarge {
                    what: what.into(),
                    needed,
                    limit,
                });
            }
        }
        let max_groups = limits.max_compute_workgroups_per_dimension as usize;
        if b * h > max_groups || (b * cap).div_ceil(64) > max_groups {
            return Err(Error::TooLarge {
                what: format!(
                    "dispatch over {} (batch, head) pairs and {} rows",
                    b * h,
                    b * cap
                ),
                needed: (b * h).max((b * cap).div_ceil(64)) as u64,
                limit: max_groups as u64,
            });
        }
        mha.gpu
            .scoped("allocating a KV cache", || Self::build(mha, b, cap, fused))?
    }

    fn build(mha: &MultiHeadAttention, b: usize, cap: usize, fused: bool) -> Result<Self> {
        let c = mha.config;
        let device = mha.gpu.device();
        let (h, dk, dv) = (c.heads, c.qk_head_dim, c.v_head_dim);
        let none = wgpu::BufferUsages::empty();
        let (k_offset, v_offset) = (0u32, (b * h * cap * dk) as u32);
        let q_offset = v_offset + (b * h * cap * dv) as u32;
        let kv = storage_buffer(
            device,
            "KV cache",
            4 * (q_offset as u64 + (b * h * cap * dk) as u64),
            none,
        );
        let x_q = storage_buffer(
            device,
            "step query input",
            4 * (b * cap * c.model_dim) as u64,
            none,
        );
        let x_kv = storage_buffer(
            device,
            "step key/value input",
            4 * (b * cap * c.key_dim) as u64,
            none,
        );
        let combined = storage_buffer(
            device,
            "step combined heads",
            4 * (b * cap * c.v_width()) as u64,
            wgpu::BufferUsages::COPY_SRC,
        );
        let output = c.output_projection.then(|| {
            storage_buffer(
                device,
                "step output",
                4 * (b * cap * c.output_dim()) as u64,
                wgpu::BufferUsages::COPY_SRC,
            )
        });
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step readback"),
            size: (4 * (b * cap * c.output_dim()) as u64).max(16),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let scores = (!fused)
            .then(|| storage_buffer(device, "step scores", 4 * (b * h * cap * cap) as u64, none));
        let mask = storage_buffer(device, "mask", 16, none);

        // Parameter buffers are rewritten every step; the bind groups never change.
        let w = &mha.weights;
        let bias = if c.bias { &w.b_qkv } else { &mha.empty };
        let q_params = kernels::uniform_buffer(device, "step Q params", &LinearParams::default());
        let q_bind = mha
            .linear
            .bind(device, &[&q_params, &x_q, &w.w_qkv, bias, &kv]);
        let kv_params =
            kernels::uniform_buffer(device, "step K/V params", &LinearParams::default());
        let kv_bind_self = mha
            .linear
            .bind(device, &[&kv_params, &x_q, &w.w_qkv, bias, &kv]);
        let kv_bind_cross = mha
            .linear
            .bind(device, &[&kv_params, &x_kv, &w.w_qkv, bias, &kv]);
        let (attn_params, attn_bind, softmax, av) = match (&mha.flash, &scores) {
            (Some(flash), None) => {
                let p =
                    kernels::uniform_buffer(device, "step flash params", &FlashParams::default());
                let bind = flash.bind(device, &[&p, &kv, &combined, &mha.empty, &mask]);
                (p, bind, None, None)
            }
            (_, Some(scores)) => {
                let p =
                    kernels::uniform_buffer(device, "step scores params", &ScoresParams::default());
                let bind = mha.scores.bind(device, &[&p, &kv, scores, &mask]);
                let sp = kernels::uniform_buffer(
                    device,
                    "step softmax params",
                    &SoftmaxParams::default(),
                );
                let softmax_bind = mha.softmax.bind(device, &[&sp, scores]);
                let ap = kernels::uniform_buffer(device, "step av params", &AvParams::default());
                let av_bind = mha.av_combine.bind(device, &[&ap, scores, &kv, &combined]);
                (p, bind, Some((sp, softmax_bind)), Some((ap, av_bind)))
            }
            // `with_path` only picks fused when the module has the flash pass.
            (None, None) => {
                return Err(Error::Config("fused KV cache without a flash pass".into()))
            }
        };
        let out_proj = match (&w.w_o, &output) {
            (Some((w_o, b_o)), Some(output)) => {
                let p =
                    kernels::uniform_buffer(device, "step W_o params", &LinearParams::default());
                let bias = if c.bias { b_o } else { &mha.empty };
                let bind = mha.linear.bind(device, &[&p, &combined, w_o, bias, output]);
                Some((p, bind))
            }
            _ => None,
        };
        Ok(KvCache {
            batch: b,
            capacity: cap,
            len: 0,
            fused,
            owner: w.w_qkv.clone(),
            _kv: kv,
            k_offset,
            v_offset,
            q_offset,
            x_q,
            x_kv,
            combined,
            output,
            staging,
            _scores: scores,
            q_params,
            q_bind,
            kv_params,
            kv_bind_self,
            kv_bind_cross,
            attn_params,
            attn_bind,
            softmax,
            av,
            out_proj,
            _mask: mask,
        })
    }

    /// Tokens cached so far (per sequence).
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Most tokens the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Tokens that still fit.
    pub fn remaining(&self) -> usize {
        self.capacity - self.len
    }
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// The attention path its steps run (`Fused` or `MultiPass`).
    pub fn path(&self) -> AttentionPath {
        if self.fused {
            AttentionPath::Fused
        } else {
            AttentionPath::MultiPass
        }
    }
    /// Forgets every cached token (nothing on the GPU needs clearing: rows at or past `len`
    /// are never read).
    pub fn reset(&mut self) {
        self.len = 0;
    }
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
        self.step(cache, x_new, None)
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
        self.step(cache, x_q_new, Some(x_k_v_new))
    }

    fn step(&self, cache: &mut KvCache, x_q: &Tensor, x_kv: Option<&Tensor>) -> Result<Tensor> {
        let c = &self.config;
        if cache.owner != self.weights.w_qkv {
            return Err(Error::Config(
                "this KV cache was made for another attention module".into(),
            ));
        }
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
        match x_kv {
            Some(kv) if kv.shape() != [b, n, c.key_dim] => {
                return Err(Error::shape(
                    "step key/value input",
                    format!("[{b}, {n}, {}] (like the query input)", c.key_dim),
                    kv.shape(),
                ));
            }
            Some(_) => {}
            None if c.model_dim != c.key_dim => {
                return Err(Error::Config(format!(
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
            return Ok(Tensor::zeros([b, 0, c.output_dim()]));
        }
        let (len0, lk) = (cache.len, cache.len + n);
        let out_len = b * n * c.output_dim();
        let values = self.gpu.scoped("forward_step", || -> Result<Vec<f32>> {
            let queue = self.gpu.queue();
            queue.write_buffer(&cache.x_q, 0, bytemuck::cast_slice(x_q.data()));
            if let Some(kv) = x_kv {
                queue.write_buffer(&cache.x_kv, 0, bytemuck::cast_slice(kv.data()));
            }
            let mut encoder =
                self.gpu
                    .device()
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("forward_step"),
                    });
            self.encode_step(cache, &mut encoder, n, len0, lk, x_kv.is_some());
            let result = cache.output.as_ref().unwrap_or(&cache.combined);
            encoder.copy_buffer_to_buffer(result, 0, &cache.staging, 0, 4 * out_len as u64);
            queue.submit([encoder.finish()]);
            self.gpu.read_f32(&cache.staging, out_len)
        })??;
        // Only now do the appended rows count; after any error the cache is as it was.
        cache.len = lk;
        Tensor::new([b, n, c.output_dim()], values)
    }

    /// Writes this step's parameters and records its passes: Q and K/V projections, attention
    /// over `lk = len0 + n` cached rows, and `W_o` when the module has it.
    fn encode_step(
        &self,
        cache: &KvCache,
        encoder: &mut wgpu::CommandEncoder,
        n: usize,
        len0: usize,
        lk: usize,
        cross: bool,
    ) {
        let c = &self.config;
        let queue = self.gpu.queue();
        let (b, h, dk, dv) = (cache.batch, c.heads, c.qk_head_dim, c.v_head_dim);
        let seg = |head_dim: usize, dst: u32| Segment {
            heads: h as u32,
            head_dim: head_dim as u32,
            dst,
        };
        let has_bias = c.bias as u32;
        let rows = (b * n) as u32;

        // Q = split_heads(W_q(x_q)) into the scratch area, [B, H, n, dk].
        let mut qp = LinearParams::new(
            rows,
            c.model_dim as u32,
            n as u32,
            &[seg(dk, cache.q_offset)],
        );
        qp.has_bias = has_bias;
        queue.write_buffer(&cache.q_params, 0, bytemuck::bytes_of(&qp));
        self.linear.dispatch(
            encoder,
            &cache.q_bind,
            kernels::linear::workgroups(&qp, kernels::linear::LinearVariant::Scalar),
            None,
        );

        // K, V = split_heads(W_k(x), W_v(x)) appended at rows len0.. of [B, H, capacity, d].
        let mut kvp = LinearParams::new(
            rows,
            c.key_dim as u32,
            n as u32,
            &[seg(dk, cache.k_offset), seg(dv, cache.v_offset)],
        );
        kvp.w_offset = self.weights.w_k_offset;
        kvp.bias_offset = self.weights.b_k_offset;
        kvp.has_bias = has_bias;
        kvp.dst_seq_len = cache.capacity as u32;
        kvp.dst_pos = len0 as u32;
        queue.write_buffer(&cache.kv_params, 0, bytemuck::bytes_of(&kvp));
        let kv_bind = if cross {
            &cache.kv_bind_cross
        } else {
            &cache.kv_bind_self
        };
        self.linear.dispatch(
            encoder,
            kv_bind,
            kernels::linear::workgroups(&kvp, kernels::linear::LinearVariant::Scalar),
            None,
        );

        // Causal, bottom-right aligned: new token i sees cached keys j ≤ i + (lk − n) = len0 + i.
        let dims = AttnDims {
            batch: b,
            heads: h,
            lq: n,
            lk,
        };
        let mask = Mask::Causal
            .resolve(dims)
            .map(|m| MaskParams::from_resolved(&m))
            .unwrap_or_default();
        let bh = (b * h) as u32;
        let (n32, lk32, cap32) = (n as u32, lk as u32, cache.capacity as u32);
        match (&self.flash, cache.fused) {
            (Some(flash), true) => {
                let fp = FlashParams {
                    lq: n32,
                    lk: lk32,
                    heads: h as u32,
                    scale: c.scale(),
                    q_offset: cache.q_offset,
                    k_offset: cache.k_offset,
                    v_offset: cache.v_offset,
                    z_offset: 0,
                    kv_stride: cap32,
                    // `new` chose the fused path only where one dispatch covers the capacity.
                    tile_begin: 0,
                    tile_end: u32::MAX,
                    carry_flags: 0,
                    mask,
                };
                queue.write_buffer(&cache.attn_params, 0, bytemuck::bytes_of(&fp));
                flash.dispatch(
                    encoder,
                    &cache.attn_bind,
                    kernels::flash_attention::workgroups(
                        &fp,
                        bh,
                        kernels::flash_attention::rows_per_thread(&self.gpu),
                    ),
                    None,
                );
            }
            _ => {
                let sp = ScoresParams {
                    lq: n32,
                    lk: lk32,
                    head_dim: dk as u32,
                    heads: h as u32,
                    q_offset: cache.q_offset,
                    k_offset: cache.k_offset,
                    scale: c.scale(),
                    z_offset: 0,
                    kv_stride: cap32,
                    _pad: [0; 3],
                    mask,
                };
                queue.write_buffer(&cache.attn_params, 0, bytemuck::bytes_of(&sp));
                self.scores.dispatch(
                    encoder,
                    &cache.attn_bind,
                    kernels::scores::workgroups(&sp, bh),
                    None,
                );
                if let Some((params, bind)) = &cache.softmax {
                    let max_groups = self.gpu.limits().max_compute_workgroups_per_dimension;
                    let smp = SoftmaxParams::new(bh * n32, lk32, max_groups);
                    queue.write_buffer(params, 0, bytemuck::bytes_of(&smp));
                    self.softmax
                        .dispatch(encoder, bind, kernels::softmax::workgroups(&smp), None);
                }
                if let Some((params, bind)) = &cache.av {
                    let ap = AvParams {
                        lq: n32,
                        lk: lk32,
                        head_dim: dv as u32,
                        heads: h as u32,
                        v_offset: cache.v_offset,
                        z_offset: 0,
                        kv_stride: cap32,
                        _pad: 0,
                    };
                    queue.write_buffer(params, 0, bytemuck::bytes_of(&ap));
                    self.av_combine.dispatch(
                        encoder,
                        bind,
                        kernels::av_combine::workgroups(&ap, bh),
                        None,
                    );
                }
            }
        }

        // output = W_o(combined) for the classic module.
        if let Some((params, bind)) = &cache.out_proj {
            let mut op = LinearParams::new(
                rows,
                c.v_width() as u32,
                n as u32,
                &[Segment {
                    heads: 1,
                    head_dim: c.model_dim as u32,
                    dst: 0,
                }],
            );
            op.has_bias = has_bias;
            queue.write_buffer(params, 0, bytemuck::bytes_of(&op));
            self.linear.dispatch(
                encoder,
                bind,
                kernels::linear::workgroups(&op, kernels::linear::LinearVariant::Scalar),
                None,
            );
        }
    }
}
