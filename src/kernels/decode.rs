//! `decode_attention` + `decode_reduce`: the attention core for a few query rows per sequence
//! (decoding), split over keys. Each workgroup scores one range of keys of one (batch,
//! key/value head) for every query row that reads that head, so under GQA a group's query
//! heads read their K/V once; a reduce pass combines the ranges in a fixed order. Same masks,
//! same −1e9 rule and the same NaN for an all −inf row as the other paths.

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::mask::MaskBuffers;
use crate::kernels::source::Prelude;
use crate::kernels::{CoreProblem, QkvBuffers};

pub const WGSL: &str = include_str!("../../shaders/decode_attention.wgsl");
pub const REDUCE_WGSL: &str = include_str!("../../shaders/decode_reduce.wgsl");

/// Threads per workgroup: each scores one key of a tile.
pub const THREADS: u32 = 64;
/// Most query rows one workgroup serves: `kv_group · Lq` (GQA group × the step's rows).
pub const MAX_ROWS: usize = 8;
/// Widest head the pass takes: one V vec4 column per thread at most.
pub const MAX_HEAD_DIM: usize = 4 * THREADS as usize;
/// Keys per split. It bounds one invocation's loop iterations (about 1,400 per tile of 64
/// keys at 8 rows and d = 128, so 8 tiles stay far under a software rasteriser's 65,535) and
/// gives a long context many workgroups.
pub const KEYS_PER_SPLIT: usize = 512;

/// Whether the decode pass serves `lq` query rows per (batch, head) of a module with
/// `kv_group` query heads per key/value head and these head sizes: few enough rows per
/// key/value head, heads narrow enough.
pub fn serves(kv_group: usize, lq: usize, qk_head_dim: usize, v_head_dim: usize) -> bool {
    let rows = kv_group * lq;
    (1..=MAX_ROWS).contains(&rows) && qk_head_dim <= MAX_HEAD_DIM && v_head_dim <= MAX_HEAD_DIM
}

/// Floats of per-split state for `rows` query rows (B·H·Lq) over `lk` keys of `v_head_dim`.
pub fn partials_for(rows: usize, lk: usize, v_head_dim: usize) -> usize {
    splits(lk) * rows * (2 + 4 * v_head_dim.div_ceil(4))
}

/// Key ranges for `lk` keys.
pub fn splits(lk: usize) -> usize {
    lk.div_ceil(KEYS_PER_SPLIT).max(1)
}

/// Floats of per-split state (`partials`) a problem needs: per query row and split, its max,
/// sum and accumulator.
pub fn partials_len(c: &CoreProblem) -> usize {
    partials_for(c.batch * c.heads * c.lq, c.lk, c.v_head_dim)
}

/// Mirrors `DecodeParams` in `decode_attention.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DecodeParams {
    pub lq: u32,
    pub lk: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub kv_group: u32,
    pub scale: f32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub kv_stride: u32,
    pub keys_per_split: u32,
    pub splits: u32,
}

/// Mirrors `ReduceParams` in `decode_reduce.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ReduceParams {
    pub rows: u32,
    pub lq: u32,
    pub heads: u32,
    pub splits: u32,
    pub groups_x: u32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

/// The shape one decode pipeline is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeShape {
    pub qk_head_dim: usize,
    pub v_head_dim: usize,
    /// Rows per workgroup, a power of two ≥ `kv_group · Lq`.
    pub rows: usize,
    pub f16: bool,
}

/// The full source: sizes and element type, the mask rule, the body.
pub fn source(s: DecodeShape) -> String {
    let prelude = Prelude::new()
        .u32("HEAD_DIM_QK", s.qk_head_dim as u32)
        .u32("HEAD_DIM_V", s.v_head_dim as u32)
        .u32("ROWS", s.rows as u32)
        .u32("THREADS", THREADS)
        .elem("QkvElem", s.f16);
    super::mask::prelude(prelude).source(&[super::mask::WGSL, WGSL])
}

