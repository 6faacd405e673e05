//! `bench --only serve --config serve:kv=q8_0+q4_0` (see `bench_serve`): the mixed decode step
//! over pools of quantized (or other) types against a float pool, in one run.

use wgpu_mha::error::Result;
use wgpu_mha::gpu::Gpu;
use wgpu_mha::serve::KvLayout;
use wgpu_mha::KvDtype;

use super::batch::PagedBatch;
use super::{describe, kv_dtype, or_skip, with_probes, ServeResult, ServeSize};
use crate::cli::bench::Timed;
use crate::cli::bench_decode::{probe_jobs, Bounds};

/// (e) `kv=`: the mixed decode step over a pool of each type in `size.kv` and over a float
/// pool (f16, or f32 without SHADER_F16), each checked, then all timed in turn with the read
/// probes; each row's `vs_f16` / `vs_f32` is its time over the float pool's.
pub(super) fn kv_decode(
    gpu: &Gpu,
    size: &ServeSize,
    timed: &impl Fn(&[&dyn Timed]) -> Result<Vec<f64>>,
    rows: &mut Vec<ServeResult>,
    report: &mut impl FnMut(&ServeResult),
) -> Result<()> {
    let seqs = size.mixed_decode();
    let shape = describe(&seqs);
    let base = kv_dtype(gpu.has_f16());
    let mut dtypes = vec![base];
    dtypes.extend(size.kv.iter().copied().filter(|&d| d != base));
    let names: Vec<_> = dtypes
        .iter()
        .map(|d| ("kv_decode", d.name(), shape.clone(), "NHD"))
        .collect();
    let built = (|| -> Result<_> {
        let batches = dtypes
            .iter()
            .map(|&d| PagedBatch::new(gpu, &seqs, (d, KvLayout::Nhd), false, 11))
            .collect::<Result<Vec<_>>>()?;
        let probes = probe_jobs(gpu, batches[0].kv_bytes())?;
        Ok((batches, probes))
    })();
    let Some((batches, probes)) = or_skip(built, &names, rows, report)? else {
        return Ok(());
    };
    for (b, d) in batches.iter().zip(&dtypes) {
        b.check(gpu, &format!("{d} mixed decode"))?;
    }
    let jobs: Vec<&dyn Timed> = batches.iter().map(|b| b as &dyn Timed).collect();
    let ms = timed(&with_probes(jobs, &probes))?;
    let n = batches.len();
    let bounds = Bounds::measure(&probes, &ms[n..], batches[0].kv_bytes());
    let ratio = match base {
        KvDtype::F16 => "vs_f16",
        _ => "vs_f32",
    };
    for (i, (b, d)) in batches.iter().zip(&dtypes).enumerate() {
        let bytes = b.kv_bytes();
        let r = ServeResult {
            variant: "kv_decode",
            dtype: d.name(),
            shape: shape.clone(),
            kv_layout: "NHD",
            step_ms: ms[i],
            kv_gbps: bytes as f64 / ms[i] / 1e6,
            bounds: bounds.clone(),
            extra: vec![(ratio, ms[i] / ms[0]), ("kv_mib", bytes as f64 / 1048576.0)],
            skipped: None,
        };
        report(&r);
        rows.push(r);
    }
    Ok(())
}
