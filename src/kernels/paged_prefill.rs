//! `paged_prefill`: the paged pass for blocks of query rows on CPU adapters — the fused core's
//! register tiling (`flash_group.wgsl`) over keys staged from a pool's pages (see
//! `shaders/paged_prefill.wgsl`). Same work list, parameters and bindings as
//! [`super::paged_attention`]; this module owns its shape and how many keys an item may take.

use crate::gpu::pass::{Pass, PassSpec};
use crate::gpu::Gpu;
use crate::kernels::flash_attention::{self, GROUP_WGSL, KV_SHARED_WGSL, KV_SUBGROUP_WGSL};
use crate::kernels::paged_attention::{kv_prelude, pool_reads, slots, vec4_rows, COMMON_WGSL};
pub use crate::kernels::paged_attention::{ROWS_SCALAR_WGSL, ROWS_VEC4_WGSL};
use crate::kernels::source::Prelude;
use crate::kv_dtype::KvDtype;

pub const WGSL: &str = include_str!("../../shaders/paged_prefill.wgsl");

/// Lanes per workgroup: one llvmpipe SIMD vector.
const THREADS: u32 = 8;
/// Most keys staged per tile (the fused core's).
const MAX_KV_TILE: u32 = 32;

/// Everything the shader is specialised on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrefillShape {
    pub threads: u32,
    /// (row, head) slots each thread owns: an item carries `rows · threads`.
    pub rows: u32,
    /// Keys staged per tile, whole key groups.
    pub kv_tile: u32,
    pub d4: u32,
    /// The head size (rows are read as whole vec4s when it is a multiple of 4).
    pub head_dim: u32,
    pub f16: bool,
    /// Bits of a quantized pool's values (8: q8_0, 4: q4_0), 0 for a float pool.
    pub kv_bits: u32,
    /// A key group's staged K/V vec4s are read once per subgroup and broadcast, as the fused
    /// core's ([`flash_attention::subgroup_kv`]).
    pub subgroup_kv: bool,
}

impl PrefillShape {
    /// The shape for `head_dim` on `gpu`: the fused core's rows per thread (8 on lavapipe, 4 on
    /// GL's llvmpipe, whose GLSL route compiles the unrolled body slowly; fewer for wide heads)
    /// and the largest tile of whole key groups, at most 32 keys, that fits the workgroup memory.
    /// `None` when not even a group of 8 keys fits.
    pub fn for_device(gpu: &Gpu, head_dim: usize, dtype: KvDtype) -> Option<Self> {
        let rows = flash_attention::rows_per_thread(gpu, head_dim, head_dim);
        let limit = gpu.limits().max_compute_workgroup_storage_size;
        let shape = Self::within(limit, rows, head_dim, dtype)?;
        Some(PrefillShape {
            subgroup_kv: flash_attention::subgroup_kv(gpu, THREADS),
            ..shape
        })
    }

    /// [`for_device`](Self::for_device) for `rows` per thread and `limit` bytes of workgroup
    /// memory, staged K/V read by every lane (no subgroup operations).
    pub fn within(limit: u32, rows: u32, head_dim: usize, dtype: KvDtype) -> Option<Self> {
        let d4 = u32::try_from(head_dim.div_ceil(4)).ok()?;
        // Per staged key: its K and V vec4s and where its row lies.
        let per_key = 32u32.checked_mul(d4)?.checked_add(4)?;
        let fit = (limit / per_key).min(MAX_KV_TILE);
        let group = if fit >= 16 { 16 } else { 8 };
        let kv_tile = fit / group * group;
        (kv_tile >= 8 && rows.is_power_of_two()).then_some(PrefillShape {
            threads: THREADS,
            rows,
            kv_tile,
            d4,
            head_dim: head_dim as u32,
            f16: dtype == KvDtype::F16,
            kv_bits: dtype.quant_bits(),
            subgroup_kv: false,
        })
    }

