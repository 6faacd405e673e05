//! `kv_append`: a step's new key and value rows, from the projection's scratch into the
//! chunks of a KV cache stored in several buffers ([`KvChunks`]): one dispatch per chunk the
//! new rows fall in, for K and for V.

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;
use crate::kernels::source::Prelude;
use crate::kernels::KvChunks;

pub const WGSL: &str = include_str!("../../shaders/kv_append.wgsl");
/// The parameters, source binding and walk over the rows both bodies share.
pub const PARAMS_WGSL: &str = include_str!("../../shaders/kv_append_params.wgsl");
/// Into a quantized chunk: one invocation per block of 32 values.
pub const QUANT_WGSL: &str = include_str!("../../shaders/kv_append_quant.wgsl");

/// Invocations per workgroup (one element each).
const WORKGROUP: u64 = 64;

/// Mirrors `AppendParams` in `kv_append_params.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AppendParams {
    pub blocks: u32,
    pub count: u32,
    pub width: u32,
    pub src_offset: u32,
    pub src_stride: u32,
    pub src_first: u32,
    pub dst_stride: u32,
    pub dst_first: u32,
    pub groups_x: u32,
    /// A quantized chunk's scales plane, in words (`kv_append_quant.wgsl`).
    pub dst_scales: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

/// The new rows of one of K or V: `count` rows from row 0 of each of `blocks` (B·H_kv)
/// blocks of `stride` rows of `width` at element `offset` of `scratch`, to keys `first..` of
/// the cache.
#[derive(Debug, Clone, Copy)]
pub struct NewRows<'a> {
    pub scratch: &'a wgpu::Buffer,
    pub offset: u32,
    pub stride: usize,
    pub blocks: usize,
    pub count: usize,
    pub width: usize,
    pub first: usize,
}

/// The full source: the element type, the shared walk over the rows, then the body; into
/// blocks of `kv_bits`-bit quants (8, 4) when not 0.
pub fn source(f16: bool, kv_bits: u32) -> String {
    let prelude = Prelude::new().elem("QkvElem", f16);
    match kv_bits {
        0 => prelude.source(&[super::GRID64_WGSL, PARAMS_WGSL, WGSL]),
        bits => prelude.u32("KV_BITS", bits).source(&[
            super::GRID64_WGSL,
            PARAMS_WGSL,
            super::KV_APPEND_BLOCK_WGSL,
            QUANT_WGSL,
        ]),
    }
}

const SLOTS: &[Slot] = &[Slot::Uniform(0), Slot::Read(1), Slot::Write(4)];

/// Copies `rows` into `chunks` (its K chunks when `keys`, else its V chunks).
pub fn dispatches(
    gpu: &Gpu,
    f16: bool,
    rows: NewRows,
    chunks: &KvChunks,
    keys: bool,
) -> Result<Vec<Dispatch>> {
    let bits = chunks.format.dtype.quant_bits();
    let label = format!("kv_append f16={f16} bits={bits}");
    let pass = gpu.compile(&label, &PassSpec::main("kv_append", SLOTS), || {
        source(f16, bits)
    });
    // A quantized chunk is written a block of 32 values per invocation.
    let per_invocation = if bits > 0 { crate::kv_dtype::BLOCK } else { 1 };
    let scales = if keys {
        chunks.format.k_scales
    } else {
        chunks.format.v_scales
    };
    let per_chunk = chunks.keys.max(1);
    let buffers = if keys { chunks.k } else { chunks.v };
    let mut chain = Vec::new();
    let mut done = 0;
    while done < rows.count {
        let key = rows.first + done;
        let chunk = key / per_chunk;
        let count = (rows.count - done).min((chunk + 1) * per_chunk - key);
        let Some(dst) = buffers.get(chunk) else {
            return Err(crate::error::Error::Misuse(format!(
                "key {key} is past the KV cache's {} chunks of {per_chunk}",
                buffers.len()
            )));
        };
        let elements = (rows.blocks * count * rows.width / per_invocation) as u64;
        let groups = elements.div_ceil(WORKGROUP).max(1);
        let max = gpu.limits().max_compute_workgroups_per_dimension as u64;
        let groups_x = groups.min(max);
        let workgroups = [groups_x as u32, groups.div_ceil(groups_x) as u32, 1];
        gpu.check_workgroups("kv_append", workgroups)?;
        let p = AppendParams {
            blocks: rows.blocks as u32,
            count: count as u32,
            width: rows.width as u32,
            src_offset: rows.offset,
            src_stride: rows.stride as u32,
            src_first: done as u32,
            dst_stride: per_chunk as u32,
            dst_first: (key - chunk * per_chunk) as u32,
            groups_x: groups_x as u32,
            dst_scales: scales,
            ..Default::default()
        };
        chain.push(Dispatch::new(
            gpu,
            pass.clone(),
            &p,
            &[(1, rows.scratch), (4, dst)],
            workgroups,
        )?);
        done += count;
    }
    Ok(chain)
}
