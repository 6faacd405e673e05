//! `linear`: `Y = X·Wᵀ + b`, tiled GEMM writing straight into head-split layout.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::Gpu;

use super::{Checks, Pass, Slot, GEMM_TILE_WGSL};

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
    /// (`Unsupported` without SUBGROUP, `Config` when the vec4 preconditions do not hold).
    pub fn check(self, gpu: &Gpu, p: &LinearParams, bound: &BoundElems) -> Result<()> {
        if self == LinearVariant::Subgroup && !gpu.has_subgroups() {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: "the subgroup linear variant needs the SUBGROUP feature".into(),
            });
        }
        if self != LinearVariant::Scalar && !vec4_ok(p, bound) {
            return Err(Error::Config(format!(
                "the {self:?} linear variant needs K % 4 == 0, 4-aligned offsets and every \
                 index in range (K {}, x_offset {}, w_offset {})",
                p.k, p.x_offset, p.w_offset
            )));
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
    if !vec4_ok(p, bound) {
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
/// instead of 24. So: CPU adapters with SUBGROUP whose subgroups are at least 8 wide (narrower
/// ones never take its shared path). Not measured on a GPU, where the 8 threads' identical X
/// loads likely hit one cached line anyway and the shuffles and layout check are extra work:
/// GPUs keep `Vec4` until a bench there (it prints both variants) shows otherwise.
pub fn subgroup_preferred(gpu: &Gpu) -> bool {
    let info = gpu.info();
    gpu.has_subgroups() && info.device_type == wgpu::DeviceType::Cpu && info.subgroup_min_size >= 8
}

/// The precondition of both vec4 variants (`Vec4`, `Subgroup`), which run unchecked.
fn vec4_ok(p: &LinearParams, bound: &BoundElems) -> bool {
    p.k.is_multiple_of(4)
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
    pub _pad: [u32; 2],
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
}

/// The full source of one variant (the scalar one needs the shared GEMM tile prepended).
pub fn source(variant: LinearVariant) -> String {
    match variant {
        LinearVariant::Scalar => format!("{PARAMS_WGSL}\n{GEMM_TILE_WGSL}\n{WGSL}"),
        LinearVariant::Vec4 => format!("{PARAMS_WGSL}\n{VEC4_BLOCK_WGSL}\n{WGSL_VEC4}"),
        LinearVariant::Subgroup => {
            format!("{PARAMS_WGSL}\n{VEC4_BLOCK_WGSL}\n{WGSL_SUBGROUP}")
        }
    }
}

/// Bindings of every `linear` variant: params, X, W, bias, Y.
const SLOTS: &[Slot] = &[
    Slot::Uniform(0),
    Slot::Read(1),
    Slot::Read(2),
    Slot::Read(3),
    Slot::Write(4),
];

/// The compiled pass of a variant, shared by everything on this device.
pub(crate) fn pass(gpu: &Gpu, variant: LinearVariant) -> Arc<Pass> {
    let key = match variant {
        LinearVariant::Scalar => "linear",
        LinearVariant::Vec4 => "linear_vec4",
        LinearVariant::Subgroup => "linear_subgroup",
    };
    gpu.pass(key, || build(gpu.device(), variant))
}

fn build(device: &wgpu::Device, variant: LinearVariant) -> Pass {
    // The vec4 variants run without wgpu's runtime bounds checks (about 1.8× faster on
    // lavapipe): `variant()` and `LinearVariant::check` let them run only dispatches whose every
    // index `LinearParams::in_bounds` proves in range. The scalar variant keeps the checks.
    let checks = match variant {
        LinearVariant::Scalar => Checks::Checked,
        LinearVariant::Vec4 | LinearVariant::Subgroup => Checks::Unchecked,
    };
    Pass::build(device, "linear", &source(variant), "main", checks, SLOTS)
}

/// Where an f16 `linear` writes: f16 head-split Q/K/V, or f32 (the output projection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum F16Output {
    /// Q/K/V projections: f16 weights in, f16 head-split output.
    Half,
    /// `W_o`: f32 combined heads and f16 weights in, f32 output.
    Full,
}

/// The scalar `linear` shader rewritten for f16 weights (`array<f16>`, widened to f32 on load,
/// so accumulation stays f32) and, for [`F16Output::Half`], an f16 output (`f16(v)` on store).
/// X and the bias stay f32. Needs `SHADER_F16`; `enable f16;` comes first.
pub fn source_f16(output: F16Output) -> String {
    let mut body = WGSL
        .replace(
            "var<storage, read> w: array<f32>;",
            "var<storage, read> w: array<f16>;",
        )
        .replace(
            "return w[p.w_offset + col * p.k + k];",
            "return f32(w[p.w_offset + col * p.k + k]);",
        );
    if output == F16Output::Half {
        body = body
            .replace(
                "var<storage, read_write> y: array<f32>;",
                "var<storage, read_write> y: array<f16>;",
            )
            .replace(
                "y[dst_index(row, col)] = v;",
                "y[dst_index(row, col)] = f16(v);",
            );
    }
    format!("enable f16;\n{PARAMS_WGSL}\n{GEMM_TILE_WGSL}\n{body}")
}

/// The f16 scalar `linear` pass (runtime bounds checks on, like the f32 scalar one).
pub(crate) fn pass_f16(gpu: &Gpu, output: F16Output) -> Arc<Pass> {
    let key = match output {
        F16Output::Half => "linear f16 out=f16",
        F16Output::Full => "linear f16 out=f32",
    };
    gpu.pass(key, || {
        Pass::build(
            gpu.device(),
            "linear",
            &source_f16(output),
            "main",
            Checks::Checked,
            SLOTS,
        )
    })
}

/// Output tile (rows, columns) of one workgroup of a variant.
pub fn tile(variant: LinearVariant) -> (u32, u32) {
    match variant {
        LinearVariant::Scalar => (64, 64),
        LinearVariant::Vec4 | LinearVariant::Subgroup => (8 * VEC4_ROWS, 8 * VEC4_COLS),
    }
}

/// Rows and columns per thread of `linear_vec4.wgsl` and `linear_subgroup.wgsl` (`RB`, `CB`
/// there; 64 threads as 8×8).
const VEC4_ROWS: u32 = 16;
const VEC4_COLS: u32 = 8;

/// Workgroups covering the output with the tiles of `variant`.
pub fn workgroups(p: &LinearParams, variant: LinearVariant) -> [u32; 3] {
    let (tm, tn) = tile(variant);
    [p.n.div_ceil(tn), p.m.div_ceil(tm), 1]
}
