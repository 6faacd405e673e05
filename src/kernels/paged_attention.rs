//! `paged_attention`: ragged query rows attending over the pages of a KV pool, one workgroup
//! per work item of a [`crate::serve::BatchAttention`] plan (see `shaders/paged_attention.wgsl`).
//! This module owns the pass's shape (threads, query slots and keys per staged tile, chosen
//! per adapter class and fitted to the device's workgroup memory), its parameters, bindings and
//! dispatch geometry; the plan owns the work list.

use crate::error::{Error, Result};
use crate::gpu::pass::{Pass, PassSpec, Slot};
use crate::gpu::{Gpu, KernelClass};
use crate::kernels::source::Prelude;
use crate::kv_dtype::KvDtype;

pub const WGSL: &str = include_str!("../../shaders/paged_attention.wgsl");
/// Parameters, bindings and pool addressing shared with `paged_decode`.
pub const COMMON_WGSL: &str = include_str!("../../shaders/paged_common.wgsl");
/// The pool's binding, its rows read element by element (any head size).
pub const ROWS_SCALAR_WGSL: &str = include_str!("../../shaders/paged_rows_scalar.wgsl");
/// The pool's binding, its rows read as whole vec4s (head sizes that are multiples of 4).
pub const ROWS_VEC4_WGSL: &str = include_str!("../../shaders/paged_rows_vec4.wgsl");
/// An f16 pool's binding, its rows read as whole vec4s of two u32 words each (head sizes that
/// are multiples of 4): half the loads of `vec4<f16>` on llvmpipe.
pub const ROWS_HALF_WGSL: &str = include_str!("../../shaders/paged_rows_half.wgsl");
/// A quantized pool's binding and its format's, its rows dequantized from q8_0 / q4_0 words.
pub const ROWS_QUANT_WGSL: &str = include_str!("../../shaders/paged_rows_quant.wgsl");

/// u32 words per work item in the plan buffer (mirrors `ITEM_WORDS`).
pub const ITEM_WORDS: usize = 12;
/// u32 words per sequence in the plan buffer (mirrors `SEQ_WORDS`).
pub const SEQ_WORDS: usize = 4;
/// `window_left` when there is no window (mirrors `NO_WINDOW`).
pub const NO_WINDOW: u32 = u32::MAX;
/// A work item whose keys were not split writes the final row (mirrors `DIRECT`).
pub const DIRECT: u32 = u32::MAX;

/// Mirrors `PagedParams` in `paged_attention.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PagedParams {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub page_size: u32,
    pub hnd: u32,
    pub causal: u32,
    pub window_left: u32,
    pub flags: u32,
    pub scale: f32,
    pub softcap: f32,
    pub groups_x: u32,
    pub items: u32,
    pub seqs_at: u32,
    pub indices_at: u32,
    pub heads_at: u32,
    pub partial_rows: u32,
    pub q_offset: u32,
    pub q_row: u32,
    pub q_head: u32,
    pub page_shift: u32,
    /// The dispatch's first item in the work list.
    pub item_base: u32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

/// `PagedParams::flags` bits.
pub const FLAG_SINKS: u32 = 1;
pub const FLAG_ALIBI: u32 = 2;
pub const FLAG_LSE: u32 = 4;

/// Everything the shader is specialised on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PagedShape {
    pub threads: u32,
    /// (query row, head) pairs one workgroup carries; divides `threads`.
    pub slots: u32,
    /// Keys staged per tile.
    pub key_tile: u32,
    /// vec4s of a head (K and V share the head size in a pool).
    pub d4: u32,
    pub f16: bool,
    /// Bits of a quantized pool's values (8: q8_0, 4: q4_0), 0 for a float pool.
    pub kv_bits: u32,
}