/// The reduce pass's source for values of `v_head_dim`.
pub fn reduce_source(v_head_dim: usize) -> String {
    Prelude::new()
        .u32("HEAD_DIM_V", v_head_dim as u32)
        .source(&[REDUCE_WGSL])
}

const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Read(2),
    Slot::Read(3),
    Slot::Write(4),
    Slot::Read(6),
    Slot::Uniform(7),
];
const REDUCE_SLOTS: &[Slot] = &[Slot::Uniform(0), Slot::Read(1), Slot::Write(4)];

/// What the passes read and write.
pub struct DecodeBuffers<'a> {
    pub qkv: QkvBuffers<'a>,
    /// Per-split state, [`partials_len`] floats.
    pub partials: &'a wgpu::Buffer,
    /// Combined heads `[B, Lq, H·dv]`.
    pub out: &'a wgpu::Buffer,
    pub mask: &'a MaskBuffers,
}

/// The decode pass over every key range, then the reduce; `c` must be one it [`serves`].
pub fn dispatches(
    gpu: &Gpu,
    c: &CoreProblem,
    f16: bool,
    b: &DecodeBuffers,
) -> Result<Vec<Dispatch>> {
    let kv_group = c.layout.kv_group as usize;
    let kv_heads = c.heads / kv_group.max(1);
    let shape = DecodeShape {
        qk_head_dim: c.qk_head_dim,
        v_head_dim: c.v_head_dim,
        rows: (kv_group * c.lq).next_power_of_two(),
        f16,
    };
    let splits = splits(c.lk);
    let p = DecodeParams {
        lq: c.lq as u32,
        lk: c.lk as u32,
        heads: c.heads as u32,
        kv_heads: kv_heads as u32,
        kv_group: kv_group as u32,
        scale: c.scale,
        q_offset: c.layout.q_offset,
        k_offset: c.layout.k_offset,
        v_offset: c.layout.v_offset,
        kv_stride: c.layout.kv_stride,
        keys_per_split: KEYS_PER_SPLIT as u32,
        splits: splits as u32,
    };
    let groups = [splits as u32, (c.batch * kv_heads) as u32, 1];
    gpu.check_workgroups("decode attention", groups)?;
    let key = format!("decode_attention {shape:?}");
    let pass = gpu.compile(&key, &PassSpec::main("decode_attention", SLOTS), || {
        source(shape)
    });
    let [words, mask_params] = b.mask.bindings();
    let buffers = [
        (1, b.qkv.q),
        (2, b.qkv.k),
        (3, b.qkv.v),
        (4, b.partials),
        words,
        mask_params,
    ];
    let decode = Dispatch::new(gpu, pass, &p, &buffers, groups)?;

    let rows = (c.batch * c.heads * c.lq) as u32;
    let max = gpu.limits().max_compute_workgroups_per_dimension;
    let groups_x = rows.clamp(1, max);
    let r = ReduceParams {
        rows,
        lq: c.lq as u32,
        heads: c.heads as u32,
        splits: splits as u32,
        groups_x,
        ..Default::default()
    };
    let reduce_groups = [groups_x, rows.div_ceil(groups_x), 1];
    gpu.check_workgroups("decode reduce", reduce_groups)?;
    let key = format!("decode_reduce dv={}", c.v_head_dim);
    let v_head_dim = c.v_head_dim;
    let pass = gpu.compile(&key, &PassSpec::main("decode_reduce", REDUCE_SLOTS), || {
        reduce_source(v_head_dim)
    });
    let reduce = Dispatch::new(gpu, pass, &r, &[(1, b.partials), (4, b.out)], reduce_groups)?;
    Ok(vec![decode, reduce])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_the_keys() {
        assert_eq!(splits(0), 1);
        assert_eq!(splits(1), 1);
        assert_eq!(splits(KEYS_PER_SPLIT), 1);
        assert_eq!(splits(KEYS_PER_SPLIT + 1), 2);
        assert_eq!(splits(32_768), 64);
    }
}
