//! `flash_attention`: fused scores + mask + online softmax + P·V; no `[Lq, Lk]` buffer.
//!
//! What made it faster on lavapipe: applying the mask only to key groups it can change
//! (`group_needs_mask`), one uniform branch per group rather than two per row inside the
//! unrolled loops: the fused core at B1 H8 L1024 d64 went from 2.4× to 3.1× the multi-pass
//! core's speed (`bench --only gemm`, runs before and after, no mask), and about 2.3× its own
//! speed at d16 (a probe timing `Core::Fused` alone).
//!
//! Tried and measured slower on lavapipe (so not here): blocking the kernel like the subgroup
//! GEMM (64 threads, 16 rows × 8 keys of scores and 16 rows × dv/8 output columns per thread,
//! Q and P passed round by subgroup shuffles, no K/V staging). With the online softmax and P·V
//! it took 1.3–2.4× the staged kernel's time, whether P went lane to lane by shuffles (from a
//! runtime lane, or 16 unrolled calls) or through workgroup memory; 8 rows per thread was slower
//! still. Scores alone ran at about half the GEMM's GFLOP/s, and adding only the softmax step
//! (P·V off) more than doubled the time. That step still masked every row inside the unrolled
//! loops, the cost `group_needs_mask` later removed here, so the blocked layout was never timed
//! without it and may deserve another try on that basis.
//!
//! Where the time went (tools/lavapipe_profile.py: perf samples over llvmpipe's JIT code,
//! L1024 d64, no mask): not in the multiply-adds but in per-lane scalar loads and stores
//! (`vpextrd`/`vpinsrd`/`mov`, a mask test and branch per lane) of private arrays indexed at
//! run time. llvmpipe makes *every* access of a private array a per-lane gather or scatter as
//! soon as one access anywhere has a runtime index, and Mesa unrolls a loop (making its index
//! a constant) only when its body times its trip count is small: at 16 rows none of the key
//! group's row loops unrolled, and the rolled mask, carry and output loops indexed the row
//! arrays too. Splitting only one loop, as tried once, changed nothing for that reason. What
//! the kernel does now, each step timed against the last (probe of `Core::Fused` alone, B1 H8
//! L1024 d64, interleaved runs, medians of per-run minima):
//! * the key group's row loops in pieces small enough to unroll, the loops that stay rolled on
//!   copies of the row arrays, q pre-scaled (a scale loop over 16 rows stayed rolled): 1.6x;
//! * K/V vec4s read once per subgroup and broadcast ([`subgroup_kv`]): about 1.2x;
//! * 16-key groups ([`WIDE_KEY_GROUP`]) with the row loops in quarters: 1.7x (228 → 129 ms).
//!   q and the accumulators stay gathered (indexed by the head-size vec4 of a loop too large
//!   to unroll), and a wider group spreads each gather over more keys. Writing each score
//!   vec4 out rather than looping over them gained another 1.2x.
//!
//! `bench --only gemm` then puts the fused core at 0.63-0.66x the picked GEMM's GFLOP/s
//! (timed in turn), from 0.23-0.37x.
//! What did not help (each against the kernel of its day, several interleaved runs): unrolling
//! the head-size loops by hand, dropping the `r < live_rows` checks, and turning P·V round
//! (rows outer, each row's weights read once, the group's V copied to eight register arrays
//! first): 2.5x the time. On a machine this noisy (±30-50 % between identical runs), check a
//! new layout's instruction mix with the profile tool before timing it, and time variants in
//! turn.

use std::sync::Arc;

use crate::error::Result;
use crate::gpu::pass::Slot::{Read, Uniform, Write};
use crate::gpu::pass::{Binding, Dispatch, Pass, PassSpec, Slot};
use crate::gpu::{Gpu, KernelClass};

use super::mask::MaskBuffers;
use super::source::Prelude;
use super::{head_cap, kv_spans, CoreProblem, KvChunks, QkvBuffers, RowStrides};