impl PagedShape {
    /// The shape for `head_dim` on `gpu`: 64 threads and 16 slots on GPUs, 8 and 8 on a CPU
    /// adapter (one SIMD vector) — fewer slots when no work item fills them (`busy_slots`: the
    /// most (row, head) pairs any item has, e.g. a decode batch's query heads per KV head), so
    /// that the threads of empty slots share the busy ones' columns instead of idling — then
    /// halving the tile and the slots until the workgroup memory fits. `Err(Unsupported)` when
    /// not even one slot and 4 keys fit.
    pub fn for_device(
        gpu: &Gpu,
        head_dim: usize,
        dtype: KvDtype,
        busy_slots: usize,
    ) -> Result<Self> {
        let (f16, kv_bits) = (dtype == KvDtype::F16, dtype.quant_bits());
        let (threads, most_slots, mut key_tile) = match gpu.kernel_class() {
            KernelClass::Gpu => (64, 16, 32),
            KernelClass::Cpu => (8, 8, 16),
        };
        let mut slots = (busy_slots.max(1).next_power_of_two() as u32).min(most_slots);
        let d4 = head_dim.div_ceil(4) as u32;
        let limit = gpu.limits().max_compute_workgroup_storage_size;
        loop {
            let shape = PagedShape {
                threads,
                slots,
                key_tile,
                d4,
                f16,
                kv_bits,
            };
            if shape.workgroup_bytes() <= limit {
                return Ok(shape);
            }
            if key_tile > 4 {
                key_tile /= 2;
            } else if slots > 1 {
                slots /= 2;
            } else {
                return Err(Error::Unsupported {
                    adapter: gpu.describe(),
                    what: format!(
                        "paged attention at head size {head_dim}: one query and 4 keys need {} \
                         bytes of workgroup memory, the device has {limit}",
                        shape.workgroup_bytes()
                    ),
                });
            }
        }
    }

    /// Workgroup memory the shader declares: q, K and V tiles and the slots' accumulators, of
    /// vec4s; then scores, 5 words per slot (running max, sum, rescale, position, head) and
    /// one per key of a tile (where its row starts).
    pub fn workgroup_bytes(&self) -> u32 {
        let vec4s = 2 * self.slots * self.d4 + 2 * self.key_tile * self.d4;
        16 * vec4s + 4 * (self.slots * self.key_tile + 5 * self.slots + self.key_tile)
    }

    /// (slot, vec4 column) pairs of the accumulators each thread updates per tile.
    fn acc_per_thread(&self) -> u32 {
        (self.slots * self.d4).div_ceil(self.threads)
    }

    /// Most keys one work item may cover. On a CPU adapter, llvmpipe stops an invocation's
    /// loops after 65,535 iterations in total (silently), so a chunk is held to two thirds of
    /// that, counted as if no loop were unrolled; on GPUs 8,192 keys keep a workgroup short
    /// enough for driver watchdogs. A whole number of tiles either way.
    pub fn max_chunk_keys(&self, software: bool) -> u32 {
        if !software {
            return 8192;
        }
        let (t, s, kt, d4) = (self.threads, self.slots, self.key_tile, self.d4);
        let per_tile = (kt * d4 * 4).div_ceil(t)
            + (s * kt).div_ceil(t) * (1 + d4)
            + 3 * kt
            + self.acc_per_thread() * (1 + kt)
            + 8;
        let fixed = 2 * (s * d4).div_ceil(t) + self.acc_per_thread() * 5 + 4096;
        let tiles = (65_535u32.saturating_sub(fixed) * 2 / 3 / per_tile).max(1);
        tiles * kt
    }
}

/// The full source: the shape's constants, the pool's element type, the pool's reads
/// (element by element, or dequantized), then the body.
pub fn source(shape: PagedShape) -> String {
    let prelude = Prelude::new()
        .u32("THREADS", shape.threads)
        .u32("SLOTS", shape.slots)
        .u32("KEY_TILE", shape.key_tile)
        .u32("DK4", shape.d4)
        .u32("DV4", shape.d4);
    let (kv_quant, rows) = pool_reads(shape.kv_bits, ROWS_SCALAR_WGSL);
    kv_prelude(prelude, shape.f16, shape.kv_bits).source(&[COMMON_WGSL, kv_quant, rows, WGSL])
}

/// The pool's element type (`KvElem`) and quant bits (`KV_BITS`) in a paged pass's prelude.
pub(crate) fn kv_prelude(prelude: Prelude, f16: bool, kv_bits: u32) -> Prelude {
    prelude.u32("KV_BITS", kv_bits).elem("KvElem", f16)
}

/// The rows snippet of a float pool whose head size is a multiple of 4.
pub(crate) fn vec4_rows(f16: bool) -> &'static str {
    match f16 {
        true => ROWS_HALF_WGSL,
        false => ROWS_VEC4_WGSL,
    }
}

/// The snippets that read a pool's rows: `float_rows` for a float pool; the dequantizing
/// ones for a quantized pool (`kv_bits` 8 or 4).
pub(crate) fn pool_reads(kv_bits: u32, float_rows: &'static str) -> (&'static str, &'static str) {
    match kv_bits {
        0 => ("", float_rows),
        _ => (super::KV_QUANT_WGSL, ROWS_QUANT_WGSL),
    }
}

