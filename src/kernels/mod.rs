//! One module per pass. Each owns its WGSL source (a generated prelude, the shared snippets and
//! its body), its `#[repr(C)]` parameter struct, its typed bindings and its dispatch geometry,
//! and hands out ready [`Dispatch`]es built from a problem description. Nothing outside this
//! folder fills a parameter struct or names a binding number.
//!
//! Binding numbers are shared across passes so the layouts read alike:
//! 0 = uniform params, 1–3 = read-only inputs, 4 = the output, 5 = carried state,
//! 6 = mask words, 7 = mask params.

pub mod av_combine;
#[doc(hidden)]
pub mod catalog;
pub mod clamp;
pub mod decode;
pub mod flash_attention;
pub mod kv_append;
pub mod linear;
pub mod mask;
pub mod merge_state;
pub mod mla_rows;
pub mod naive;
pub mod output_gate;
pub mod paged_append;
pub mod paged_attention;
pub mod paged_decode;
pub mod paged_merge;
pub mod paged_prefill;
pub mod qk_norm;
pub mod read_probe;
pub mod rope;
pub mod scores;
pub mod softmax;
pub mod source;
pub mod standalone;

use crate::gpu::pass::Binding;
pub use crate::gpu::pass::Dispatch;
use source::Prelude;

/// The shared 64×64 GEMM tile loop of `linear`, `scores` and `av_combine` (prepended by the
/// host; WGSL has no `#include`).
pub const GEMM_TILE_WGSL: &str = include_str!("../../shaders/gemm_tile.wgsl");
/// `RowStrides` and `row_start`: where the attention passes find a tensor's rows ([`RowStrides`]).
pub const ROWS_WGSL: &str = include_str!("../../shaders/rows.wgsl");
/// The entry point of the passes that take one item per invocation of a 1-D dispatch of
/// workgroups of 64 over x then y (`items()` and `item(idx)` are the body's), and `grid3`.
pub const GRID64_WGSL: &str = include_str!("../../shaders/grid64.wgsl");
/// Quantizing a block of 32 new K/V values into q8_0 / q4_0 words (the appends into a
/// quantized cache or pool).
pub const KV_APPEND_BLOCK_WGSL: &str = include_str!("../../shaders/kv_append_block.wgsl");
/// Dequantizing q8_0 / q4_0 K/V words (see [`crate::kv_dtype`]), for the passes that read them.
pub const KV_QUANT_WGSL: &str = include_str!("../../shaders/kv_quant.wgsl");

/// Output rows and columns of one workgroup of the shared GEMM tile (`TILE_M`, `TILE_N`).
pub const GEMM_TILE: u32 = 64;

/// The prelude lines of every pass built on `gemm_tile.wgsl`.
pub(crate) fn gemm_prelude(p: Prelude) -> Prelude {
    p.u32("TILE_M", GEMM_TILE).u32("TILE_N", GEMM_TILE)
}

/// Most of a GEMM's K one `gemm_tile` dispatch walks on a software rasteriser. Mesa's llvmpipe
/// (behind lavapipe and GL here) silently stops a shader invocation's loops once their
/// iterations add up to 65,535; `gemm_tile` makes about 21 per slice of 16 (the staging loop,
/// the slice's k loop, the slice itself) as if none were unrolled, so 16,384 keeps one
/// invocation near 21,500, a third of the cap.
pub const SOFTWARE_GEMM_DEPTH: u32 = 16_384;

/// Whether `gpu` is a software rasteriser, whose loop-iteration cap the kernels must respect.
pub fn is_software(gpu: &crate::gpu::Gpu) -> bool {
    gpu.info().device_type == wgpu::DeviceType::Cpu
}

/// The `[k_begin, k_end)` ranges one `gemm_tile` GEMM of `depth` runs as: one range on GPUs,
/// ranges of at most `per_dispatch` on software rasterisers (each adds to the last one's sum).
pub fn depth_ranges(depth: u32, per_dispatch: Option<u32>) -> Vec<(u32, u32)> {
    let step = per_dispatch.unwrap_or(u32::MAX).max(1);
    let mut ranges = Vec::new();
    let mut k = 0u32;
    loop {
        let end = depth.min(k.saturating_add(step));
        ranges.push((k, end));
        if end >= depth {
            return ranges;
        }
        k = end;
    }
}