pub const WGSL: &str = include_str!("../../shaders/flash_attention.wgsl");
/// Every lane reads a key group's K/V vec4s from the staged tiles itself.
pub const KV_SHARED_WGSL: &str = include_str!("../../shaders/flash_kv_shared.wgsl");
/// The key-group math over staged tiles, shared with `paged_prefill`.
pub const GROUP_WGSL: &str = include_str!("../../shaders/flash_group.wgsl");
/// One lane per key reads them and a subgroup broadcast hands them round (see
/// [`subgroup_kv`]).
pub const KV_SUBGROUP_WGSL: &str = include_str!("../../shaders/flash_kv_subgroup.wgsl");
/// Q, K and V loads of float K/V, and of quantized K/V.
pub const ROWS_FLOAT_WGSL: &str = include_str!("../../shaders/flash_rows_float.wgsl");
pub const ROWS_QUANT_WGSL: &str = include_str!("../../shaders/flash_rows_quant.wgsl");

/// Threads per workgroup (`THREADS` in the shader): one 8-lane SIMD vector on a CPU adapter
/// (llvmpipe), two warps (or one AMD wave) on a GPU. Not measured on a GPU: this task had none.
pub fn threads(class: KernelClass) -> u32 {
    match class {
        KernelClass::Cpu => 8,
        KernelClass::Gpu => 64,
    }
}

/// Query rows each thread owns (`ROWS` in the shader's prelude, per device and head size); a
/// workgroup takes `rows · threads` query rows.
/// * CPU kernels on Vulkan (lavapipe): 8, halved while q and the accumulators would exceed
///   [`MAX_ROW_VEC4S`]. With the mask applied one score per iteration (see the shader), 8 rows
///   run within 10 % of 16 (`bench --only gemm`, B1 H8 L1024 d64, runs in turn: fused core
///   183–206 ms at 8 rows, 185 ms at 16; 0.69–0.70x the GEMM's GFLOP/s against 0.74x) and
///   compile in 9 s instead of 19 s; at 32 the loops no longer unroll.
/// * CPU kernels elsewhere (GL's llvmpipe): 4. The GLSL route compiles the unrolled kernel
///   very slowly (first use at d64, cold cache: 362 s at 16 rows, 140 s at 8, 65 s at 4).
/// * GPU kernels: 4, halved while q and the accumulators would exceed [`GPU_ROW_VEC4S`], so
///   that they stay in registers (1 row at d128, 2 at d64). Not measured on a GPU.
///
/// What a pipeline costs to compile cold (`bench --only compile`, lavapipe, this project's
/// 2-core machine, others at work beside it): d64 at 8 rows 7.8–9.1 s (16 rows: 19 s; 24 s
/// before the mask went per score); q/k 256 + v 512 at 2 rows 5.9–7.0 s (4 rows: 18 s; 47 s
/// while the NaN check of skipped tiles kept a flag array per head vec4, see the shader).
pub fn rows_per_thread(gpu: &Gpu, qk_head_dim: usize, v_head_dim: usize) -> u32 {
    let vulkan = gpu.info().backend == wgpu::Backend::Vulkan;
    match gpu.kernel_class() {
        KernelClass::Cpu if vulkan => {
            rows_for_head_sizes(8, MAX_ROW_VEC4S, qk_head_dim, v_head_dim)
        }
        KernelClass::Cpu => rows_for_head_sizes(4, MAX_ROW_VEC4S, qk_head_dim, v_head_dim),
        KernelClass::Gpu => rows_for_head_sizes(4, GPU_ROW_VEC4S, qk_head_dim, v_head_dim),
    }
}

/// Most vec4s of q and accumulators one GPU thread holds: 256 floats, about what a GPU keeps
/// in registers per thread before spilling.
pub const GPU_ROW_VEC4S: u32 = 64;

/// Most vec4s of q and accumulators one thread holds on a CPU adapter: 8 rows up to d128 +
/// d128. The kernel is unrolled over rows, so this bounds its compile time (lavapipe spent
/// 285 s and 3.7 GB compiling 16 rows at q/k = v = 512, 18 s for 4 rows at 256 + 512).
pub const MAX_ROW_VEC4S: u32 = 512;

/// `rows`, halved until `rows · (q/k + v vec4s)` is within `budget` (never below 1).
fn rows_for_head_sizes(rows: u32, budget: u32, qk_head_dim: usize, v_head_dim: usize) -> u32 {
    let per_row = (qk_head_dim.div_ceil(4) + v_head_dim.div_ceil(4)) as u32;
    let mut rows = rows;
    while rows > 1 && rows * per_row > budget {
        rows /= 2;
    }
    rows
}

/// Most keys per staged K/V tile (more gives no measurable gain and costs workgroup memory).
const MAX_KV_TILE: usize = 32;

