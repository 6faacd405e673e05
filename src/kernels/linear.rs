//! `linear`: `Y = X·Wᵀ + b`, tiled GEMM writing straight into head-split layout.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::pass::Slot::{Read, Uniform, Write};
use crate::gpu::pass::{Checks, Dispatch, Pass, PassSpec, Slot};
use crate::gpu::Gpu;

use super::source::Prelude;
use super::{gemm_prelude, GEMM_TILE, GEMM_TILE_WGSL};

pub const WGSL: &str = include_str!("../../shaders/linear.wgsl");
/// `LinearParams`, its uniform binding and `dst_index`: prepended to every variant.
pub const PARAMS_WGSL: &str = include_str!("../../shaders/linear_params.wgsl");
/// Bindings, register block, plain vec4 loop and store shared by `Vec4` and `Subgroup`.
pub const VEC4_BLOCK_WGSL: &str = include_str!("../../shaders/linear_vec4_block.wgsl");
/// The vec4 variant (K % 4 == 0, offsets aligned).
pub const WGSL_VEC4: &str = include_str!("../../shaders/linear_vec4.wgsl");
/// The vec4 variant with X loads shared across a subgroup; needs `Features::SUBGROUP`.
pub const WGSL_SUBGROUP: &str = include_str!("../../shaders/linear_subgroup.wgsl");

/// Which `linear` shader a dispatch uses; chosen on the host from its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinearVariant {
    /// Scalar loads with bounds checks per element: any sizes and offsets.
    Scalar,
    /// X and W read as vec4 along K: needs K % 4 == 0 and 4-aligned `x_offset`, `w_offset`.
    Vec4,
    /// `Vec4` with each X vec4 loaded by one lane and shared through subgroup shuffles: the
    /// same preconditions as `Vec4`, plus an adapter with `Features::SUBGROUP`.
    Subgroup,
}

impl LinearVariant {
    /// Whether this variant can run these parameters on `gpu`: `Ok` or the reason it cannot
    /// (`Unsupported` without SUBGROUP, `Misuse` when the vec4 preconditions do not hold).
    pub fn check(self, gpu: &Gpu, p: &LinearParams, bound: &BoundElems) -> Result<()> {
        if self == LinearVariant::Subgroup && !gpu.has_subgroups() {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: "the subgroup linear variant needs the SUBGROUP feature".into(),
            });
        }
        if self != LinearVariant::Scalar && !vec4_ok(p, bound) {
            return Err(Error::Misuse(format!(
                "the {self:?} linear variant needs K % 4 == 0, 4-aligned offsets and every \
                 index in range (K {}, x_offset {}, w_offset {})",
                p.k, p.x_offset, p.w_offset
            )));
        }
        if self != LinearVariant::Scalar && !vec4_depth_ok(gpu, p) {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: format!(
                    "the {self:?} linear variant at K {} (on a software rasteriser its K loop \
                     stops after 65,535 iterations; at most {SOFTWARE_VEC4_K} here, the scalar \
                     variant splits any K)",
                    p.k
                ),
            });
        }
        Ok(())
    }
}

/// Elements held by the buffers one linear dispatch binds (x, w, bias, y).
#[derive(Debug, Clone, Copy)]
pub struct BoundElems {
    pub x: u64,
    pub w: u64,
    pub bias: u64,
    pub y: u64,
}

impl BoundElems {
    /// From the bound buffers' sizes (f32 elements).
    pub fn of(x: &wgpu::Buffer, w: &wgpu::Buffer, bias: &wgpu::Buffer, y: &wgpu::Buffer) -> Self {
        BoundElems {
            x: x.size() / 4,
            w: w.size() / 4,
            bias: bias.size() / 4,
            y: y.size() / 4,
        }
    }
}