/// One dispatch of `pass` per range of [`depth_ranges`] on this device (split only on software
/// rasterisers), each with the parameters `params(k_begin, k_end)`.
pub(crate) fn depth_split<'b, P: bytemuck::Pod, B: Into<Binding<'b>> + Copy>(
    gpu: &crate::gpu::Gpu,
    pass: &std::sync::Arc<crate::gpu::pass::Pass>,
    depth: u32,
    params: impl Fn(u32, u32) -> P,
    buffers: &[(u32, B)],
    groups: [u32; 3],
) -> crate::error::Result<Vec<Dispatch>> {
    depth_ranges(depth, is_software(gpu).then_some(SOFTWARE_GEMM_DEPTH))
        .into_iter()
        .map(|(k0, k1)| Dispatch::new(gpu, pass.clone(), &params(k0, k1), buffers, groups))
        .collect()
}

/// Where the head-split Q, K and V of one attention problem lie, as element offsets into their
/// buffers ([`QkvBuffers`]); K and V have `kv_stride` rows per (batch, head) (Lk, or a KV cache's capacity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvLayout {
    pub q_offset: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub kv_stride: u32,
    /// Query heads that share one key/value head: 1, or H / H_kv for grouped-query (and
    /// multi-query) attention. K and V hold `B·H_kv` (batch, kv head) blocks; query head `h`
    /// reads block `z / kv_group` of its `z = b·H + h`.
    pub kv_group: u32,
}

/// The buffers holding head-split Q, K and V: one packed buffer (the same in all three, at
/// the [`QkvLayout`] offsets) or, when the packed one would exceed a storage binding, one
/// buffer each (offsets 0). The attention passes bind them separately either way.
#[derive(Debug, Clone, Copy)]
pub struct QkvBuffers<'a> {
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub v: &'a wgpu::Buffer,
}

/// Keys and values stored in chunks of `keys` rows per (batch, key/value head) — a KV cache
/// larger than one storage binding: chunk `c` holds keys `c·keys .. (c+1)·keys` in its own
/// buffers, `[B, H_kv, keys, d]` each (offset 0, `kv_stride = keys`). The attention passes
/// make one dispatch per chunk, each binding that chunk.
#[derive(Debug, Clone, Copy)]
pub struct KvChunks<'a> {
    pub k: &'a [wgpu::Buffer],
    pub v: &'a [wgpu::Buffer],
    pub keys: usize,
    /// Their element type, and where a quantized chunk's scales start (every chunk alike).
    pub format: KvFormat,
}

/// One dispatch's view of K and V: buffers whose row 0 is key `key_base`, holding keys up to
/// `key_end`.
#[derive(Debug, Clone, Copy)]
pub struct KvSpan<'a> {
    pub k: Binding<'a>,
    pub v: Binding<'a>,
    pub key_base: usize,
    pub key_end: usize,
}

/// The spans `lk` keys are read in: `qkv`'s K and V (the `ranges` of them), or one per chunk
/// holding any of them (at least one).
pub fn kv_spans<'a>(
    qkv: &QkvBuffers<'a>,
    chunks: Option<KvChunks<'a>>,
    lk: usize,
    ranges: &BoundRanges,
) -> Vec<KvSpan<'a>> {
    match chunks {
        None => vec![KvSpan {
            k: Binding::new(qkv.k, ranges.k),
            v: Binding::new(qkv.v, ranges.v),
            key_base: 0,
            key_end: lk,
        }],
        Some(ch) => {
            let used = lk
                .div_ceil(ch.keys.max(1))
                .clamp(1, ch.k.len().min(ch.v.len()));
            (0..used)
                .map(|c| KvSpan {
                    k: Binding::from(&ch.k[c]),
                    v: Binding::from(&ch.v[c]),
                    key_base: c * ch.keys,
                    key_end: lk.min((c + 1) * ch.keys),
                })
                .collect()
        }
    }
}

impl<'a> QkvBuffers<'a> {
    /// Q, K and V in one buffer.
    pub fn packed(qkv: &'a wgpu::Buffer) -> Self {
        QkvBuffers {
            q: qkv,
            k: qkv,
            v: qkv,
        }
    }