    /// (row, head) slots of an item.
    pub fn slots(&self) -> u32 {
        self.rows * self.threads
    }

    /// Keys the shader takes at once.
    pub fn key_group(&self) -> u32 {
        flash_attention::key_group(self.kv_tile)
    }

    /// Most keys one work item may cover: llvmpipe stops an invocation's loops after 65,535
    /// iterations in total (silently), so a chunk is held to two thirds of that, counted as if
    /// no loop were unrolled. Whole tiles.
    pub fn max_chunk_keys(&self) -> u32 {
        let (d4, rows, group) = (self.d4, self.rows, self.key_group());
        // Per key group: the score and P·V loops (d4 × rows each), the mask loop (rows × keys),
        // the softmax (rows × score vec4s) and the group loop; per key: page lookup and staging.
        let per_group = 2 * d4 * (1 + rows) + rows * group + 2 * rows * (1 + group / 4) + 1;
        let per_key = per_group.div_ceil(group) + (2 * d4).div_ceil(self.threads) + 2;
        // q and the sinks, the output, plus a margin.
        let fixed = rows * (d4 * 5 + 8) + 4096;
        let keys = (65_535u32.saturating_sub(fixed) * 2 / 3 / per_key).max(self.kv_tile);
        keys / self.kv_tile * self.kv_tile
    }
}

/// The full source: the shape's constants, the pool's element type, the shared parts, the body.
pub fn source(shape: PrefillShape) -> String {
    // Every row starts on a vec4 when the head size is whole vec4s (pages hold whole rows).
    let float_rows = if shape.d4 * 4 == shape.head_dim {
        vec4_rows(shape.f16)
    } else {
        ROWS_SCALAR_WGSL
    };
    let (kv_quant, rows) = pool_reads(shape.kv_bits, float_rows);
    let prelude = Prelude::new()
        .u32("THREADS", shape.threads)
        .u32("ROWS", shape.rows)
        .u32("KV_TILE", shape.kv_tile)
        .u32("KEY_GROUP", shape.key_group())
        .u32("DK4", shape.d4);
    let kv = if shape.subgroup_kv {
        KV_SUBGROUP_WGSL
    } else {
        KV_SHARED_WGSL
    };
    kv_prelude(prelude, shape.f16, shape.kv_bits).source(&[
        COMMON_WGSL,
        kv_quant,
        rows,
        kv,
        GROUP_WGSL,
        WGSL,
    ])
}

/// The compiled pass of `shape` on `gpu`, bound as [`super::paged_attention::bind`] binds.
pub fn pass(gpu: &Gpu, shape: PrefillShape) -> std::sync::Arc<Pass> {
    let key = format!("paged_prefill {shape:?}");
    let spec = PassSpec::main("paged_prefill", slots(shape.kv_bits));
    gpu.compile(&key, &spec, || source(shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_workgroup_memory_and_chunks_the_loop_cap() {
        let s = PrefillShape::within(32 * 1024, 8, 128, KvDtype::F32).expect("d128");
        // 32 keys of K and V at d128 fill 32 KiB exactly, leaving no room for their row words.
        assert_eq!((s.kv_tile, s.key_group(), s.slots()), (16, 16, 64));
        let s = PrefillShape::within(32 * 1024, 8, 256, KvDtype::F16).expect("d256");
        assert_eq!(s.kv_tile, 8);
        assert!(s.max_chunk_keys().is_multiple_of(8));
        assert_eq!(PrefillShape::within(1024, 8, 256, KvDtype::F32), None);
        assert_eq!(PrefillShape::within(32 * 1024, 3, 64, KvDtype::F32), None);
        let chunk = PrefillShape::within(32 * 1024, 8, 128, KvDtype::F32)
            .expect("d128")
            .max_chunk_keys();
        assert!((256..=4096).contains(&chunk), "{chunk}");
    }
}
