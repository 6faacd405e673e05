//! `decode_attention` + `decode_reduce`: the attention core for a few query rows per sequence
//! (decoding), split over keys. Each workgroup scores one range of keys of one (batch,
//! key/value head) for every query row that reads that head, so under GQA a group's query
//! heads read their K/V once; a reduce pass combines the ranges in a fixed order. Same masks,
//! same −1e9 rule and the same NaN for an all −inf row as the other paths.
//!
//! Two bodies do a range's work ([`DecodeShape::lane_keys`]): on CPU adapters each lane takes
//! whole keys of its own (`decode_lane_keys.wgsl`); elsewhere, and for heads wider than it
//! takes or more rows of them than it holds, the lanes share each key's head
//! (`decode_attention.wgsl`). Both write the same
//! per-range state, so the reduce is one.

use crate::error::Result;
use crate::gpu::pass::{Binding, Dispatch, PassSpec, Slot};
use crate::gpu::{Gpu, KernelClass};
use crate::kernels::mask::MaskBuffers;
use crate::kernels::source::Prelude;
use crate::kernels::{head_cap, kv_spans, CoreProblem, KvChunks, QkvBuffers, RowStrides};

pub const WGSL: &str = include_str!("../../shaders/decode_attention.wgsl");
pub const LANE_KEYS_WGSL: &str = include_str!("../../shaders/decode_lane_keys.wgsl");
pub const PARAMS_WGSL: &str = include_str!("../../shaders/decode_params.wgsl");
pub const ROWS_VEC4_WGSL: &str = include_str!("../../shaders/decode_rows_vec4.wgsl");
/// f16 rows as whole vec4s, each two u32 words (half the loads of `vec4<f16>` on llvmpipe).
pub const ROWS_HALF_WGSL: &str = include_str!("../../shaders/decode_rows_half.wgsl");
pub const ROWS_SCALAR_WGSL: &str = include_str!("../../shaders/decode_rows_scalar.wgsl");
/// Q rows element by element, for the scalar and the quantized rows.
pub const ROWS_QUERY_WGSL: &str = include_str!("../../shaders/decode_rows_query.wgsl");
pub const ROWS_QUANT_WGSL: &str = include_str!("../../shaders/decode_rows_quant.wgsl");
/// Float rows read in blocks of 32 as the lane-keys body reads them (after either float rows file).
pub const ROWS_BLOCK32_WGSL: &str = include_str!("../../shaders/decode_rows_block32.wgsl");
pub const REDUCE_WGSL: &str = include_str!("../../shaders/decode_reduce.wgsl");

/// Most query rows one workgroup serves: `kv_group · Lq` (GQA group × the step's rows).
pub const MAX_ROWS: usize = 8;
/// Widest head the pass takes; wider ones run the flash pass (q stays in registers here).
pub const MAX_HEAD_DIM: usize = 256;
/// Most keys per split: a long context still gets many workgroups.
pub const MAX_KEYS_PER_SPLIT: usize = 512;
/// Vec4s of a row each lane aims to hold (fewer lanes per key leave more keys in flight).
const VECS_PER_LANE: usize = 4;
/// Widest head `decode_lane_keys` takes: eight of its unrolled chunks of 4 vec4s.
const LANE_KEYS_MAX_HEAD_DIM: usize = 128;
/// Most vec4s of q and accumulators a `decode_lane_keys` lane holds (rows × head vec4s): its
/// body is unrolled over both, and its cold compile grows with them. Lavapipe, `bench --only
/// compile --config decode:…`: d128 with 4 rows (256 vec4s) 10 s, with 8 rows 20.6 s; the
/// shared-key body takes 2.8 s at d128 with 8 rows. The price: at d128 with 8 rows (GQA group
/// 8) the shared-key body steps 2.9x slower on lavapipe (`bench --only decode --config
/// decode:b=1,h=32,kvh=4,d=128,ctx=4096`, runs in turn: 20.2 ms against 7.0 ms). A software
/// adapter is where the engine is tested, not where it is fast, so the compile bound wins.
const LANE_KEYS_MAX_ROW_VEC4S: usize = 256;
/// Loop iterations one invocation may make per split, counted as if no loop were unrolled:
/// a third of the 65,535 after which a software rasteriser silently stops its loops.
const SPLIT_ITERATIONS: usize = 21_000;
/// Workgroup memory the pass uses at most, within wgpu's default limit (16 KiB).
const WORKGROUP_BYTES: usize = 16 * 1024;