/// The binding slots of the paged passes over a float pool (`paged_decode` and
/// `paged_prefill` bind as this one does): [`QUANT_SLOTS`] but the last.
pub const SLOTS: &[Slot] = QUANT_SLOTS.split_at(QUANT_SLOTS.len() - 1).0;

/// [`SLOTS`] and, for a quantized pool, its format's uniform (binding 7).
pub const QUANT_SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Read(2),
    Slot::Read(3),
    Slot::Write(4),
    Slot::Write(5),
    Slot::Write(6),
    Slot::Uniform(7),
];

/// The slots of a paged pass over a pool of `kv_bits`-bit quants (0: floats).
pub fn slots(kv_bits: u32) -> &'static [Slot] {
    match kv_bits {
        0 => SLOTS,
        _ => QUANT_SLOTS,
    }
}

/// The compiled pass of `shape` on `gpu` (shared by every plan of that shape).
pub fn pass(gpu: &Gpu, shape: PagedShape) -> std::sync::Arc<Pass> {
    let key = format!("paged_attention {shape:?}");
    let spec = PassSpec::main("paged_attention", slots(shape.kv_bits));
    gpu.compile(&key, &spec, || source(shape))
}

/// Workgroups for `items` work items, one each, over x then y.
pub fn workgroups(gpu: &Gpu, items: usize) -> Result<[u32; 3]> {
    let max = gpu.limits().max_compute_workgroups_per_dimension as usize;
    let x = items.clamp(1, max);
    let groups = [x as u32, items.div_ceil(x).max(1) as u32, 1];
    gpu.check_workgroups("paged_attention", groups)?;
    Ok(groups)
}

/// The buffers one dispatch binds, by slot.
pub struct PagedBindings<'a> {
    pub params: &'a wgpu::Buffer,
    pub q: &'a wgpu::Buffer,
    pub pool: &'a wgpu::Buffer,
    pub plan: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    pub lse: &'a wgpu::Buffer,
    pub scratch: &'a wgpu::Buffer,
    /// A quantized pool's format uniform (`PoolFormat`), bound by the quantized passes only.
    pub pool_format: &'a wgpu::Buffer,
}

/// The bind group of one run (`quantized`: the pass reads a quantized pool).
pub fn bind(gpu: &Gpu, pass: &Pass, b: &PagedBindings, quantized: bool) -> Result<wgpu::BindGroup> {
    let mut buffers = vec![
        (0, b.params.into()),
        (1, b.q.into()),
        (2, b.pool.into()),
        (3, b.plan.into()),
        (4, b.out.into()),
        (5, b.lse.into()),
        (6, b.scratch.into()),
    ];
    if quantized {
        buffers.push((7, b.pool_format.into()));
    }
    pass.bind(gpu.device(), &buffers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(threads: u32, slots: u32, key_tile: u32, d4: u32) -> PagedShape {
        PagedShape {
            threads,
            slots,
            key_tile,
            d4,
            f16: false,
            kv_bits: 0,
        }
    }

    #[test]
    fn workgroup_memory_counts_every_array() {
        // d128: q and accumulators 2·8·32 + K, V 2·16·32 vec4s = 1,536 vec4s; scores 128,
        // slot state 40 and key rows 16 words.
        assert_eq!(shape(8, 8, 16, 32).workgroup_bytes(), 16 * 1536 + 4 * 184);
    }

    #[test]
    fn chunks_keep_software_invocations_under_the_loop_cap() {
        let cpu = shape(8, 8, 16, 32);
        let keys = cpu.max_chunk_keys(true);
        assert!(keys >= 16 && keys.is_multiple_of(16), "{keys}");
        assert!(keys < cpu.max_chunk_keys(false));
        // Wider heads: fewer keys per chunk.
        assert!(shape(8, 8, 16, 64).max_chunk_keys(true) < keys);
        // Never below one tile.
        assert_eq!(shape(8, 8, 4, 100_000).max_chunk_keys(true), 4);
    }

    #[test]
    fn every_thread_shares_the_accumulators() {
        assert_eq!(shape(64, 16, 32, 32).acc_per_thread(), 8);
        assert_eq!(shape(8, 8, 16, 32).acc_per_thread(), 32);
        assert_eq!(shape(8, 1, 16, 1).acc_per_thread(), 1);
    }
}
