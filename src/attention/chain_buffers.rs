//! What one chain of passes (`workspace::dispatches`) runs over: its rows ([`Geometry`]), the
//! buffers it reads and writes ([`Bound`]) and where in them ([`Placement`]). Shared by the
//! chain, its row passes, the KV cache's and the pool's steps, and the caller-buffer views.

use crate::kernels::mask::MaskBuffers;
use crate::kernels::{KvChunks, QkvBuffers, QkvLayout};

/// The rows of one chain of passes: `batch` sequences of `lq` queries attending to `lk` keys.
/// Rows `kv_pos..lk − appended` of K/V buffers with `layout.kv_stride` rows per (batch, head)
/// are new (projected by this chain); the last `appended` rows are the module's appended keys
/// (bias_k, a zero key), written once with the buffers (see [`Workspace::new`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub batch: usize,
    pub lq: usize,
    pub lk: usize,
    pub kv_pos: usize,
    pub appended: usize,
    pub layout: QkvLayout,
    pub fused: bool,
}

/// The buffers a chain reads and writes. `query`, `key` and `value` may be the same buffer
/// (self-attention) — the projections are planned from that.
pub(crate) struct Bound<'a> {
    pub query: &'a wgpu::Buffer,
    pub key: &'a wgpu::Buffer,
    pub value: &'a wgpu::Buffer,
    /// Head-split Q, K, V at `Geometry::layout`.
    pub qkv: QkvBuffers<'a>,
    /// `[B, H, Lq, Lk]`, for the multi-pass core.
    pub scores: Option<&'a wgpu::Buffer>,
    pub combined: &'a wgpu::Buffer,
    /// The output gate's values `[B·Lq, H·dv]`, for a module with `output_gate`.
    pub gate: Option<&'a wgpu::Buffer>,
    /// The module's output, when it has an output projection.
    pub output: Option<&'a wgpu::Buffer>,
    pub carry: &'a wgpu::Buffer,
    pub mask: &'a MaskBuffers,
    /// cos/sin tables of the queries' and the new keys' positions, for a module with RoPE.
    pub rope: Option<RopeTables<'a>>,
    /// A KV cache stored in chunks: new keys and values are projected to rows `0..` of
    /// `qkv`'s K/V (a scratch) and appended to the chunks at `kv_pos`, which attention reads.
    pub chunks: Option<KvChunks<'a>>,
    /// Where in `query`, `key`, `value` and the result the rows lie.
    pub at: Placement,
}

/// Where a chain reads its inputs and writes its result inside the buffers of [`Bound`]:
/// the element offsets of query, key and value (rows of each contiguous from there), and the
/// result's offset and rows per sequence (a caller's slab, see `attention::views`). The
/// default is the workspace's and the cache's own buffers: everything at 0, `Lq` rows.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Placement {
    pub inputs: [u32; 3],
    pub out_offset: u32,
    /// Rows per sequence of the result; 0 means `Lq`.
    pub out_rows: u32,
}

/// A chain's inputs and result in buffers other than its workspace's
/// ([`Workspace::chain_on`]): query, key, value (the same buffer where they are one tensor)
/// and the module's result, at `at`.
pub(crate) struct ChainIo<'a> {
    pub inputs: [&'a wgpu::Buffer; 3],
    pub output: &'a wgpu::Buffer,
    pub at: Placement,
}

/// `[B, n, rotary_dims / 2, 2]` cos/sin tables ([`crate::model::rope::Rope::table`]).
#[derive(Clone, Copy)]
pub(crate) struct RopeTables<'a> {
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
}

/// The row of `qkv`'s K/V layout the projections write the first new key to: `kv_pos`, or 0
/// in a chunked cache's scratch.
pub(crate) fn new_kv_row(g: &Geometry, b: &Bound) -> usize {
    if b.chunks.is_some() {
        0
    } else {
        g.kv_pos
    }
}
