//! `paged_decode`: the paged pass for decode batches on CPU adapters, each lane taking a run of
//! keys whole (see `shaders/paged_decode.wgsl`). Same work list, parameters and bindings as
//! [`super::paged_attention`]; this module owns its shape and how many keys an item may take.

use crate::gpu::pass::{Pass, PassSpec};
use crate::gpu::Gpu;
use crate::kernels::paged_attention::{kv_prelude, pool_reads, slots, vec4_rows, COMMON_WGSL};
use crate::kernels::source::Prelude;
use crate::kv_dtype::KvDtype;

pub const WGSL: &str = include_str!("../../shaders/paged_decode.wgsl");

/// Lanes per workgroup: one llvmpipe SIMD vector.
const THREADS: u32 = 8;

/// Everything the shader is specialised on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeShape {
    pub threads: u32,
    /// Query heads an item carries (a power of two ≥ the KV group, ≤ 8).
    pub heads: u32,
    pub d4: u32,
    /// Most keys of one item (a multiple of `threads`).
    pub keys: u32,
    pub f16: bool,
    /// Bits of a quantized pool's values (8: q8_0, 4: q4_0), 0 for a float pool.
    pub kv_bits: u32,
}

impl DecodeShape {
    /// The shape for a KV group of `group` query heads of `head_dim`, or `None` when the
    /// lane-keys body does not serve it (a head size not a multiple of 4 or wider than 128, a
    /// group of more than 8 heads, more registers than the compile bound, or no run of keys
    /// fits the workgroup memory and the loop cap).
    pub fn for_device(gpu: &Gpu, head_dim: usize, dtype: KvDtype, group: usize) -> Option<Self> {
        let limit = gpu.limits().max_compute_workgroup_storage_size;
        Self::within(limit, head_dim, dtype, group)
    }

    /// [`for_device`](Self::for_device) for `limit` bytes of workgroup memory.
    pub fn within(limit: u32, head_dim: usize, dtype: KvDtype, group: usize) -> Option<Self> {
        // Whole vec4 rows, eight unrolled chunks of 4 vec4s at most, and as many q and
        // accumulator vec4s as the contiguous cache's lane-keys pass holds (its cold compile
        // grows with them: see `kernels::decode`).
        if group == 0 || group > 8 || !head_dim.is_multiple_of(4) || head_dim > 128 {
            return None;
        }
        let heads = group.next_power_of_two() as u32;
        let d4 = (head_dim / 4) as u32;
        if 2 * heads * d4 > 256 {
            return None;
        }
        let head_vecs = heads.div_ceil(4);
        // Workgroup memory, in vec4s: the scores (keys × head vecs), the lanes' states, one
        // head's accumulators of every lane.
        let fixed = 2 * head_vecs * THREADS + THREADS * d4;
        let by_memory = (limit / 16).checked_sub(fixed)? / head_vecs;
        // Loop iterations of a lane per key, counted as if nothing were unrolled; llvmpipe
        // stops an invocation's loops at 65,535 in total.
        let per_key = Self::loops_per_key(d4, heads);
        let fixed_loops = heads * (d4 * 6 + 2 * THREADS + 8) + 4096;
        let by_loops = (65_535u32.checked_sub(fixed_loops)? * 2 / 3 / per_key) * THREADS;
        let keys = (by_memory.min(by_loops) / THREADS) * THREADS;
        (keys >= THREADS).then_some(DecodeShape {
            threads: THREADS,
            heads,
            d4,
            keys,
            f16: dtype == KvDtype::F16,
            kv_bits: dtype.quant_bits(),
        })
    }
}

impl DecodeShape {
    /// A lane's loop iterations per key: the K and the V pass (a vec4 column, then every head),
    /// the scores and the weights per vec4 of heads.
    fn loops_per_key(d4: u32, heads: u32) -> u32 {
        2 * d4 * (1 + heads) + 6 * heads.div_ceil(4)
    }
}

/// The full source: the shape's constants, the pool's element type, the shared part, the
/// pool's reads (whole vec4s, or dequantized), the body.
pub fn source(shape: DecodeShape) -> String {
    let prelude = Prelude::new()
        .u32("THREADS", shape.threads)
        .u32("HEADS", shape.heads)
        .u32("DK4", shape.d4)
        .u32("KEYS", shape.keys);
    let (kv_quant, rows) = pool_reads(shape.kv_bits, vec4_rows(shape.f16));
    kv_prelude(prelude, shape.f16, shape.kv_bits).source(&[COMMON_WGSL, kv_quant, rows, WGSL])
}

/// The compiled pass of `shape` on `gpu`, bound as [`super::paged_attention::bind`] binds.
pub fn pass(gpu: &Gpu, shape: DecodeShape) -> std::sync::Arc<Pass> {
    let key = format!("paged_decode {shape:?}");
    let spec = PassSpec::main("paged_decode", slots(shape.kv_bits));
    gpu.compile(&key, &spec, || source(shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_the_loop_cap_bound_an_items_keys() {
        let s = DecodeShape::within(32 * 1024, 128, KvDtype::F32, 4).expect("d128, 4 heads");
        assert_eq!((s.heads, s.d4, s.threads), (4, 32, 8));
        assert!(s.keys.is_multiple_of(8) && s.keys >= 8);
        // A lane's keys stay within two thirds of llvmpipe's 65,535 loop iterations.
        assert!(s.keys / 8 * DecodeShape::loops_per_key(32, 4) <= 65_535 * 2 / 3);
        // The scores, states and accumulators fit the workgroup memory.
        assert!(16 * (s.keys + 2 * 8 + 8 * 32) <= 32 * 1024);
        // Groups of 3 heads take 4 slots; more than 8 heads, heads too wide or not whole
        // vec4s, or more registers than the compile bound are the tile pass's.
        assert_eq!(
            DecodeShape::within(32 * 1024, 64, KvDtype::F32, 3).map(|s| s.heads),
            Some(4)
        );
        assert_eq!(DecodeShape::within(32 * 1024, 64, KvDtype::F32, 9), None);
        assert_eq!(DecodeShape::within(32 * 1024, 256, KvDtype::F32, 1), None);
        assert_eq!(DecodeShape::within(32 * 1024, 66, KvDtype::F32, 1), None);
        assert_eq!(DecodeShape::within(32 * 1024, 128, KvDtype::F32, 8), None);
        assert!(DecodeShape::within(32 * 1024, 64, KvDtype::F32, 8).is_some());
    }
}