impl LinearParams {
    /// Whether every index `linear_vec4.wgsl` can form for these parameters lies inside the
    /// bound buffers. This is the proof that lets that shader run without runtime bounds checks.
    ///
    /// The shader reads `x4[x_offset/4 + r·K/4 + q]` for rows `r < m` (rows past the edge read
    /// row 0) and `q < K/4`, likewise `w4` for rows `< n`; `bias[bias_offset + col]` for
    /// `col < n` when `has_bias`; and writes `y[dst_index(row, col)]` for `row < m`, `col < n`.
    pub fn in_bounds(&self, b: &BoundElems) -> bool {
        let (m, n, k) = (self.m as u64, self.n as u64, self.k as u64);
        if m == 0 || n == 0 || k == 0 || self.seq_len == 0 {
            return false;
        }
        if self.x_offset as u64 + m * k > b.x || self.w_offset as u64 + n * k > b.w {
            return false;
        }
        if self.has_bias != 0 && self.bias_offset as u64 + n > b.bias {
            return false;
        }
        // Segments must tile the columns 0..n in order.
        let mut start = 0u64;
        let seq = self.seq_len as u64;
        let last_batch = (m - 1) / seq;
        let last_pos = (m - 1).min(seq - 1);
        for s in 0..3 {
            if self.seg_start[s] == u32::MAX {
                break;
            }
            let (d, heads) = (self.seg_head_dim[s] as u64, self.seg_heads[s] as u64);
            if self.seg_start[s] as u64 != start || d == 0 || heads == 0 {
                return false;
            }
            start += d * heads;
            // Largest destination index of this segment, plus one.
            let end = self.seg_dst[s] as u64
                + ((last_batch * heads + heads - 1) * self.dst_seq_len as u64
                    + self.dst_pos as u64
                    + last_pos)
                    * d
                + d;
            if end > b.y {
                return false;
            }
        }
        start == n && self.seg_start[3] == u32::MAX
    }
}

/// The variant a dispatch uses: `Scalar` unless K % 4 == 0, the offsets are 4-aligned and
/// [`LinearParams::in_bounds`] proves every access in range; then `Subgroup` where
/// [`subgroup_preferred`], else `Vec4`.
pub fn variant(gpu: &Gpu, p: &LinearParams, bound: &BoundElems) -> LinearVariant {
    // Both vec4 variants run without runtime bounds checks; `vec4_ok` is the `in_bounds` proof
    // that makes that sound, so neither is picked without it.
    if !vec4_ok(p, bound) || !vec4_depth_ok(gpu, p) {
        LinearVariant::Scalar
    } else if subgroup_preferred(gpu) {
        LinearVariant::Subgroup
    } else {
        LinearVariant::Vec4
    }
}

/// Whether [`variant`] picks `Subgroup` over `Vec4` on this adapter: only where it was measured
/// faster. On lavapipe (a CPU adapter, subgroups of 8) it is about 1.7× faster than `Vec4` at
/// 4096×512×512 (`bench --only gemm`, same run) and at 128×1536×512 (a fused QKV projection),
/// because each lane's load is a separate scalar access there and it makes 10 loads per K step
/// instead of 24. So: CPU kernels ([`KernelClass`](crate::KernelClass)) with SUBGROUP whose subgroups are at least 8 wide (narrower
/// ones never take its shared path). Not measured on a GPU, where the 8 threads' identical X
/// loads likely hit one cached line anyway and the shuffles and layout check are extra work:
/// GPUs keep `Vec4` until a bench there (it prints both variants) shows otherwise.
pub fn subgroup_preferred(gpu: &Gpu) -> bool {
    let cpu_kernels = gpu.kernel_class() == crate::gpu::KernelClass::Cpu;
    gpu.has_subgroups() && cpu_kernels && gpu.info().subgroup_min_size >= 8
}

/// Most K the vec4 variants walk on a software rasteriser, whose loops stop after 65,535
/// iterations per invocation: their K loop makes K / 4 (measured wrong from K = 262,144), so
/// 65,536 keeps a quarter of the cap. The scalar variant splits K over dispatches instead.
pub const SOFTWARE_VEC4_K: u32 = 65_536;

/// Whether the vec4 variants' single K loop stays under the software loop cap here.
fn vec4_depth_ok(gpu: &Gpu, p: &LinearParams) -> bool {
    !super::is_software(gpu) || p.k <= SOFTWARE_VEC4_K
}

