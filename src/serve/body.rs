//! Which paged pass runs which rows of a plan: on a GPU the tiles (`paged_attention`) take
//! everything; on a CPU adapter decode rows (a sequence's single query row) run the lane-keys
//! body (`paged_decode`) and blocks of rows the register-tiled one (`paged_prefill`), each
//! over its own part of the work list, so a step that mixes prefill chunks and decode rows
//! runs both in their own shape.

use std::sync::Arc;

use crate::gpu::pass::Pass;
use crate::gpu::{Gpu, KernelClass};
use crate::kernels::paged_attention::{self as tiles, PagedShape};
use crate::kernels::paged_decode::{self, DecodeShape};
use crate::kernels::paged_prefill::{self, PrefillShape};
use crate::kv_dtype::KvDtype;
use crate::serve::work_list::Split;

/// A paged pass and its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// K/V staged per tile, a (slot, column) pair per thread (`paged_attention`).
    Tiles(PagedShape),
    /// Each lane a run of keys whole (`paged_decode`): decode rows on a CPU adapter.
    LaneKeys(DecodeShape),
    /// The fused core's register tiling over staged keys (`paged_prefill`): blocks of rows on a
    /// CPU adapter.
    RegisterTiled(PrefillShape),
}

/// The bodies of a plan: one for decode rows where they get their own, one for the rest.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bodies {
    pub decode: Option<Body>,
    pub rows: Body,
}

impl Bodies {
    /// The bodies on `gpu` for heads of `head_dim`, `group` query heads per KV head. GL's
    /// llvmpipe never takes the lane keys: its GLSL route compiles the unrolled body for
    /// minutes (205 s at d64 with 4 heads, measured), as the module's decode pass keeps its
    /// shared-key body there.
    pub fn for_device(
        gpu: &Gpu,
        tiles: PagedShape,
        head_dim: usize,
        dtype: KvDtype,
        group: usize,
    ) -> Self {
        if gpu.kernel_class() == KernelClass::Gpu {
            return Bodies {
                decode: None,
                rows: Body::Tiles(tiles),
            };
        }
        let gl = gpu.info().backend == wgpu::Backend::Gl;
        let decode = match gl {
            true => None,
            false => DecodeShape::for_device(gpu, head_dim, dtype, group).map(Body::LaneKeys),
        };
        let rows = PrefillShape::for_device(gpu, head_dim, dtype)
            .map_or(Body::Tiles(tiles), Body::RegisterTiled);
        Bodies { decode, rows }
    }
}

impl Body {
    /// How the body takes its work: (row, head) slots per item, keys in whole granules, at
    /// most so many keys an item (llvmpipe's loop cap on a CPU adapter).
    pub(super) fn split(&self, software: bool) -> Split {
        match *self {
            // Items of the group's heads, chunks in whole runs of lanes.
            Body::LaneKeys(s) => Split {
                slots: s.heads as usize,
                granule: s.threads as usize,
                max_chunk: s.keys as usize,
            },
            Body::RegisterTiled(s) => Split {
                slots: s.slots() as usize,
                granule: s.kv_tile as usize,
                max_chunk: s.max_chunk_keys() as usize,
            },
            Body::Tiles(s) => Split {
                slots: s.slots as usize,
                granule: s.key_tile as usize,
                max_chunk: s.max_chunk_keys(software) as usize,
            },
        }
    }

    /// Whether the body reads a quantized pool (and binds its format: see [`tiles::bind`]).
    pub(super) fn quantized(&self) -> bool {
        let bits = match *self {
            Body::LaneKeys(s) => s.kv_bits,
            Body::RegisterTiled(s) => s.kv_bits,
            Body::Tiles(s) => s.kv_bits,
        };
        bits > 0
    }

    /// The compiled pass (all three bind as [`tiles::bind`] binds).
    pub(super) fn pass(&self, gpu: &Gpu) -> Arc<Pass> {
        match *self {
            Body::LaneKeys(s) => paged_decode::pass(gpu, s),
            Body::RegisterTiled(s) => paged_prefill::pass(gpu, s),
            Body::Tiles(s) => tiles::pass(gpu, s),
        }
    }
}