    /// Whether Q, K and V share one buffer (so one GEMM may write several of them).
    pub fn is_packed(&self) -> bool {
        self.q == self.k && self.k == self.v
    }
}

/// Sizes of one attention-core problem on head-split inputs: `batch·heads` independent
/// (Lq × Lk) attentions of head sizes `qk_head_dim`, `v_head_dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreDims {
    pub batch: usize,
    pub heads: usize,
    pub lq: usize,
    pub lk: usize,
    /// Per-head width of queries and keys (`dk`).
    pub qk_head_dim: usize,
    /// Per-head width of values (`dv`).
    pub v_head_dim: usize,
}

impl CoreDims {
    /// (batch, head) pairs: the z extent of the attention dispatches.
    pub fn batch_heads(&self) -> u32 {
        (self.batch * self.heads) as u32
    }
    /// Elements of the combined-heads output `[B, Lq, H·dv]`.
    pub fn combined_len(&self) -> usize {
        self.batch * self.lq * self.heads * self.v_head_dim
    }
    /// Elements of the scores / probabilities `[B, H, Lq, Lk]`.
    pub fn scores_len(&self) -> usize {
        self.batch * self.heads * self.lq * self.lk
    }
}

/// The head size the fused and decode pipelines are laid out for when the module's is `d`:
/// multiples of 16 up to 128 (16 for any head up to 16), of 32 up to 256, of 64 beyond. The
/// shaders read the real size from their parameters and zero-pad the rest, so modules whose
/// heads round to one bucket share one compiled pipeline: a software adapter spends seconds on
/// each, and a cold Vulkan test pass compiled 56 fused and 64 decode specialisations when each
/// head size had its own. Sizes models use (64, 80, 96, 128, 256) are buckets themselves and
/// run exactly as before; another size pays for its padding, fewer than 16 extra dims up to
/// 128, 32 up to 256, 64 beyond. Heads under 16 (which no model of note uses, but the tests do)
/// all share the 16 bucket.
pub fn head_cap(d: usize) -> usize {
    match d {
        0..=128 => d.div_ceil(16).max(1) * 16,
        129..=256 => d.div_ceil(32) * 32,
        _ => d.div_ceil(64) * 64,
    }
}

/// Where the rows of one tensor of the attention core lie in its buffer: row `l` of head `h`
/// of batch `b` starts at element `offset + b·batch + h·head + l·row`, and its elements are
/// contiguous (mirrors `RowStrides` in `shaders/rows.wgsl`). K's and V's heads are key/value heads.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowStrides {
    pub offset: u32,
    pub batch: u32,
    pub head: u32,
    pub row: u32,
}

impl RowStrides {
    /// `[B, H, L, d]` from element `offset`, `rows` rows per (batch, head) (L, or more: a
    /// KV cache's capacity).
    pub fn head_split(offset: u32, heads: usize, rows: usize, d: usize) -> Self {
        RowStrides {
            offset,
            batch: (heads * rows * d) as u32,
            head: (rows * d) as u32,
            row: d as u32,
        }
    }

    /// `[B, L, H, d]` from element `offset`: the combined-heads layout a projection writes.
    pub fn sequence_major(offset: u32, heads: usize, len: usize, d: usize) -> Self {
        RowStrides {
            offset,
            batch: (len * heads * d) as u32,
            head: d as u32,
            row: (heads * d) as u32,
        }
    }

    /// Whether every row starts on a vec4 boundary (the vec4 decode loads need it).
    pub fn vec4_aligned(&self) -> bool {
        [self.offset, self.batch, self.head, self.row]
            .iter()
            .all(|n| n % 4 == 0)
    }
}