/// Whether the decode pass serves `lq` query rows per (batch, head) of a module with
/// `kv_group` query heads per key/value head and these head sizes: few enough rows per
/// key/value head, heads narrow enough.
pub fn serves(kv_group: usize, lq: usize, qk_head_dim: usize, v_head_dim: usize) -> bool {
    let rows = kv_group * lq;
    (1..=MAX_ROWS).contains(&rows) && qk_head_dim <= MAX_HEAD_DIM && v_head_dim <= MAX_HEAD_DIM
}

/// The shape one decode pipeline is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeShape {
    /// The head sizes the shader is laid out for ([`head_cap`] of the module's; the real
    /// sizes come with each dispatch's parameters).
    pub qk_cap: usize,
    pub v_cap: usize,
    /// Rows per workgroup, a power of two ≥ `kv_group · Lq`.
    pub rows: usize,
    pub f16: bool,
    /// Lanes per workgroup: 8 for CPU adapters (one llvmpipe SIMD vector, so a barrier costs
    /// nothing and q stays in one vector's registers), 64 for GPUs (two warps, or one AMD
    /// wave; several keys in flight). See [`KernelClass`].
    pub threads: usize,
    /// Whether every Q, K and V row starts on a vec4 (head sizes and offsets multiples of 4), so
    /// rows are read as vec4s: about 1.4× faster on lavapipe at d128.
    pub vec4_rows: bool,
    /// Whether each lane takes whole keys of its own (`decode_lane_keys.wgsl`) rather than a
    /// share of every key's head (`decode_attention.wgsl`): CPU adapters, heads up to
    /// `LANE_KEYS_MAX_HEAD_DIM`. On llvmpipe a lane-wide load costs the same whichever memory
    /// the lanes read, so sharing a key only adds the exchanges: each lane its own keys steps
    /// about 1.8× faster at d128 (`bench --only decode`). A GPU would hold far too many
    /// registers per lane (q and the accumulator of every row).
    pub lane_keys: bool,
    /// Bits of a quantized K/V value (8: q8_0, 4: q4_0; `decode_rows_quant.wgsl`), 0 for
    /// float K/V (of Q's element type).
    pub kv_bits: u32,
}

impl DecodeShape {
    pub fn new(
        class: KernelClass,
        qk_head_dim: usize,
        v_head_dim: usize,
        rows: usize,
        f16: bool,
    ) -> Self {
        let threads = match class {
            KernelClass::Cpu => 8,
            KernelClass::Gpu => 64,
        };
        let (qk_cap, v_cap) = (head_cap(qk_head_dim), head_cap(v_head_dim));
        let rows = rows.next_power_of_two();
        let row_vec4s = rows * (qk_cap.div_ceil(4) + v_cap.div_ceil(4));
        DecodeShape {
            qk_cap,
            v_cap,
            rows,
            f16,
            threads,
            vec4_rows: false,
            lane_keys: class == KernelClass::Cpu
                && qk_cap.max(v_cap) <= LANE_KEYS_MAX_HEAD_DIM
                && row_vec4s <= LANE_KEYS_MAX_ROW_VEC4S,
            kv_bits: 0,
        }
    }

    /// (lanes sharing one row, vec4s each lane holds) for a row of `head_dim`.
    fn lanes(&self, head_dim: usize) -> (usize, usize) {
        let lanes = head_dim
            .div_ceil(4)
            .div_ceil(VECS_PER_LANE)
            .clamp(1, self.threads);
        (lanes, head_dim.div_ceil(4).div_ceil(lanes))
    }