/// The precondition of both vec4 variants (`Vec4`, `Subgroup`), which run unchecked over the
/// whole of K in one dispatch.
fn vec4_ok(p: &LinearParams, bound: &BoundElems) -> bool {
    (p.k_begin, p.k_end) == (0, p.k)
        && p.k.is_multiple_of(4)
        && p.x_offset.is_multiple_of(4)
        && p.w_offset.is_multiple_of(4)
        && p.in_bounds(bound)
}

/// Mirrors `LinearParams` in `linear_params.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LinearParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub seq_len: u32,
    pub x_offset: u32,
    pub w_offset: u32,
    pub bias_offset: u32,
    pub has_bias: u32,
    pub dst_seq_len: u32,
    pub dst_pos: u32,
    /// The K range of a scalar dispatch (`[0, k)` unless the host splits K).
    pub k_begin: u32,
    pub k_end: u32,
    pub seg_start: [u32; 4],
    pub seg_head_dim: [u32; 4],
    pub seg_heads: [u32; 4],
    pub seg_dst: [u32; 4],
}

/// One output segment: `heads` heads of width `head_dim`, head-split at element `dst`.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub heads: u32,
    pub head_dim: u32,
    pub dst: u32,
}

impl LinearParams {
    /// `rows = batch·seq_len` rows of width `k`, into up to three segments (in column order;
    /// the shader has room for three, so further ones are ignored and `n` counts only these).
    /// A plain `[rows, n]` output is `Segment { heads: 1, head_dim: n, dst }`.
    pub fn new(rows: u32, k: u32, seq_len: u32, segments: &[Segment]) -> Self {
        debug_assert!((1..=3).contains(&segments.len()), "one to three segments");
        let mut p = LinearParams {
            m: rows,
            k,
            k_end: k,
            seq_len: seq_len.max(1),
            dst_seq_len: seq_len.max(1),
            ..Default::default()
        };
        let mut start = 0;
        for s in 0..3 {
            // Unused segments start past every column, so no column selects them.
            let seg = segments.get(s);
            p.seg_start[s] = if seg.is_some() { start } else { u32::MAX };
            if let Some(seg) = seg {
                p.seg_head_dim[s] = seg.head_dim;
                p.seg_heads[s] = seg.heads;
                p.seg_dst[s] = seg.dst;
                start += seg.heads * seg.head_dim;
            }
        }
        p.seg_start[3] = u32::MAX;
        p.n = start;
        p
    }

    /// Reads this GEMM's weight rows and biases from element offsets of the bound buffers
    /// (W_k's rows after W_q's in one packed buffer, say); `has_bias` turns the bias on.
    pub fn weights_at(mut self, w_offset: u32, bias_offset: u32, has_bias: bool) -> Self {
        self.w_offset = w_offset;
        self.bias_offset = bias_offset;
        self.has_bias = has_bias as u32;
        self
    }

    /// Writes the rows at positions `dst_pos..` of a destination with `dst_seq_len` rows per
    /// (batch, head): appending to a KV cache of that capacity.
    pub fn appending(mut self, dst_seq_len: u32, dst_pos: u32) -> Self {
        self.dst_seq_len = dst_seq_len;
        self.dst_pos = dst_pos;
        self
    }
}

/// Element types of a `linear` dispatch: all f32, or f16 weights (an f16 module) writing f16
/// head-split Q/K/V or the f32 output. X and the bias stay f32; accumulation is f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinearElems {
    F32,
    F16Weights { f16_out: bool },
}

/// The full source of one variant: a prelude (tile sizes, element types), the shared
/// parameters and tile loop, the body.
pub fn source(variant: LinearVariant, elems: LinearElems) -> String {
    match (variant, elems) {
        (LinearVariant::Scalar, elems) => {
            let (w16, y16) = match elems {
                LinearElems::F32 => (false, false),
                LinearElems::F16Weights { f16_out } => (true, f16_out),
            };
            let prelude = gemm_prelude(Prelude::new())
                .elem("WElem", w16)
                .elem("YElem", y16);
            prelude.source(&[PARAMS_WGSL, GEMM_TILE_WGSL, WGSL])
        }
        (vec4, _) => {
            let prelude = Prelude::new().u32("RB", VEC4_ROWS).u32("CB", VEC4_COLS);
            let body = if vec4 == LinearVariant::Subgroup {
                WGSL_SUBGROUP
            } else {
                WGSL_VEC4
            };
            prelude.source(&[PARAMS_WGSL, VEC4_BLOCK_WGSL, body])
        }
    }
}