/// Mirrors `FlashParams` in `flash_attention.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FlashParams {
    /// Where Q, K, V and the output rows lie.
    pub q: RowStrides,
    pub k: RowStrides,
    pub v: RowStrides,
    pub o: RowStrides,
    pub lq: u32,
    pub lk: u32,
    pub heads: u32,
    pub scale: f32,
    pub z_offset: u32,
    /// Key tiles of this dispatch: `[tile_begin, tile_end)`.
    pub tile_begin: u32,
    pub tile_end: u32,
    /// `CARRY_IN | CARRY_OUT` (see the shader); 0 for a single dispatch over all keys.
    pub carry_flags: u32,
    /// Query heads per key/value head (see [`crate::kernels::QkvLayout::kv_group`]).
    pub kv_group: u32,
    pub key_base: u32,
    /// The module's head sizes; the shader holds [`head_cap`] of each.
    pub head_dim_qk: u32,
    pub head_dim_v: u32,
    /// 1: each head's softmax includes its sink logit, read from `carry` at `sink_base`.
    pub sinks: u32,
    pub sink_base: u32,
    /// Where a quantized K's and V's scales start, in words ([`super::KvFormat`]).
    pub k_scales: u32,
    pub v_scales: u32,
}

/// Resume from the carried state (every key range but the first).
pub const CARRY_IN: u32 = 1;
/// Store the state for the next range instead of the output (every range but the last).
pub const CARRY_OUT: u32 = 2;

/// f32 values of carried state per query row: max, sum and the (vec4-padded) accumulator.
pub fn carry_stride(v_head_dim: usize) -> usize {
    2 + 4 * v_head_dim.div_ceil(4)
}

/// Key tiles per dispatch. A software rasteriser (Mesa's llvmpipe, behind lavapipe and GL here)
/// stops every loop of a shader invocation once their iterations add up to 65,535 — silently,
/// with wrong results — so on a CPU adapter a dispatch covers only as many keys as keep one
/// invocation under that count, counted as if no loop were unrolled, with half as much again
/// for safety. On GPUs ranges of 8,192 keys keep each dispatch short enough for driver watchdogs.
pub fn tiles_per_dispatch(
    qk_head_dim: usize,
    v_head_dim: usize,
    kv_tile: u32,
    rows: u32,
    threads: u32,
    software: bool,
) -> u32 {
    let keys = if software {
        let (dk4, dv4) = (qk_head_dim.div_ceil(4), v_head_dim.div_ceil(4));
        let (rows, threads) = (rows as usize, threads as usize);
        // Per key group: the score loop (dk4 × rows), the P·V loop (dv4 × rows), the mask or
        // scale loop and the softmax loop (rows × (1 + vec4s of scores) each) and the group
        // loop itself; per key: the K and V staging loops.
        let group = key_group(kv_tile) as usize;
        let score_vec4s = group / 4;
        let per_group = (dk4 + dv4) * (1 + rows) + 2 * rows * (1 + score_vec4s) + 1;
        let per_key = per_group.div_ceil(group) + (dk4 + dv4).div_ceil(threads) + 1;
        // Loading q and the carried state, writing the carry or the output, plus a margin.
        let fixed = rows * (dk4 + 6 * dv4) + 4096;
        (65_535usize.saturating_sub(fixed) * 2 / (3 * per_key)).max(kv_tile as usize)
    } else {
        8192
    };
    (keys as u32 / kv_tile).max(1)
}

/// The key-tile ranges of the dispatches for `lk` keys, with their carry flags.
pub fn key_ranges(lk: usize, kv_tile: u32, tiles_per_dispatch: u32) -> Vec<(u32, u32, u32)> {
    let tiles = (lk as u32).div_ceil(kv_tile).max(1);
    let step = tiles_per_dispatch.max(1);
    (0..tiles)
        .step_by(step as usize)
        .map(|begin| {
            let end = (begin + step).min(tiles);
            let flags =
                if begin > 0 { CARRY_IN } else { 0 } | if end < tiles { CARRY_OUT } else { 0 };
            (begin, end, flags)
        })
        .collect()
}

/// The fewest keys the kernel takes at once (`KEY_GROUP` in the shader, see [`key_group`]):
/// the fused path needs a tile of at least this many.
pub const KEY_GROUP: usize = 8;

/// The most keys the kernel takes at once, where the tile holds them: each of q's and the
/// accumulators' gathers then serves twice the keys (see the shader's header).
pub const WIDE_KEY_GROUP: usize = 16;

