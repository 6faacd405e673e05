//! `flash_attention`: fused scores + mask + online softmax + P·V; no `[Lq, Lk]` buffer.

use std::sync::Arc;

use crate::gpu::Gpu;

use super::{MaskParams, Pass, Slot, MASK_WGSL};

pub const WGSL: &str = include_str!("../../shaders/flash_attention.wgsl");

/// Threads per workgroup (`THREADS` in the shader): one 8-lane SIMD vector on llvmpipe.
pub const THREADS: u32 = 8;

/// Query rows each thread owns (`ROWS` in the shader, rewritten per device); a workgroup takes
/// `rows · THREADS` query rows.
/// * Vulkan on a CPU (lavapipe): 16. Measured at L=1024 d64 against the multi-pass core in one
///   run: 16 rows 2.5×, 8 rows 2.1×, 4 rows 1.6×; at 32 the loops no longer unroll.
/// * Everything else: 4. On GL's llvmpipe the GLSL route compiles the unrolled kernel very
///   slowly (first use at d64, cold cache: 362 s at 16 rows, 140 s at 8, 65 s at 4); on GPUs
///   fewer rows keep q and the accumulators (2 · rows · head size floats) in registers. Not
///   measured on a GPU: this task had none.
pub fn rows_per_thread(gpu: &Gpu) -> u32 {
    let info = gpu.info();
    if info.backend == wgpu::Backend::Vulkan && info.device_type == wgpu::DeviceType::Cpu {
        16
    } else {
        4
    }
}

/// Most keys per staged K/V tile (more gives no measurable gain and costs workgroup memory).
const MAX_KV_TILE: usize = 32;

/// Mirrors `FlashParams` in `flash_attention.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FlashParams {
    pub lq: u32,
    pub lk: u32,
    pub heads: u32,
    pub scale: f32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub z_offset: u32,
    pub kv_stride: u32,
    /// Key tiles of this dispatch: `[tile_begin, tile_end)`.
    pub tile_begin: u32,
    pub tile_end: u32,
    /// `CARRY_IN | CARRY_OUT` (see the shader); 0 for a single dispatch over all keys.
    pub carry_flags: u32,
    pub mask: MaskParams,
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
    software: bool,
) -> u32 {
    let keys = if software {
        let (dk4, dv4) = (qk_head_dim.div_ceil(4), v_head_dim.div_ceil(4));
        let (rows, threads) = (rows as usize, THREADS as usize);
        // Per key group: the score loop (dk4 × rows), the softmax loop (rows), the P·V loop
        // (dv4 × rows) and the group loop itself; per key: the K and V staging loops.
        let per_group = (dk4 + dv4) * (1 + rows) + rows + 1;
        let per_key = per_group.div_ceil(KEY_GROUP) + (dk4 + dv4).div_ceil(threads) + 1;
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

/// Keys the kernel takes at once: a row's scores for them are two vec4s.
pub const KEY_GROUP: usize = 8;

/// Keys per staged K/V tile for these head sizes within `workgroup_bytes` of workgroup memory
/// (the device's `max_compute_workgroup_storage_size`): a multiple of [`KEY_GROUP`], or `None`
/// if not even one group fits (the fused path is then unavailable; the multi-pass core runs).
pub fn kv_tile(qk_head_dim: usize, v_head_dim: usize, workgroup_bytes: u32) -> Option<u32> {
    // Rows are staged as whole vec4s (zero-padded).
    let per_key = (qk_head_dim.div_ceil(4) + v_head_dim.div_ceil(4)) * 16;
    let keys = (workgroup_bytes as usize / per_key).min(MAX_KV_TILE) / KEY_GROUP * KEY_GROUP;
    (keys >= KEY_GROUP).then_some(keys as u32)
}

/// The shader with its head sizes baked in (they are fixed per module, and WGSL needs
/// constant sizes for the per-thread q and accumulator arrays).
pub fn source(qk_head_dim: usize, v_head_dim: usize, kv_tile: u32, rows: u32) -> String {
    let body = WGSL
        .replace(
            "const HEAD_DIM_QK: u32 = 64u;",
            &format!("const HEAD_DIM_QK: u32 = {qk_head_dim}u;"),
        )
        .replace(
            "const HEAD_DIM_V: u32 = 64u;",
            &format!("const HEAD_DIM_V: u32 = {v_head_dim}u;"),
        )
        .replace(
            "const KV_TILE: u32 = 32u;",
            &format!("const KV_TILE: u32 = {kv_tile}u;"),
        )
        .replace(
            "const ROWS: u32 = 16u;",
            &format!("const ROWS: u32 = {rows}u;"),
        );
    format!("{MASK_WGSL}\n{body}")
}

/// [`source`] reading f16 Q/K/V (`array<f16>`, widened to f32 in `row_elem`); scores,
/// softmax statistics, the accumulator and the output stay f32. Needs `SHADER_F16`.
pub fn source_f16(qk_head_dim: usize, v_head_dim: usize, kv_tile: u32, rows: u32) -> String {
    let body = source(qk_head_dim, v_head_dim, kv_tile, rows)
        .replace(
            "var<storage, read> qkv: array<f32>;",
            "var<storage, read> qkv: array<f16>;",
        )
        .replace("return qkv[base + d];", "return f32(qkv[base + d]);");
    format!("enable f16;\n{body}")
}

/// Bindings: params, Q|K|V, output, carried state, mask words.
const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Write(4),
    Slot::Write(5),
    Slot::Read(6),
];

/// The pass for these head sizes (f16 Q/K/V when `f16`), compiled once per device.
/// Runtime bounds checks stay on: measured no faster without them on lavapipe.
pub(crate) fn pass(
    gpu: &Gpu,
    qk_head_dim: usize,
    v_head_dim: usize,
    kv_tile: u32,
    f16: bool,
) -> Arc<Pass> {
    let (dk, dv) = (qk_head_dim, v_head_dim);
    let rows = rows_per_thread(gpu);
    let precision = if f16 { "f16" } else { "f32" };
    gpu.pass(
        &format!("flash_attention {precision} dk={dk} dv={dv} tile={kv_tile} rows={rows}"),
        || {
            let source = if f16 {
                source_f16(dk, dv, kv_tile, rows)
            } else {
                source(dk, dv, kv_tile, rows)
            };
            Pass::new(gpu.device(), "flash_attention", &source, SLOTS)
        },
    )
}

/// One workgroup per `rows · THREADS` query rows (`rows` = [`rows_per_thread`] of the device
/// the pass was built for) per (batch, head) of the dispatch.
pub fn workgroups(p: &FlashParams, batch_heads: u32, rows: u32) -> [u32; 3] {
    [p.lq.div_ceil(rows * THREADS), batch_heads, 1]
}
