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
//! A step is the forward's own chain of passes (`workspace::dispatches`) over the cache's
//! buffers, built for its `(len, n)` and recorded into one command encoder (`kv_cache/step.rs`): on the
//! host, one submit and one readback of the `[B, n, out]` output; on device tensors, a new
//! `GpuTensor`, submitted or recorded into the caller's encoder
//! ([`MultiHeadAttention::forward_step_gpu_into`]).
//! Growing past `capacity` is an [`Error::KvCacheFull`] and leaves the cache unchanged.

mod read;
mod sequence;
mod step;

pub use step::StepOptions;

use crate::attention::kv_chunks::{chunk_unit, largest_chunk, Chunks};
pub use crate::attention::kv_step_buffers::KvCacheBytes;
use crate::attention::kv_step_buffers::{carry_len, StepBuffers, FIRST_STEP_TOKENS};
use crate::attention::{AttentionPath, MultiHeadAttention, Precision};
use crate::error::{Error, Result};
use crate::kernels::mask::MaskBuffers;
use crate::kernels::{KvFormat, QkvLayout};
use crate::kv_dtype::KvDtype;
use crate::sdpa::{DeviceTensor, Elem, Layout};

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
    /// `[K: B·H_kv·C·dk | V: B·H_kv·C·dv]`; none in a chunked cache (its chunks hold them).
    kv: Option<wgpu::Buffer>,
    /// Most tokens one step may bring (what one storage binding allows).
    max_step: usize,
    /// The buffers a step writes, sized for the largest step so far (see [`StepBuffers`]).
    step: StepBuffers,
    /// A chunked cache's keys and values, `chunk_keys` tokens per chunk (empty otherwise).
    k_chunks: Vec<wgpu::Buffer>,
    v_chunks: Vec<wgpu::Buffer>,
    chunk_keys: usize,
    /// `[B, H, C, C]` for the multi-pass core.
    scores: Option<wgpu::Buffer>,
    mask: MaskBuffers,
    /// The values are the keys (MLA's latent cache): `v_chunks` are `k_chunks`, `kv` holds no
    /// values.
    values_from_keys: bool,
    /// Bytes one token of one sequence takes in the keys and values.
    per_token: u64,
    /// Key/value heads, key and value head sizes, element type: the shape of
    /// [`keys`](Self::keys) and [`values`](Self::values).
    kv_dims: [usize; 3],
    elem: Elem,
    /// The element type of the keys and values, and a quantized chunk's scales planes.
    format: KvFormat,
    /// Steps as recorded and as run: the sequence rule (see `kv_cache/sequence.rs`).
    ledger: sequence::Ledger,
}