    /// Keys per tile: the lanes' count but at least 32, halved until the tile's workgroup
    /// memory fits. Fewer tiles, fewer barriers: on lavapipe (8 lanes) at ctx 4096 d128, 32
    /// keys per tile step about 1.15× faster than 8 (`bench --only decode`, same run; 64 no
    /// faster than 32).
    fn tile(&self) -> usize {
        if self.lane_keys {
            return self.threads; // one key per lane at a time
        }
        let (qk_lanes, _) = self.lanes(self.qk_cap);
        let mut tile = self.threads.max(32);
        while tile > 1
            && self.score_bytes(tile, qk_lanes) + self.acc_shared_bytes() > WORKGROUP_BYTES
        {
            tile /= 2;
        }
        tile
    }

    /// Workgroup memory of the per-row values, four rows to a vec4: each lane's partial dot
    /// products, the scores and weights of a tile, each lane's max.
    fn score_bytes(&self, tile: usize, qk_lanes: usize) -> usize {
        16 * self.rows.div_ceil(4) * (tile * (qk_lanes + 2) + self.threads)
    }

    /// Vec4s of workgroup memory the V parts are summed through (1 when there is one part).
    fn acc_shared(&self) -> usize {
        let (v_lanes, v_vecs) = self.lanes(self.v_cap);
        if self.threads / v_lanes > 1 {
            self.threads * v_vecs
        } else {
            1
        }
    }

    fn acc_shared_bytes(&self) -> usize {
        16 * self.acc_shared() + 4 * self.threads
    }

    /// Keys per split: a power of two, a multiple of the tile, whose loops stay within
    /// `SPLIT_ITERATIONS`.
    pub fn keys_per_split(&self) -> usize {
        if self.lane_keys {
            return self.lane_keys_per_split();
        }
        let (qk_lanes, qk_vecs) = self.lanes(self.qk_cap);
        let (v_lanes, v_vecs) = self.lanes(self.v_cap);
        let tile = self.tile();
        let qk_parts = self.threads / qk_lanes;
        let v_parts = self.threads / v_lanes;
        // Per key of a tile: its share of steps 1 and 4, the partial sums of step 2, the max
        // of step 3 (every lane reads every key's score).
        let per_key = (self.rows * (qk_vecs + 1)).div_ceil(qk_parts)
            + (self.rows * (v_vecs + 1)).div_ceil(v_parts)
            + (self.rows * qk_lanes).div_ceil(self.threads)
            + 2 * self.rows;
        let keys = (SPLIT_ITERATIONS / per_key).min(MAX_KEYS_PER_SPLIT);
        // A power of two, so that it divides a KV cache's chunk (a multiple of the largest).
        (1usize << keys.max(1).ilog2()).max(tile)
    }

    /// [`Self::keys_per_split`] of `decode_lane_keys`: its loops within [`SPLIT_ITERATIONS`],
    /// its workgroup memory within [`WORKGROUP_BYTES`].
    fn lane_keys_per_split(&self) -> usize {
        let (dk4, dv4) = (self.qk_cap.div_ceil(4), self.v_cap.div_ceil(4));
        let row_vecs = self.rows.div_ceil(4);
        // Per key of a lane: the vec4 loops of q·k and w·v with their row loops, the mask's
        // element loops, the weights.
        let per_key = (dk4 + dv4) * (self.rows + 1) + 6 * row_vecs;
        let mut keys = (SPLIT_ITERATIONS / per_key * self.threads).min(MAX_KEYS_PER_SPLIT);
        keys = 1usize << keys.max(1).ilog2();
        while keys > self.threads && self.lane_keys_bytes(keys) > WORKGROUP_BYTES {
            keys /= 2;
        }
        keys.max(self.threads)
    }

    /// Workgroup memory of `decode_lane_keys`: a split's scores, each lane's max and sum,
    /// one row's accumulators of every lane.
    fn lane_keys_bytes(&self, keys: usize) -> usize {
        let row_vecs = self.rows.div_ceil(4);
        let dv4 = self.v_cap.div_ceil(4);
        16 * (row_vecs * keys + 2 * row_vecs * self.threads + self.threads * dv4)
    }

    /// Key ranges for `lk` keys.
    pub fn splits(&self, lk: usize) -> usize {
        lk.div_ceil(self.keys_per_split()).max(1)
    }
}