/// Keys per staged K/V tile for these head sizes within `workgroup_bytes` of workgroup memory
/// (the device's `max_compute_workgroup_storage_size`): whole groups of [`WIDE_KEY_GROUP`]
/// keys where that many fit, else of [`KEY_GROUP`]; `None` if not even one group fits (the
/// fused path is then unavailable; the multi-pass core runs).
pub fn kv_tile(qk_head_dim: usize, v_head_dim: usize, workgroup_bytes: u32) -> Option<u32> {
    // Rows are staged as whole vec4s of the bucketed sizes (zero-padded).
    let per_key = (head_cap(qk_head_dim).div_ceil(4) + head_cap(v_head_dim).div_ceil(4)) * 16;
    let fit = (workgroup_bytes as usize / per_key).min(MAX_KV_TILE);
    let group = if fit >= WIDE_KEY_GROUP {
        WIDE_KEY_GROUP
    } else {
        KEY_GROUP
    };
    let keys = fit / group * group;
    (keys >= KEY_GROUP).then_some(keys as u32)
}

/// Keys the kernel takes at once with a tile of `kv_tile` keys ([`kv_tile`]): 16 where the
/// tile is whole groups of 16, else 8.
pub fn key_group(kv_tile: u32) -> u32 {
    if (kv_tile as usize).is_multiple_of(WIDE_KEY_GROUP) {
        WIDE_KEY_GROUP as u32
    } else {
        KEY_GROUP as u32
    }
}

/// Everything the shader is specialised on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlashShape {
    /// The head sizes the shader is laid out for ([`head_cap`] of the module's).
    pub qk_cap: usize,
    pub v_cap: usize,
    /// Keys per staged K/V tile ([`kv_tile`]).
    pub kv_tile: u32,
    /// Query rows per thread ([`rows_per_thread`]).
    pub rows: u32,
    /// Threads per workgroup ([`threads`]).
    pub threads: u32,
    /// Q/K/V stored as f16 (scores, statistics, accumulators and output stay f32).
    pub f16: bool,
    /// A key group's K/V vec4s are read once per subgroup and broadcast ([`subgroup_kv`]).
    pub subgroup_kv: bool,
    /// Bits of a quantized K/V value (8: q8_0, 4: q4_0; `flash_rows_quant.wgsl`), 0 for
    /// float K/V (of Q's element type).
    pub kv_bits: u32,
}

/// Whether the fused pass shares K/V reads across a subgroup on this adapter: CPU kernels
/// with SUBGROUP where a workgroup (`threads` lanes) is exactly one subgroup of 8 lanes, so
/// lane l can read key l of every 8 keys. On lavapipe each lane's read of workgroup memory is
/// a separate scalar access, and this reads each K/V vec4 of a group once instead of eight
/// times: the fused core at L1024 d64 about 1.2-1.3x faster (see the module doc). GPUs read a
/// vec4 every lane wants as one broadcast access anyway.
pub fn subgroup_kv(gpu: &Gpu, threads: u32) -> bool {
    let info = gpu.info();
    gpu.kernel_class() == KernelClass::Cpu
        && gpu.has_subgroups()
        && threads == 8
        && info.subgroup_min_size == threads
        && info.subgroup_max_size == threads
}

/// The full source: a prelude with this shape's sizes and element type, the mask rule, body.
pub fn source(s: FlashShape) -> String {
    let prelude = Prelude::new()
        .u32("HEAD_CAP_QK", s.qk_cap as u32)
        .u32("HEAD_CAP_V", s.v_cap as u32)
        .u32("KV_TILE", s.kv_tile)
        .u32("KEY_GROUP", key_group(s.kv_tile))
        .u32("ROWS", s.rows)
        .u32("THREADS", s.threads)
        .u32("CARRY_IN", CARRY_IN)
        .u32("CARRY_OUT", CARRY_OUT)
        .u32("KV_BITS", s.kv_bits)
        .elem("QkvElem", s.f16);
    let (kv_quant, rows) = match s.kv_bits {
        0 => ("", ROWS_FLOAT_WGSL),
        _ => (super::KV_QUANT_WGSL, ROWS_QUANT_WGSL),
    };
    let kv = if s.subgroup_kv {
        KV_SUBGROUP_WGSL
    } else {
        KV_SHARED_WGSL
    };
    super::mask::prelude(prelude).source(&[
        super::ROWS_WGSL,
        super::mask::WGSL,
        kv,
        GROUP_WGSL,
        WGSL,
        kv_quant,
        rows,
    ])
}