/// Bindings of every `linear` variant: params, X, W, bias, Y.
pub(crate) const SLOTS: &[Slot] = &[Uniform(0), Read(1), Read(2), Read(3), Write(4)];

/// The compiled pass, shared by everything on this device.
fn pass(gpu: &Gpu, variant: LinearVariant, elems: LinearElems) -> Arc<Pass> {
    // The vec4 variants run without wgpu's runtime bounds checks (about 1.8× faster on
    // lavapipe): `variant()` and `LinearVariant::check` let them run only dispatches whose every
    // index `LinearParams::in_bounds` proves in range. The scalar variant keeps the checks.
    let checks = match variant {
        LinearVariant::Scalar => Checks::Checked,
        LinearVariant::Vec4 | LinearVariant::Subgroup => Checks::Unchecked,
    };
    let spec = PassSpec {
        checks,
        ..PassSpec::main("linear", SLOTS)
    };
    gpu.compile(&format!("linear {variant:?} {elems:?}"), &spec, || {
        source(variant, elems)
    })
}

/// Output tile (rows, columns) of one workgroup of a variant.
pub fn tile(variant: LinearVariant) -> (u32, u32) {
    match variant {
        LinearVariant::Scalar => (GEMM_TILE, GEMM_TILE),
        LinearVariant::Vec4 | LinearVariant::Subgroup => (8 * VEC4_ROWS, 8 * VEC4_COLS),
    }
}

/// Rows and columns per thread of `linear_vec4.wgsl` and `linear_subgroup.wgsl` (`RB`, `CB`
/// in their prelude; 64 threads as 8×8).
const VEC4_ROWS: u32 = 16;
const VEC4_COLS: u32 = 8;

/// Workgroups covering the output with the tiles of `variant`.
pub fn workgroups(p: &LinearParams, variant: LinearVariant) -> [u32; 3] {
    let (tm, tn) = tile(variant);
    [p.n.div_ceil(tn), p.m.div_ceil(tm), 1]
}

/// What a `linear` dispatch reads and writes.
pub struct LinearBuffers<'a> {
    pub x: &'a wgpu::Buffer,
    pub w: &'a wgpu::Buffer,
    /// Read only where the parameters say `has_bias`; `None` binds a zero buffer.
    pub bias: Option<&'a wgpu::Buffer>,
    pub y: &'a wgpu::Buffer,
}