/// The shape `gpu` runs the decode pass in for `kv_group · lq` rows per workgroup. GL's
/// llvmpipe keeps the shared-key body: its GLSL route compiles the unrolled lane-keys body
/// about twice as slowly as lavapipe (24 s against 15 s at d128, cold), once for every head
/// size and row count, and a software GL is where the engine runs, not where it is fast.
pub fn shape(gpu: &Gpu, kv_group: usize, lq: usize, qk: usize, v: usize, f16: bool) -> DecodeShape {
    let mut shape = DecodeShape::new(gpu.kernel_class(), qk, v, kv_group.max(1) * lq, f16);
    shape.lane_keys &= gpu.info().backend != wgpu::Backend::Gl;
    shape
}

/// Floats of per-split state (`partials`) for a step of `lq` query rows per (batch, head)
/// over `lk` keys, `rows` = B·H·Lq in all: per query row and split, its max, sum and
/// accumulator.
pub fn partials_for(
    gpu: &Gpu,
    kv_group: usize,
    lq: usize,
    rows: usize,
    lk: usize,
    qk: usize,
    v: usize,
) -> usize {
    shape(gpu, kv_group, lq, qk, v, false).splits(lk) * rows * (2 + 4 * v.div_ceil(4))
}

/// [`partials_for`] a core problem.
pub fn partials_len(gpu: &Gpu, c: &CoreProblem) -> usize {
    partials_for(
        gpu,
        c.layout.kv_group as usize,
        c.lq,
        c.batch * c.heads * c.lq,
        c.lk,
        c.qk_head_dim,
        c.v_head_dim,
    )
}

/// Mirrors `DecodeParams` in `decode_attention.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DecodeParams {
    /// Where Q, K and V rows lie.
    pub q: RowStrides,
    pub k: RowStrides,
    pub v: RowStrides,
    pub lq: u32,
    pub lk: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub kv_group: u32,
    pub scale: f32,
    pub keys_per_split: u32,
    pub splits: u32,
    pub split_base: u32,
    pub key_base: u32,
    /// The module's head sizes; the shader holds [`head_cap`] of each.
    pub head_dim_qk: u32,
    pub head_dim_v: u32,
    /// Where a quantized K's and V's scales start, in words (`KvFormat`).
    pub k_scales: u32,
    pub v_scales: u32,
}

/// Mirrors `ReduceParams` in `decode_reduce.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ReduceParams {
    /// Where the output rows lie.
    pub o: RowStrides,
    pub rows: u32,
    pub lq: u32,
    pub heads: u32,
    pub splits: u32,
    pub groups_x: u32,
    pub head_dim_v: u32,
    /// 1: each head's sink logit (binding 8) joins the denominator.
    pub sinks: u32,
    pub _pad2: u32,
}

/// The full source: sizes and element type, the mask rule, the body.
pub fn source(s: DecodeShape) -> String {
    // Q element by element wherever K and V are not read as whole float vec4s.
    let (query, rows) = match (s.kv_bits, s.vec4_rows) {
        (0, true) if s.f16 => ("", ROWS_HALF_WGSL),
        (0, true) => ("", ROWS_VEC4_WGSL),
        (0, false) => (ROWS_QUERY_WGSL, ROWS_SCALAR_WGSL),
        _ => (ROWS_QUERY_WGSL, ROWS_QUANT_WGSL),
    };
    let kv_quant = if s.kv_bits > 0 {
        super::KV_QUANT_WGSL
    } else {
        ""
    };
    let prelude = Prelude::new()
        .u32("HEAD_CAP_QK", s.qk_cap as u32)
        .u32("HEAD_CAP_V", s.v_cap as u32)
        .u32("ROWS", s.rows as u32)
        .u32("THREADS", s.threads as u32);
    let (prelude, blocks, body) = if s.lane_keys {
        let blocks = if s.kv_bits == 0 {
            ROWS_BLOCK32_WGSL
        } else {
            ""
        };
        let keys = prelude.u32("KEYS", s.keys_per_split() as u32);
        (keys, blocks, LANE_KEYS_WGSL)
    } else {
        let (qk_lanes, qk_vecs) = s.lanes(s.qk_cap);
        let (v_lanes, v_vecs) = s.lanes(s.v_cap);
        let tiled = prelude
            .u32("TILE", s.tile() as u32)
            .u32("QK_LANES", qk_lanes as u32)
            .u32("QK_VECS", qk_vecs as u32)
            .u32("V_LANES", v_lanes as u32)
            .u32("V_VECS", v_vecs as u32)
            .u32("ACC_SHARED", s.acc_shared() as u32);
        (tiled, "", WGSL)
    };
    let prelude = prelude.u32("KV_BITS", s.kv_bits).elem("QkvElem", s.f16);
    super::mask::prelude(prelude).source(&[
        super::ROWS_WGSL,
        super::mask::WGSL,
        PARAMS_WGSL,
        kv_quant,
        query,
        rows,
        blocks,
        body,
    ])
}