/// Where an attention core reads Q, K, V and writes its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreLayout {
    pub q: RowStrides,
    pub k: RowStrides,
    pub v: RowStrides,
    pub out: RowStrides,
    /// Query heads per key/value head (see [`QkvLayout::kv_group`]).
    pub kv_group: u32,
    /// Whether the Q, K and V bindings hold whole vec4s (the crate's own buffers do, see
    /// [`crate::gpu::buffers::padded_size`]; a caller's view is decided by its bound range):
    /// with aligned rows, the decode pass then loads them as vec4s, whose last one must lie
    /// inside the binding.
    pub whole_vec4s: bool,
    /// The byte ranges of the Q, K, V and output buffers the passes bind (`None`: whole
    /// buffers, the module's own); a caller's view into a larger arena binds only the aligned
    /// range it needs, its element offsets counted from the range's start.
    pub ranges: BoundRanges,
    /// How K and V are stored when quantized (default: floats of Q's element type).
    pub kv: KvFormat,
}

/// A quantized K/V's element type and where each buffer's scales plane starts, in words (see
/// [`crate::kv_dtype`]); the passes read floats of Q's element type where `dtype` is not a
/// quantized one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvFormat {
    pub dtype: crate::KvDtype,
    pub k_scales: u32,
    pub v_scales: u32,
}

/// `(offset, size)` byte ranges bound of the Q, K, V and output buffers (see
/// [`CoreLayout::ranges`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BoundRanges {
    pub q: Option<(u64, u64)>,
    pub k: Option<(u64, u64)>,
    pub v: Option<(u64, u64)>,
    pub out: Option<(u64, u64)>,
}

/// One attention-core problem: its sizes, its score scale and where Q, K, V and the output lie.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoreProblem {
    pub dims: CoreDims,
    pub scale: f32,
    pub layout: CoreLayout,
}

impl CoreProblem {
    /// A module's problem: head-split Q, K, V at `qkv`, the output in the combined-heads
    /// layout `[B, Lq, H·dv]` (what `W_o` reads).
    pub fn head_split(dims: CoreDims, scale: f32, qkv: QkvLayout) -> Self {
        let kv_heads = dims.heads / (qkv.kv_group as usize).max(1);
        let rows = qkv.kv_stride as usize;
        CoreProblem {
            dims,
            scale,
            layout: CoreLayout {
                q: RowStrides::head_split(qkv.q_offset, dims.heads, dims.lq, dims.qk_head_dim),
                k: RowStrides::head_split(qkv.k_offset, kv_heads, rows, dims.qk_head_dim),
                v: RowStrides::head_split(qkv.v_offset, kv_heads, rows, dims.v_head_dim),
                out: RowStrides::sequence_major(0, dims.heads, dims.lq, dims.v_head_dim),
                kv_group: qkv.kv_group,
                whole_vec4s: true,
                ranges: BoundRanges::default(),
                kv: KvFormat::default(),
            },
        }
    }
}

impl std::ops::Deref for CoreProblem {
    type Target = CoreDims;
    fn deref(&self) -> &CoreDims {
        &self.dims
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_caps_hold_the_head_and_are_few() {
        let mut caps = std::collections::BTreeSet::new();
        for d in 1..=1024 {
            let cap = head_cap(d);
            assert!(cap >= d && cap.is_multiple_of(4), "d{d} -> {cap}");
            assert_eq!(head_cap(cap), cap, "a cap is its own bucket");
            let most = match d {
                0..=128 => 16,
                129..=256 => 32,
                _ => 64,
            };
            assert!(cap - d < most, "d{d} -> {cap}");
            if d <= 256 {
                caps.insert(cap);
            }
        }
        for d in [64, 80, 96, 128, 256] {
            assert_eq!(head_cap(d), d, "a common head size is padded");
        }
        assert_eq!(caps.len(), 12, "{caps:?}");
    }

    use super::depth_ranges;

    #[test]
    fn depth_ranges_tile_the_depth_in_order() {
        assert_eq!(depth_ranges(100, None), vec![(0, 100)]);
        assert_eq!(depth_ranges(16_384, Some(16_384)), vec![(0, 16_384)]);
        assert_eq!(
            depth_ranges(16_385, Some(16_384)),
            vec![(0, 16_384), (16_384, 16_385)]
        );
        assert_eq!(
            depth_ranges(40, Some(16)),
            vec![(0, 16), (16, 32), (32, 40)]
        );
        // An empty depth is still one (empty) range, so the epilogue writes its zeros.
        assert_eq!(depth_ranges(0, Some(16)), vec![(0, 0)]);
    }
}