/// The ready dispatches of one `linear` (several only when the scalar kernel splits a long K
/// on a software rasteriser; see `kernels::depth_split`) and the variant they run. `request: None` picks as a forward does
/// ([`variant`]; f16 weights always run the scalar kernel); `Some(v)` runs `v` or returns the
/// reason it cannot ([`LinearVariant::check`]).
pub fn dispatch(
    gpu: &Gpu,
    elems: LinearElems,
    request: Option<LinearVariant>,
    p: &LinearParams,
    b: LinearBuffers,
) -> Result<(Vec<Dispatch>, LinearVariant)> {
    let zeros;
    let bias = match b.bias {
        Some(bias) => bias,
        None => {
            zeros = gpu.storage("no bias", 16, wgpu::BufferUsages::empty());
            &zeros
        }
    };
    // Sizes as f32 elements: an f16 weight buffer holds twice as many, so this undercounts
    // it, which only makes the proof stricter.
    let bound = BoundElems::of(b.x, b.w, bias, b.y);
    let variant = match (request, elems) {
        (Some(v), LinearElems::F32) => {
            v.check(gpu, p, &bound)?;
            v
        }
        (Some(LinearVariant::Scalar) | None, LinearElems::F16Weights { .. }) => {
            LinearVariant::Scalar
        }
        (Some(v), LinearElems::F16Weights { .. }) => {
            return Err(Error::Misuse(format!(
                "the {v:?} linear variant reads f32 weights; f16 weights run the scalar kernel"
            )))
        }
        (None, LinearElems::F32) => variant(gpu, p, &bound),
    };
    let pass = pass(gpu, variant, elems);
    let buffers = [(1, b.x), (2, b.w), (3, bias), (4, b.y)];
    // The vec4 variants walk all of K in one dispatch (`vec4_depth_ok` bounds it).
    let depth = match variant {
        LinearVariant::Scalar => p.k,
        _ => 0,
    };
    let at = |k_begin, k_end| match variant {
        LinearVariant::Scalar => LinearParams {
            k_begin,
            k_end,
            ..*p
        },
        _ => *p,
    };
    let dispatches = super::depth_split(gpu, &pass, depth, at, &buffers, workgroups(p, variant))?;
    Ok((dispatches, variant))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(m: u32, n: u32, k: u32) -> LinearParams {
        LinearParams::new(
            m,
            k,
            m,
            &[Segment {
                heads: 1,
                head_dim: n,
                dst: 0,
            }],
        )
    }

    fn exact(m: u64, n: u64, k: u64) -> BoundElems {
        BoundElems {
            x: m * k,
            w: n * k,
            bias: n,
            y: m * n,
        }
    }

    #[test]
    fn in_bounds_holds_exactly_at_the_buffer_sizes() {
        let p = plain(8, 12, 16).weights_at(0, 0, true);
        assert!(p.in_bounds(&exact(8, 12, 16)));
        let short = |f: fn(&mut BoundElems)| {
            let mut b = exact(8, 12, 16);
            f(&mut b);
            p.in_bounds(&b)
        };
        assert!(!short(|b| b.x -= 1));
        assert!(!short(|b| b.w -= 1));
        assert!(!short(|b| b.bias -= 1));
        assert!(!short(|b| b.y -= 1));
        // Without a bias its buffer is never read.
        assert!(plain(8, 12, 16).in_bounds(&BoundElems {
            bias: 0,
            ..exact(8, 12, 16)
        }));
    }

    #[test]
    fn in_bounds_counts_offsets_and_cache_positions() {
        let p = plain(4, 8, 8).weights_at(64, 8, true);
        assert!(p.in_bounds(&BoundElems {
            w: 64 + 64,
            bias: 16,
            ..exact(4, 8, 8)
        }));
        assert!(!p.in_bounds(&BoundElems {
            w: 64 + 63,
            bias: 16,
            ..exact(4, 8, 8)
        }));
        // Two sequences of 2 rows appended at position `pos` of a 5-row cache, 2 heads of 4.
        let seg = Segment {
            heads: 2,
            head_dim: 4,
            dst: 0,
        };
        let append_at = |pos| LinearParams::new(4, 8, 2, &[seg]).appending(5, pos);
        let y = |y| BoundElems {
            y,
            ..exact(4, 8, 8)
        };
        let needed = 2 * 2 * 5 * 4; // [B, H, capacity, d]
        assert!(append_at(3).in_bounds(&y(needed)));
        assert!(!append_at(3).in_bounds(&y(needed - 1)));
        // Past the capacity (position 4 + 2 rows > 5) the last row does not fit.
        assert!(!append_at(4).in_bounds(&y(needed)));
    }

    #[test]
    fn in_bounds_refuses_empty_problems_and_gapped_segments() {
        assert!(!plain(0, 4, 4).in_bounds(&exact(1, 4, 4)));
        let mut gapped = LinearParams::new(
            2,
            4,
            2,
            &[
                Segment {
                    heads: 1,
                    head_dim: 2,
                    dst: 0,
                },
                Segment {
                    heads: 1,
                    head_dim: 2,
                    dst: 4,
                },
            ],
        );
        assert!(gapped.in_bounds(&exact(2, 4, 4)));
        gapped.seg_start[1] = 3;
        assert!(!gapped.in_bounds(&exact(2, 4, 4)));
    }

    #[test]
    fn workgroups_cover_the_output_with_each_variant_tile() {
        let p = plain(129, 65, 4);
        assert_eq!(workgroups(&p, LinearVariant::Scalar), [2, 3, 1]);
        assert_eq!(workgroups(&p, LinearVariant::Vec4), [2, 2, 1]);
    }
}