/// Bindings: params, Q, K, V, output, carried state (and sinks), mask words, mask params:
/// 6 storage buffers, the most any pass binds (see [`crate::gpu::PATH_NEEDS`]).
pub(crate) const SLOTS: &[Slot] = &[
    Uniform(0),
    Read(1),
    Read(2),
    Read(3),
    Write(4),
    Write(5),
    Read(6),
    Uniform(7),
];

/// A carry buffer for the pass: room for `state` floats of carried state (or a decode pass's
/// partials, where one buffer serves both), then — with `sinks` — one logit per query head at
/// its very end, where the pass reads them ([`sink_base`]). The sinks ride in the carry
/// binding so that the pass binds 6 storage buffers, not 7; nothing writes past `state`.
pub fn carry_buffer(
    gpu: &Gpu,
    label: &str,
    state: usize,
    sinks: Option<&[f32]>,
    extra: wgpu::BufferUsages,
) -> wgpu::Buffer {
    match sinks {
        None => gpu.storage(label, 4 * state as u64, extra),
        Some(logits) => {
            let len = crate::gpu::buffers::padded_size(4 * (state + logits.len()) as u64) / 4;
            let mut data = vec![0.0f32; len as usize - logits.len()];
            data.extend_from_slice(logits);
            gpu.upload(label, &data, extra)
        }
    }
}

/// Element index of the first sink logit in a [`carry_buffer`] made for `heads` query heads.
pub fn sink_base(carry: &wgpu::Buffer, heads: usize) -> u32 {
    (carry.size() / 4).saturating_sub(heads as u64) as u32
}

/// Bytes of a [`carry_buffer`] free for carried state (or partials): all but the sinks.
pub fn state_bytes(carry: &wgpu::Buffer, heads: usize, sinks: bool) -> u64 {
    match sinks {
        true => 4 * sink_base(carry, heads) as u64,
        false => carry.size(),
    }
}

/// What the pass reads and writes.
pub struct FlashBuffers<'a> {
    /// Head-split Q, K and V at the problem's offsets.
    pub qkv: QkvBuffers<'a>,
    /// Combined heads `[B, Lq, H·dv]`.
    pub out: &'a wgpu::Buffer,
    /// Running state between key ranges ([`Flash::carry_len`] floats; any buffer when the
    /// problem runs as one dispatch), made by [`carry_buffer`] (with the sinks, if any).
    pub carry: &'a wgpu::Buffer,
    pub mask: &'a MaskBuffers,
    /// A KV cache's K/V chunks, read in place of `qkv.k` and `qkv.v`.
    pub chunks: Option<KvChunks<'a>>,
    /// Whether each head's softmax includes its sink logit, held at the end of `carry`
    /// (see [`carry_buffer`]).
    pub sinks: bool,
}

/// The fused pass of one module's head sizes on one device: its pipeline, its tile and how
/// many key tiles one dispatch may cover.
#[derive(Debug, Clone)]
pub struct Flash {
    pass: Arc<Pass>,
    shape: FlashShape,
    tiles_per_dispatch: u32,
}

impl Flash {
    /// `None` when not even one group of [`KEY_GROUP`] keys fits the device's workgroup memory
    /// at these head sizes (the multi-pass core runs instead).
    pub fn new(gpu: &Gpu, qk_head_dim: usize, v_head_dim: usize, f16: bool) -> Option<Self> {
        let workgroup_bytes = gpu.limits().max_compute_workgroup_storage_size;
        let threads = threads(gpu.kernel_class());
        let (qk_cap, v_cap) = (head_cap(qk_head_dim), head_cap(v_head_dim));
        let shape = FlashShape {
            qk_cap,
            v_cap,
            kv_tile: kv_tile(qk_cap, v_cap, workgroup_bytes)?,
            rows: rows_per_thread(gpu, qk_cap, v_cap),
            threads,
            f16,
            subgroup_kv: subgroup_kv(gpu, threads),
            kv_bits: 0,
        };
        // The loop cap is the software rasteriser's, whichever kernels it runs.
        let software = super::is_software(gpu);
        let tiles_per_dispatch = tiles_per_dispatch(
            qk_cap,
            v_cap,
            shape.kv_tile,
            shape.rows,
            shape.threads,
            software,
        );
        let key = format!("flash_attention {shape:?}");
        // Runtime bounds checks stay on: without them lavapipe took about twice as long (L1024
        // d64, three interleaved runs each; why was not found).
        let spec = PassSpec::main("flash_attention", SLOTS);
        let pass = gpu.compile(&key, &spec, || source(shape));
        Some(Flash {
            pass,
            shape,
            tiles_per_dispatch,
        })
    }