/// The reduce pass's source: one for every head size (it comes with the parameters).
pub fn reduce_source() -> String {
    Prelude::new().source(&[super::ROWS_WGSL, REDUCE_WGSL])
}

pub(crate) const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Read(2),
    Slot::Read(3),
    Slot::Write(4),
    Slot::Read(6),
    Slot::Uniform(7),
];
pub(crate) const REDUCE_SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Write(4),
    Slot::Read(8),
];

/// What the passes read and write.
pub struct DecodeBuffers<'a> {
    pub qkv: QkvBuffers<'a>,
    /// Per-split state, [`partials_len`] floats.
    pub partials: &'a wgpu::Buffer,
    /// Combined heads `[B, Lq, H·dv]`.
    pub out: &'a wgpu::Buffer,
    pub mask: &'a MaskBuffers,
    /// A KV cache's K/V chunks, read in place of `qkv.k` and `qkv.v`; a chunk holds a whole
    /// number of splits ([`MAX_KEYS_PER_SPLIT`] divides its keys).
    pub chunks: Option<KvChunks<'a>>,
    /// One sink logit per query head, and whether they are read (by the reduce).
    pub sinks: (&'a wgpu::Buffer, bool),
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
    let mut shape = shape(gpu, kv_group, c.lq, c.qk_head_dim, c.v_head_dim, f16);
    let l = &c.layout;
    shape.vec4_rows = l.whole_vec4s
        && c.qk_head_dim.is_multiple_of(4)
        && c.v_head_dim.is_multiple_of(4)
        && [l.q, l.k, l.v].iter().all(RowStrides::vec4_aligned);
    shape.kv_bits = l.kv.dtype.quant_bits();
    // Quantized rows have their own loads: one pipeline whatever the float alignment.
    shape.vec4_rows &= shape.kv_bits == 0;
    let splits = shape.splits(c.lk);
    let per_split = shape.keys_per_split();
    let key = format!("decode_attention {shape:?}");
    let pass = gpu.compile(&key, &PassSpec::main("decode_attention", SLOTS), || {
        source(shape)
    });
    let [words, mask_params] = b.mask.bindings();
    let mut chain = Vec::new();
    for span in kv_spans(&b.qkv, b.chunks, c.lk, &l.ranges) {
        let split_base = span.key_base / per_split;
        let span_splits = span.key_end.div_ceil(per_split).max(split_base + 1) - split_base;
        let p = DecodeParams {
            lq: c.lq as u32,
            lk: c.lk as u32,
            heads: c.heads as u32,
            kv_heads: kv_heads as u32,
            kv_group: kv_group as u32,
            scale: c.scale,
            q: c.layout.q,
            k: c.layout.k,
            v: c.layout.v,
            keys_per_split: per_split as u32,
            splits: splits as u32,
            split_base: split_base as u32,
            key_base: span.key_base as u32,
            head_dim_qk: c.qk_head_dim as u32,
            head_dim_v: c.v_head_dim as u32,
            k_scales: l.kv.k_scales,
            v_scales: l.kv.v_scales,
        };
        let groups = [span_splits as u32, (c.batch * kv_heads) as u32, 1];
        gpu.check_workgroups("decode attention", groups)?;
        let buffers = [
            (1, Binding::new(b.qkv.q, l.ranges.q)),
            (2, span.k),
            (3, span.v),
            (4, b.partials.into()),
            (words.0, words.1.into()),
            (mask_params.0, mask_params.1.into()),
        ];
        chain.push(Dispatch::new(gpu, pass.clone(), &p, &buffers, groups)?);
    }

    let rows = (c.batch * c.heads * c.lq) as u32;
    let max = gpu.limits().max_compute_workgroups_per_dimension;
    let groups_x = rows.clamp(1, max);
    let r = ReduceParams {
        o: c.layout.out,
        rows,
        lq: c.lq as u32,
        heads: c.heads as u32,
        splits: splits as u32,
        groups_x,
        head_dim_v: c.v_head_dim as u32,
        sinks: b.sinks.1 as u32,
        ..Default::default()
    };
    let reduce_groups = [groups_x, rows.div_ceil(groups_x), 1];
    gpu.check_workgroups("decode reduce", reduce_groups)?;
    let pass = gpu.compile(
        "decode_reduce",
        &PassSpec::main("decode_reduce", REDUCE_SLOTS),
        reduce_source,
    );
    let bindings = [
        (1, b.partials.into()),
        (4, Binding::new(b.out, l.ranges.out)),
        (8, b.sinks.0.into()),
    ];
    let reduce = Dispatch::new(gpu, pass, &r, &bindings, reduce_groups)?;
    chain.push(reduce);
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_shape() -> impl Iterator<Item = DecodeShape> {
        let classes = [KernelClass::Cpu, KernelClass::Gpu];
        let dims = [1, 3, 4, 8, 60, 64, 80, 96, 128, 200, 256];
        classes.into_iter().flat_map(move |class| {
            dims.into_iter().flat_map(move |qk| {
                dims.into_iter().flat_map(move |v| {
                    [1, 2, 4, 8].map(|rows| DecodeShape::new(class, qk, v, rows, false))
                })
            })
        })
    }

    #[test]
    fn splits_cover_the_keys() {
        for s in every_shape() {
            let per = s.keys_per_split();
            assert!(
                (1..=MAX_KEYS_PER_SPLIT).contains(&per)
                    && per % s.tile() == 0
                    && MAX_KEYS_PER_SPLIT.is_multiple_of(per),
                "{s:?}"
            );
            assert_eq!(s.splits(0), 1);
            assert_eq!(s.splits(1), 1);
            assert_eq!(s.splits(per), 1);
            assert_eq!(s.splits(per + 1), 2);
        }
    }

    #[test]
    fn cpu_adapters_give_each_lane_its_own_keys_up_to_d128() {
        for s in every_shape() {
            let narrow = s.qk_cap.max(s.v_cap) <= LANE_KEYS_MAX_HEAD_DIM;
            let held = s.rows * (s.qk_cap + s.v_cap) / 4;
            assert_eq!(
                s.lane_keys,
                s.threads == 8 && narrow && held <= 256,
                "{s:?}"
            );
        }
        // A GQA group of 8 at d128 takes the shared-key body (compile time), at d64 not.
        assert!(!DecodeShape::new(KernelClass::Cpu, 128, 128, 8, false).lane_keys);
        assert!(DecodeShape::new(KernelClass::Cpu, 64, 64, 8, false).lane_keys);
        // The bench's shape (d128, a GQA group of 4) keeps 512 keys per split.
        let s = DecodeShape::new(KernelClass::Cpu, 128, 128, 4, false);
        assert_eq!(s.keys_per_split(), 512);
    }

    #[test]
    fn lanes_cover_a_row_and_memory_fits() {
        for s in every_shape() {
            for d in [s.qk_cap, s.v_cap] {
                let (lanes, vecs) = s.lanes(d);
                assert!(lanes * vecs >= d.div_ceil(4) && lanes <= s.threads, "{s:?}");
                assert!((lanes - 1) * vecs < d.div_ceil(4), "an idle lane: {s:?}");
            }
            if s.lane_keys {
                let keys = s.keys_per_split();
                assert!(s.lane_keys_bytes(keys) <= WORKGROUP_BYTES, "{s:?}");
                continue;
            }
            let (qk_lanes, _) = s.lanes(s.qk_cap);
            let bytes = 4 * s.rows * s.tile() * (qk_lanes + 2) + s.acc_shared_bytes();
            assert!(
                bytes <= WORKGROUP_BYTES && s.tile().is_power_of_two(),
                "{s:?}"
            );
        }
    }
}