/// A run of a cache's tokens as a read-only [`DeviceTensor`] ([`KvCache::keys`],
/// [`KvCache::values`]): tokens `tokens` of every sequence, `[B, H_kv, tokens.len(), d]` in
/// [`Layout::Bhld`] with the chunk's (or cache's) capacity as its rows per (batch, head).
#[derive(Debug, Clone)]
pub struct KvView<'a> {
    /// The token positions (the same in every sequence) this view holds.
    pub tokens: std::ops::Range<usize>,
    /// Those tokens, `[B, H_kv, tokens.len(), d]`, in the cache's element type.
    pub tensor: DeviceTensor<'a>,
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
    /// Over a [`Precision::F16`] module the cached keys and values are
    /// f16 (scores, softmax and accumulators stay f32), and only the fused path runs.
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
        Self::build(mha, batch, capacity, path, Chunks::Auto, None)
    }

    /// [`new`](Self::new) with its keys and values stored as `dtype`: the module's own element
    /// type (f32, or f16 over a [`Precision::F16`] module), or llama.cpp's q8_0 / q4_0 blocks of
    /// 32 values along the head (see [`crate::kv_dtype`]) over a module of either precision —
    /// about a quarter (q8_0) or a seventh (q4_0) of an f32 cache's bytes. New keys (after RoPE)
    /// and values are quantized as they are appended; every step reads them dequantized,
    /// accumulating in f32. A quantized cache runs the fused path only and needs head sizes
    /// that are whole blocks: `Err` naming what does not fit.
    pub fn new_with(
        mha: &MultiHeadAttention,
        batch: usize,
        capacity: usize,
        dtype: KvDtype,
    ) -> Result<Self> {
        Self::build(
            mha,
            batch,
            capacity,
            AttentionPath::Auto,
            Chunks::Auto,
            Some(dtype),
        )
    }

    fn build(
        mha: &MultiHeadAttention,
        batch: usize,
        capacity: usize,
        path: AttentionPath,
        chunks: Chunks,
        dtype: Option<KvDtype>,
    ) -> Result<Self> {
        let c = mha.config;
        let gpu = &mha.gpu;
        let own = match mha.qkv_elem_bytes() {
            2 => KvDtype::F16,
            _ => KvDtype::F32,
        };
        let dtype = dtype.unwrap_or(own);
        if !dtype.quantized() && dtype != own {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: format!(
                    "a {dtype} KV cache over a module storing {own} (a float cache holds the module's own type: make the module with the precision wanted, or quantize)"
                ),
            });
        }
        if dtype.quantized() {
            if path == AttentionPath::MultiPass || mha.flash.is_none() {
                return Err(Error::Unsupported {
                    adapter: gpu.describe(),
                    what: format!(
                        "a {dtype} KV cache on the multi-pass path (quantized keys and values are read by the fused passes only)"
                    ),
                });
            }
            dtype.check_head_dim("the key head size (qk_head_dim)", c.qk_head_dim)?;
            dtype.check_head_dim("the value head size (v_head_dim)", c.v_head_dim)?;
        }
        // An f16 module keeps its K/V cache in f16 (half the bytes a decode step reads) and
        // runs only the fused path, which every capacity now has.
        if mha.precision() == Precision::F16 && path == AttentionPath::MultiPass {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: "a multi-pass KV cache over an f16 module (f16 runs the fused path only)"
                    .into(),
            });
        }
        if c.appended_keys() > 0 {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: "a KV cache over a module with add_bias_kv or add_zero_attn (its appended keys would sit among the cached ones); run forward on the whole sequence".into(),
            });
        }
        if batch == 0 || capacity == 0 {
            return Err(Error::Misuse(format!(
                "a KV cache needs batch ≥ 1 and capacity ≥ 1 (got batch {batch}, capacity {capacity})"
            )));
        }
        if c.key_dim != c.value_dim {
            return Err(Error::Misuse(format!(
                "a KV cache projects keys and values from one input, but key_dim {} ≠ value_dim {}",
                c.key_dim, c.value_dim
            )));
        }
        // The fused path at any capacity: small steps run the decode pass (key ranges in
        // parallel), larger ones the flash pass, over several dispatches when the keys are
        // many; both keep their state in `carry`, never a B·H·capacity² buffer.
        let fused = match (path, &mha.flash) {
            (AttentionPath::Auto, flash) => flash.is_some(),
            (AttentionPath::Fused, None) => return Err(mha.no_fused_kernel()),
            (AttentionPath::Fused, Some(_)) => true,
            (AttentionPath::MultiPass, _) => false,
        };
        let (b, h, cap, dk, dv) = (batch, c.heads, capacity, c.qk_head_dim, c.v_head_dim);
        let elem = mha.qkv_elem_bytes();
        // Keys and values of the key/value heads only (fewer than H under GQA/MQA); no values
        // where they are read from the keys (MLA's latent cache).
        let k_elems = b * c.kv_heads * cap * dk;
        let v_elems = match c.values_from_keys {
            true => 0,
            false => b * c.kv_heads * cap * dv,
        };
        let limit = gpu.binding_limit();
        let packed_bytes = elem * (k_elems + v_elems + b * h * cap * dk) as u64;
        // A quantized cache is always chunked (its keys and values are projected to a scratch,
        // then quantized into the chunks): one chunk of the capacity when that fits a binding.
        let one_chunk = dtype.bytes_for(b * c.kv_heads * cap * dk.max(dv)) <= limit;
        let chunk_keys = match chunks {
            Chunks::Auto if dtype.quantized() && one_chunk => Some(cap),
            Chunks::Auto if packed_bytes <= limit && !dtype.quantized() => None,
            Chunks::Auto => Some(largest_chunk(mha, b, limit, dtype)?),
            Chunks::Keys(keys) => Some(keys.div_ceil(chunk_unit(mha)) * chunk_unit(mha)),
        };
        if chunk_keys.is_some() && !(fused && mha.flash.is_some()) {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: format!(
                    "a multi-pass KV cache of {cap} tokens: its keys and values need more than one storage binding, which only the fused path reads"
                ),
            });
        }
        // Tokens one step may bring: all of them, unless the cache is chunked; then as many
        // as the step's own buffers (scratch Q/K/V, inputs, outputs) hold in one binding.
        let per_token = [
            elem as usize * b * (h * dk + c.kv_heads * (dk + dv)),
            4 * b
                * c.model_dim
                    .max(c.key_dim)
                    .max(c.v_width())
                    .max(c.output_dim()),
        ]
        .into_iter()
        .max()
        .unwrap_or(1)
        .max(1);
        let max_step = match chunk_keys {
            None => cap,
            Some(_) => cap.min((limit / per_token as u64) as usize),
        };
        if max_step == 0 {
            return Err(Error::TooLarge {
                what: "one token of a KV cache step (its projected Q, K and V)".into(),
                needed: per_token as u64,
                limit,
            });
        }
        let m = max_step;
        // What the largest step would need must fit a binding now, so that a cache that is
        // made can take every step up to `max_step` (its step buffers grow to it on demand).
        let sizes = [
            (
                "the KV cache's keys and values",
                match chunk_keys {
                    None => k_elems + v_elems,
                    Some(_) => b * (h * dk + c.kv_heads * (dk + dv)) * m,
                },
            ),
            ("the cache's query input", b * m * c.model_dim),
            ("the cache's combined heads", b * m * c.v_width()),
            ("the cache's output", b * m * c.output_dim()),
            (
                "the cache's attention scores",
                if fused { 0 } else { b * h * cap * cap },
            ),
            (
                "the cache's fused-pass state",
                carry_len(mha, b, cap, m, fused),
            ),
        ];
        for (what, elems) in sizes {
            gpu.check_fits(what, 4 * elems as u64)?;
        }
        if let Some(keys) = chunk_keys {
            let rows = b * c.kv_heads * keys;
            gpu.check_fits(
                "one chunk of the KV cache",
                dtype.bytes_for(rows * dk.max(dv)),
            )?;
        }
        let groups = (b * h).max((b * m).div_ceil(64));
        gpu.check_workgroups(
            "KV cache step",
            [groups.min(u32::MAX as usize) as u32, 1, 1],
        )?;
        gpu.scoped("allocating a KV cache", || {
            // Read back by `read_keys_values`.
            let none = wgpu::BufferUsages::COPY_SRC;
            let (kv, k_chunks, v_chunks) = match chunk_keys {
                None => (
                    Some(gpu.storage("KV cache", elem * (k_elems + v_elems) as u64, none)),
                    Vec::new(),
                    Vec::new(),
                ),
                Some(keys) => {
                    let chunk = |d: usize, label: &str| -> Vec<wgpu::Buffer> {
                        (0..cap.div_ceil(keys))
                            .map(|_| {
                                gpu.storage(label, dtype.bytes_for(b * c.kv_heads * keys * d), none)
                            })
                            .collect()
                    };
                    let k_chunks = chunk(dk, "KV cache key chunk");
                    // Values read from the keys: the value chunks are the key chunks.
                    let v_chunks = match c.values_from_keys {
                        true => k_chunks.clone(),
                        false => chunk(dv, "KV cache value chunk"),
                    };
                    (None, k_chunks, v_chunks)
                }
            };
            let chunked = chunk_keys.is_some();
            KvCache {
                batch: b,
                capacity: cap,
                len: 0,
                fused,
                max_step: m,
                owner: mha.weights.w_qkv.clone(),
                kv,
                step: StepBuffers::new(mha, b, cap, m.min(FIRST_STEP_TOKENS), fused, chunked),
                k_chunks,
                v_chunks,
                chunk_keys: chunk_keys.unwrap_or(cap),
                scores: (!fused)
                    .then(|| gpu.storage("step scores", 4 * (b * h * cap * cap) as u64, none)),
                mask: MaskBuffers::new(gpu, 0),
                values_from_keys: c.values_from_keys,
                per_token: dtype.bytes_per(c.kv_heads * (dk + dv * !c.values_from_keys as usize)),
                kv_dims: [c.kv_heads, dk, dv],
                elem: match dtype {
                    KvDtype::F32 => Elem::F32,
                    KvDtype::F16 => Elem::F16,
                    KvDtype::Q8_0 => Elem::Q8_0,
                    KvDtype::Q4_0 => Elem::Q4_0,
                },
                format: {
                    let keys = chunk_keys.unwrap_or(cap);
                    let k_scales = dtype.scales_word(b * c.kv_heads * keys * dk) as u32;
                    KvFormat {
                        dtype,
                        k_scales,
                        v_scales: match c.values_from_keys {
                            true => k_scales,
                            false => dtype.scales_word(b * c.kv_heads * keys * dv) as u32,
                        },
                    }
                },
                ledger: Default::default(),
            }
        })
    }

    /// A cache whose keys and values are stored in chunks of `chunk_keys` tokens (rounded up
    /// to a multiple of [`chunk_unit`](Self::chunk_unit)), each chunk its own buffers, on the
    /// fused path. [`new`](Self::new) chunks a cache by itself when its keys and values would
    /// exceed one storage binding; this forces it, e.g. to test chunking on small caches.
    pub fn chunked(
        mha: &MultiHeadAttention,
        batch: usize,
        capacity: usize,
        chunk_keys: usize,
    ) -> Result<Self> {
        if chunk_keys == 0 {
            return Err(Error::Misuse(
                "a KV cache chunk needs at least one token".into(),
            ));
        }
        Self::chunked_with(mha, batch, capacity, chunk_keys, None)
    }

    /// [`chunked`](Self::chunked) with its keys and values stored as `dtype` (see
    /// [`new_with`](Self::new_with)); `None`: the module's type.
    pub fn chunked_with(
        mha: &MultiHeadAttention,
        batch: usize,
        capacity: usize,
        chunk_keys: usize,
        dtype: Option<KvDtype>,
    ) -> Result<Self> {
        if chunk_keys == 0 {
            return Err(Error::Misuse(
                "a KV cache chunk needs at least one token".into(),
            ));
        }
        Self::build(
            mha,
            batch,
            capacity,
            AttentionPath::Fused,
            Chunks::Keys(chunk_keys),
            dtype,
        )
    }

    /// The element type of its keys and values.
    pub fn dtype(&self) -> KvDtype {
        self.format.dtype
    }

    /// The multiple of which a chunked cache's chunks hold tokens: every key range the
    /// attention passes read (a decode split, a flash key tile) then lies in one chunk.
    pub fn chunk_unit(mha: &MultiHeadAttention) -> usize {
        chunk_unit(mha)
    }

    /// Chunks the keys and values are stored in (1 for an unchunked cache).
    pub fn chunks(&self) -> usize {
        self.k_chunks.len().max(1)
    }

    /// Most tokens one step may bring (the capacity, unless the cache is chunked).
    pub fn max_step(&self) -> usize {
        self.max_step
    }

    /// Sizes the step buffers for steps of up to `tokens` new tokens now (they otherwise grow
    /// when a longer step comes), e.g. before timing. `Err(Misuse)` past [`max_step`](Self::max_step).
    pub fn reserve(&mut self, mha: &MultiHeadAttention, tokens: usize) -> Result<()> {
        if tokens > self.max_step {
            return Err(Error::Misuse(format!(
                "a step of {tokens} tokens: this KV cache takes at most {} per step (its step \
                 buffers fill one storage binding); step in fewer tokens",
                self.max_step
            )));
        }
        if tokens > self.step.tokens {
            let grown = tokens.max(2 * self.step.tokens).min(self.max_step);
            let chunked = self.kv.is_none();
            let (b, cap, fused) = (self.batch, self.capacity, self.fused);
            self.step = mha.gpu.scoped("growing a KV cache's step buffers", || {
                StepBuffers::new(mha, b, cap, grown, fused, chunked)
            })?;
        }
        Ok(())
    }

    /// The bytes it holds on the device: keys and values at the full capacity, the step
    /// buffers at the largest step so far (see [`reserve`](Self::reserve)), and a multi-pass
    /// cache's scores.
    pub fn bytes(&self) -> KvCacheBytes {
        let kv: u64 = self
            .kv
            .iter()
            .chain(&self.k_chunks)
            .chain(self.v_chunks.iter().filter(|_| !self.values_from_keys))
            .map(wgpu::Buffer::size)
            .sum();
        KvCacheBytes {
            keys_values: kv,
            step: self.step.bytes() + self.mask.words.size() + self.mask.params.size(),
            scores: self.scores.as_ref().map_or(0, wgpu::Buffer::size),
            per_token: self.per_token,
        }
    }

    /// The head-split layout of a step: queries in the step buffer; keys and values in the
    /// cache at its capacity, or (chunked) in the step's scratch before they are appended.
    fn layout(&self, c: &crate::AttentionConfig) -> QkvLayout {
        let (b, t) = (self.batch, self.step.tokens);
        let kv_group = c.kv_group() as u32;
        match self.kv {
            Some(_) => QkvLayout {
                q_offset: 0,
                k_offset: 0,
                // Values read from the keys (MLA's latent cache): one buffer region for both.
                v_offset: match c.values_from_keys {
                    true => 0,
                    false => (b * c.kv_heads * self.capacity * c.qk_head_dim) as u32,
                },
                kv_stride: self.capacity as u32,
                kv_group,
            },
            None => {
                let q_len = b * c.heads * t * c.qk_head_dim;
                let k_len = b * c.kv_heads * t * c.qk_head_dim;
                QkvLayout {
                    q_offset: 0,
                    k_offset: q_len as u32,
                    v_offset: (q_len + k_len) as u32,
                    kv_stride: t as u32,
                    kv_group,
                }
            }
        }
    }

    /// The cached keys as device tensors, so an engine can attend to them itself (e.g. with
    /// [`scaled_dot_product_attention`](crate::scaled_dot_product_attention)): one view per
    /// buffer holding cached tokens, in token order — one for a cache in one buffer, one per
    /// chunk holding any of the first [`len`](Self::len) tokens of a chunked cache — and none
    /// for an empty cache. Each is `[B, H_kv, n, dk]`, [`Layout::Bhld`], with spare rows up to
    /// the cache's (or chunk's) capacity, f16 in a cache over an f16 module; RoPE, when the
    /// module has it, is already applied.
    ///
    /// Read-only: the borrow keeps the cache from stepping while the views live, but wgpu
    /// cannot stop a view being bound for writing; writing one corrupts the cache. Commands
    /// reading them see the rows of every step recorded before them in submission order (see
    /// the sequence rule at [`MultiHeadAttention::forward_step_gpu_into`]).
    pub fn keys(&self) -> Vec<KvView<'_>> {
        self.views(true)
    }

    /// The cached values, as [`keys`](Self::keys) lays them out: `[B, H_kv, n, dv]`. A cache
    /// that reads its values from its keys (MLA's latent cache) returns the keys' buffers.
    pub fn values(&self) -> Vec<KvView<'_>> {
        self.views(false)
    }

    fn views(&self, keys: bool) -> Vec<KvView<'_>> {
        let [kv_heads, dk, dv] = self.kv_dims;
        let d = if keys { dk } else { dv };
        let tensor = |buffer, n, capacity, offset| {
            let t = DeviceTensor::new(buffer, [self.batch, kv_heads, n, d], Layout::Bhld)
                .with_capacity(capacity)
                .at_offset(offset);
            let scales = match keys {
                true => self.format.k_scales,
                false => self.format.v_scales,
            };
            match self.elem {
                Elem::F16 => t.f16(),
                Elem::F32 => t,
                quant => t.quantized(quant, scales as usize),
            }
        };
        if self.len == 0 {
            return Vec::new();
        }
        match &self.kv {
            Some(kv) => {
                let offset = match keys || self.values_from_keys {
                    true => 0,
                    false => self.batch * kv_heads * self.capacity * dk,
                };
                vec![KvView {
                    tokens: 0..self.len,
                    tensor: tensor(kv, self.len, self.capacity, offset),
                }]
            }
            None => {
                let chunks = if keys { &self.k_chunks } else { &self.v_chunks };
                let per = self.chunk_keys;
                chunks
                    .iter()
                    .take(self.len.div_ceil(per))
                    .enumerate()
                    .map(|(c, buffer)| {
                        let tokens = c * per..self.len.min((c + 1) * per);
                        let n = tokens.len();
                        KvView {
                            tokens,
                            tensor: tensor(buffer, n, per, 0),
                        }
                    })
                    .collect()
            }
        }
    }

    /// Tokens cached so far (per sequence).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether no token is cached.
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
    /// Sequences in the cache (`B`).
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
        self.ledger.truncate(0);
    }

    /// Forgets the tokens past the first `len` (as [`reset`](Self::reset) forgets all), e.g.
    /// after a step recorded with
    /// [`forward_step_gpu_into`](MultiHeadAttention::forward_step_gpu_into) whose encoder was
    /// never submitted. `Err(Misuse)` when `len` is more than the cache holds.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::Misuse(format!(
                "truncating a KV cache of {} tokens to {len}: it can only shrink",
                self.len
            )));
        }
        self.len = len;
        self.ledger.truncate(len);
        Ok(())
    }
}