    /// The key-tile ranges of the dispatches for `lk` keys.
    pub fn key_ranges(&self, lk: usize) -> Vec<(u32, u32, u32)> {
        key_ranges(lk, self.shape.kv_tile, self.tiles_per_dispatch)
    }

    /// Keys per staged tile.
    pub fn kv_tile(&self) -> u32 {
        self.shape.kv_tile
    }

    /// Most keys one dispatch covers.
    pub fn keys_per_dispatch(&self) -> usize {
        (self.shape.kv_tile * self.tiles_per_dispatch) as usize
    }

    /// Floats of carried state a problem needs (0 when it runs as one dispatch).
    pub fn carry_len(&self, c: &CoreProblem) -> usize {
        if self.key_ranges(c.lk).len() > 1 {
            c.batch * c.heads * c.lq * carry_stride(c.v_head_dim)
        } else {
            0
        }
    }

    /// One dispatch per key range, each of `ceil(Lq / (rows · threads))` × (batch·heads)
    /// workgroups.
    pub fn dispatches(
        &self,
        gpu: &Gpu,
        c: &CoreProblem,
        b: &FlashBuffers,
    ) -> Result<Vec<Dispatch>> {
        let groups = [
            (c.lq as u32).div_ceil(self.shape.rows * self.shape.threads),
            c.batch_heads(),
            1,
        ];
        let [words, mask_params] = b.mask.bindings();
        let tiles = (c.lk as u32).div_ceil(self.shape.kv_tile).max(1);
        // Quantized K/V: the same shape reading blocks (compiled once per device).
        let kv = c.layout.kv;
        let pass = match kv.dtype.quant_bits() {
            0 => self.pass.clone(),
            bits => {
                let shape = FlashShape {
                    kv_bits: bits,
                    ..self.shape
                };
                let key = format!("flash_attention {shape:?}");
                let spec = PassSpec::main("flash_attention", SLOTS);
                gpu.compile(&key, &spec, || source(shape))
            }
        };
        let mut chain = Vec::new();
        for span in kv_spans(&b.qkv, b.chunks, c.lk, &c.layout.ranges) {
            let r = &c.layout.ranges;
            let buffers = [
                (1, Binding::new(b.qkv.q, r.q)),
                (2, span.k),
                (3, span.v),
                (4, Binding::new(b.out, r.out)),
                (5, b.carry.into()),
                (words.0, words.1.into()),
                (mask_params.0, mask_params.1.into()),
            ];
            // A chunk's keys start on a tile (the cache sizes chunks so); its key ranges
            // carry in unless they are the first of all, out unless the last.
            let first_tile = span.key_base as u32 / self.shape.kv_tile;
            let span_tiles = (span.key_end as u32)
                .div_ceil(self.shape.kv_tile)
                .max(first_tile + 1)
                - first_tile;
            for (begin, end, _) in key_ranges(
                (span_tiles * self.shape.kv_tile) as usize,
                self.shape.kv_tile,
                self.tiles_per_dispatch,
            ) {
                let (tile_begin, tile_end) = (first_tile + begin, first_tile + end);
                let carry_flags = if tile_begin > 0 { CARRY_IN } else { 0 }
                    | if tile_end < tiles { CARRY_OUT } else { 0 };
                let p = FlashParams {
                    lq: c.lq as u32,
                    lk: c.lk as u32,
                    heads: c.heads as u32,
                    scale: c.scale,
                    q: c.layout.q,
                    k: c.layout.k,
                    v: c.layout.v,
                    o: c.layout.out,
                    z_offset: 0,
                    tile_begin,
                    tile_end,
                    carry_flags,
                    kv_group: c.layout.kv_group,
                    key_base: span.key_base as u32,
                    head_dim_qk: c.qk_head_dim as u32,
                    head_dim_v: c.v_head_dim as u32,
                    sinks: b.sinks as u32,
                    sink_base: sink_base(b.carry, c.heads),
                    k_scales: kv.k_scales,
                    v_scales: kv.v_scales,
                };
                chain.push(Dispatch::new(gpu, pass.clone(), &p, &buffers, groups)?);
            }
        }
        Ok(chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ranges_cover_every_tile_once_with_carry_flags() {
        // 100 keys in tiles of 8: 13 tiles, 5 per dispatch.
        let r = key_ranges(100, 8, 5);
        assert_eq!(
            r,
            vec![
                (0, 5, CARRY_OUT),
                (5, 10, CARRY_IN | CARRY_OUT),
                (10, 13, CARRY_IN)
            ]
        );
        // Exactly one dispatch's worth, and one key past it.
        assert_eq!(key_ranges(40, 8, 5), vec![(0, 5, 0)]);
        assert_eq!(key_ranges(41, 8, 5).len(), 2);
        // No keys still makes one (empty) range.
        assert_eq!(key_ranges(0, 8, 5), vec![(0, 1, 0)]);
    }

    #[test]
    fn tiles_per_dispatch_keeps_software_invocations_under_the_loop_cap() {
        let software = tiles_per_dispatch(64, 64, 32, 16, 8, true);
        let gpu = tiles_per_dispatch(64, 64, 32, 16, 8, false);
        assert_eq!(gpu, 8192 / 32);
        assert!(software >= 1 && software < gpu, "{software}");
        // Wider heads and more rows per thread mean fewer keys per dispatch.
        assert!(tiles_per_dispatch(256, 512, 8, 16, 8, true) * 8 < software * 32);
        assert!(tiles_per_dispatch(64, 64, 32, 4, 8, true) >= software);
        // At least one tile, however large the head.
        assert_eq!(tiles_per_dispatch(100_000, 100_000, 8, 16, 8, true), 1);
    }

    #[test]
    fn wide_heads_get_fewer_rows_per_thread() {
        // d128 + d128 = 64 vec4s per row: 8 rows are exactly the budget, one float more is not.
        assert_eq!(rows_for_head_sizes(8, MAX_ROW_VEC4S, 64, 64), 8);
        assert_eq!(rows_for_head_sizes(8, MAX_ROW_VEC4S, 128, 128), 8);
        assert_eq!(rows_for_head_sizes(8, MAX_ROW_VEC4S, 128, 132), 4);
        assert_eq!(rows_for_head_sizes(8, MAX_ROW_VEC4S, 256, 512), 2);
        assert_eq!(rows_for_head_sizes(8, MAX_ROW_VEC4S, 512, 512), 2);
        assert_eq!(rows_for_head_sizes(4, MAX_ROW_VEC4S, 512, 512), 2);
        assert_eq!(rows_for_head_sizes(4, MAX_ROW_VEC4S, 1024, 1024), 1);
        assert_eq!(rows_for_head_sizes(4, MAX_ROW_VEC4S, 1 << 20, 1 << 20), 1);
    }

    #[test]
    fn kv_tile_is_whole_key_groups_within_workgroup_memory() {
        // d64 + d64 = 32 vec4s = 512 bytes per key: 32 KiB holds 64, capped at 32.
        assert_eq!(kv_tile(64, 64, 32 * 1024), Some(32));
        // 1,024 floats per key (4 KiB): 8 keys fit exactly into 32 KiB; one float more does not.
        assert_eq!(kv_tile(512, 512, 32 * 1024), Some(8));
        assert_eq!(kv_tile(512, 516, 32 * 1024), None);
        // Small heads are staged at their bucket, 16: 128 bytes per key at (3, 5).
        assert_eq!(kv_tile(3, 5, 8 * 128 - 1), None);
        assert_eq!(kv_tile(3, 5, 8 * 128), Some(8));
        // Groups of 16 once 16 keys fit, never a tile of 24.
        assert_eq!(kv_tile(3, 5, 16 * 128 - 1), Some(8));
        assert_eq!(kv_tile(3, 5, 16 * 128), Some(16));
        assert_eq!(kv_tile(3, 5, 31 * 128), Some(16));
        for (tile, group) in [(8, 8), (16, 16), (32, 16)] {
            assert_eq!(key_group(tile), group);
        }
    }

    #[test]
    fn carry_stride_is_max_sum_and_a_vec4_padded_accumulator() {
        assert_eq!(carry_stride(64), 66);
        assert_eq!(carry_stride(5), 2 + 8);
    }
}
