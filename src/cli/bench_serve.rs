//! `wgpu-mha bench --only serve` (sizes divided by `--config serve:div=N`): batched paged
//! attention ([`wgpu_mha::serve::BatchAttention`]) at the serving shapes, H 32, H_kv 8,
//! D 128, pages of 16 tokens, random page data, pages in shuffled order:
//!
//! - `mixed_decode`: a B16 decode step over 15 × 1,024 + 1 × 32,768 tokens;
//! - `uniform_decode`: the same total as 16 × 3,008, timed in turn with the mixed step; its
//!   `skew_ratio` is the mixed step's time over the uniform one's;
//! - `paged_vs_contiguous`: 1 × 32,768 and 16 × 2,048, the paged step against the contiguous
//!   decode pass (`bench --only decode`'s) over the same keys and values, f32 (the contiguous
//!   pass has no f16 cache); `paged_vs_contiguous` = contiguous ms / paged ms (> 1: paged is
//!   faster); two rows per size, the step over an NHD pool and over an HND one holding the same
//!   values (`kv_layout`), the three timed in turn (every other row's pool is NHD);
//! - `mixed_step`: four causal prefill chunks of 256 rows ending at 256, 1,280, 4,352 and 8,448
//!   tokens, and 12 decode rows over 1,024 tokens, in GFLOP/s against the fused core
//!   (`flash_attention`) on B1 H32 Lq 256 Lk 3,584 (the chunks' mean context) d128, no mask,
//!   in the row's data type; `vs_flash` is their ratio.
//!
//! With `--config serve:kv=q8_0+q4_0` (any of f32, f16, q8_0, q4_0, `+`-separated, beside
//! `div=`) the bench runs only `kv_decode`: the mixed decode step over pools of each listed type
//! and of f16 (f32 where the adapter has no SHADER_F16), each checked against the f64 reference
//! over its pool's own (dequantized) contents, then timed in turn; `vs_f16` (or `vs_f32`) is
//! each type's step time over the float pool's.
//!
//! Every row carries both read bounds measured in the same run: the fastest read-probe shape
//! over the step's K/V bytes (`probe_gbps`), timed in turn with the step, and the host's read
//! bandwidth over as many bytes (`host_read_gbps`). Each step's output is checked (sampled
//! rows against an f64 reference over the pages; the paged decode against the contiguous pass
//! element by element) before anything is timed. A row that cannot run here (a pool past one
//! storage binding, f16 without SHADER_F16) says why and is skipped.

use wgpu_mha::error::{Error, Result};
use wgpu_mha::gpu::Gpu;
use wgpu_mha::kernels::read_probe::ProbeShape;
use wgpu_mha::kernels::standalone::{Core, CoreDims, Job};
use wgpu_mha::model::mask::Mask;
use wgpu_mha::serve::KvLayout;
use wgpu_mha::KvDtype;

use super::bench::Timed;
use super::bench_decode::{probe_jobs, Bounds};
mod batch;
mod kv;

use batch::{close, PagedBatch, Rng};

pub(super) const HEADS: usize = 32;
pub(super) const KV_HEADS: usize = 8;
pub(super) const HEAD_DIM: usize = 128;
pub(super) const PAGE: usize = 16;

/// The sizes of a serve bench: every token count (contexts, prefill rows) divided by `div`;
/// with pool types in `kv`, only the mixed decode over pools of those types and a float one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeSize {
    pub div: usize,
    pub kv: Vec<KvDtype>,
}

impl Default for ServeSize {
    /// The sizes.
    fn default() -> Self {
        ServeSize {
            div: 1,
            kv: Vec::new(),
        }
    }
}

impl ServeSize {
    /// `serve:div=16` (or `serve:` for the full sizes): `div` a power of two from 1 to 256;
    /// `kv=q8_0+q4_0`: pool types (f32, f16, q8_0, q4_0) whose mixed decode is timed against a
    /// float pool's.
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |why: String| Error::Misuse(format!("serve bench spec `{spec}`: {why}"));
        let body = spec
            .strip_prefix("serve:")
            .ok_or_else(|| bad("expected `serve:` and optionally `div=N`, `kv=…`".into()))?;
        let mut size = ServeSize::default();
        for pair in body.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("`{pair}` is not key=value")))?;
            if key.trim() == "kv" {
                for name in value.split('+') {
                    let dtype = KvDtype::parse(name.trim()).map_err(|e| bad(e.to_string()))?;
                    if !size.kv.contains(&dtype) {
                        size.kv.push(dtype);
                    }
                }
                if size.kv.is_empty() {
                    return Err(bad("kv= lists no pool type".into()));
                }
                continue;
            }
            if key.trim() != "div" {
                return Err(bad(format!("unknown key `{}` (div, kv)", key.trim())));
            }
            size.div = value
                .trim()
                .parse()
                .ok()
                .filter(|&v: &usize| v.is_power_of_two() && v <= 256)
                .ok_or_else(|| {
                    bad(format!(
                        "`{pair}`: div must be a power of two from 1 to 256"
                    ))
                })?;
        }
        Ok(size)
    }

    fn tokens(&self, n: usize) -> usize {
        (n / self.div).max(1)
    }

    /// `(kv tokens, query rows)` of each sequence of the mixed decode step.
    pub(super) fn mixed_decode(&self) -> Vec<(usize, usize)> {
        let mut seqs = vec![(self.tokens(1_024), 1); 15];
        seqs.push((self.tokens(32_768), 1));
        seqs
    }

    /// As many tokens as [`mixed_decode`](Self::mixed_decode) over 16 equal sequences.
    fn uniform_decode(&self) -> Vec<(usize, usize)> {
        let total: usize = self.mixed_decode().iter().map(|s| s.0).sum();
        vec![(total.div_ceil(16), 1); 16]
    }

    fn mixed_step(&self) -> Vec<(usize, usize)> {
        let rows = self.tokens(256);
        let mut seqs: Vec<(usize, usize)> = [0, 1_024, 4_096, 8_192]
            .iter()
            .map(|&before| (before / self.div + rows, rows))
            .collect();
        seqs.extend([(self.tokens(1_024), 1); 12]);
        seqs
    }
}

/// `(sequences, context)` of the paged-vs-contiguous rows.
fn contiguous_shapes(size: &ServeSize) -> [(usize, usize); 2] {
    [(1, size.tokens(32_768)), (16, size.tokens(2_048))]
}

/// A row's `variant`, `dtype`, `shape` and `kv_layout`, known before it runs (what a skipped
/// row reports).
pub(super) type RowName = (&'static str, &'static str, String, &'static str);

/// One row of the serve bench.
#[derive(Debug, Clone)]
pub struct ServeResult {
    pub variant: &'static str,
    pub dtype: &'static str,
    /// The batch: `15x1024+1x32768`, `4x256@256/1280/4352/8448+12x1024`, …
    pub shape: String,
    /// The pool's layout: `NHD` (every row) or `HND` (the second `paged_vs_contiguous` row of
    /// each size).
    pub kv_layout: &'static str,
    pub step_ms: f64,
    pub kv_gbps: f64,
    pub bounds: Bounds,
    /// The row's own figures: `skew_ratio`, `paged_vs_contiguous`, `vs_flash`, and what they
    /// are made of.
    pub extra: Vec<(&'static str, f64)>,
    pub skipped: Option<String>,
}

impl ServeResult {
    fn skipped(name: &RowName, why: String) -> Self {
        let (variant, dtype, shape, kv_layout) = name.clone();
        ServeResult {
            variant,
            dtype,
            shape,
            kv_layout,
            step_ms: 0.0,
            kv_gbps: 0.0,
            bounds: Bounds::default(),
            extra: Vec::new(),
            skipped: Some(why),
        }
    }

    pub fn json(&self, gpu: &Gpu) -> serde_json::Value {
        let mut row = serde_json::json!({
            "name": format!(
                "serve:{}:{}:{}{}",
                self.variant,
                self.dtype,
                self.shape,
                self.layout_tag(":")
            ),
            "variant": self.variant,
            "dtype": self.dtype,
            "shape": self.shape,
            "kv_layout": self.kv_layout,
            "heads": HEADS,
            "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "page_size": PAGE,
            "skipped": self.skipped,
            "adapter": gpu.describe(),
        });
        if let (None, Some(obj)) = (&self.skipped, row.as_object_mut()) {
            obj.insert("step_ms".into(), self.step_ms.into());
            obj.insert("kv_gbps".into(), self.kv_gbps.into());
            obj.insert("probe_gbps".into(), self.bounds.probe_gbps.into());
            obj.insert("probe_shapes".into(), self.bounds.shapes_json());
            obj.insert("host_read_gbps".into(), self.bounds.host_read_gbps.into());
            for (k, v) in &self.extra {
                obj.insert((*k).into(), (*v).into());
            }
        }
        row
    }

    /// `HND` after `sep` for an HND pool's row, nothing for the default NHD.
    fn layout_tag(&self, sep: &str) -> String {
        match self.kv_layout {
            "NHD" => String::new(),
            other => format!("{sep}{other}"),
        }
    }

    pub fn format(&self) -> String {
        let head = format!(
            "serve {} {}{} [{}]",
            self.variant,
            self.dtype,
            self.layout_tag(" "),
            self.shape
        );
        if let Some(why) = &self.skipped {
            return format!("{head}: skipped: {why}\n");
        }
        let extra: Vec<String> = self
            .extra
            .iter()
            .map(|(k, v)| format!("{k} {v:.3}"))
            .collect();
        format!(
            "{head}: step {:.3} ms, K/V {:.2} GB/s = {:.2}x of the read probe ({:.2} GB/s), host read {:.2} GB/s{}{}\n",
            self.step_ms,
            self.kv_gbps,
            self.kv_gbps / self.bounds.probe_gbps,
            self.bounds.probe_gbps,
            self.bounds.host_read_gbps,
            if extra.is_empty() { "" } else { "; " },
            extra.join(", ")
        )
    }
}

/// Whether an error means "this does not fit or run here" (the row is skipped with it) rather
/// than a failure.
fn cannot_run_here(e: &Error) -> bool {
    matches!(e, Error::TooLarge { .. } | Error::Unsupported { .. })
}

/// `a` on success; on an error that says it cannot run here, `Ok(None)` after pushing skipped
/// rows with the reason; any other error as it is.
pub(super) fn or_skip<T>(
    r: Result<T>,
    rows: &[RowName],
    out: &mut Vec<ServeResult>,
    report: &mut impl FnMut(&ServeResult),
) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if cannot_run_here(&e) => {
            for name in rows {
                let r = ServeResult::skipped(name, e.to_string());
                report(&r);
                out.push(r);
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Runs the fused core once and checks its first and last row of its first and last head
/// (`q [1, H, Lq, D]`, `k`, `v [1, H, Lk, D]`, out `[1, Lq, H·D]`) against f64.
fn check_flash(
    job: &Job,
    dims: CoreDims,
    (q, k, v): &(Vec<f32>, Vec<f32>, Vec<f32>),
) -> Result<()> {
    job.run(None)?;
    let got = job.read()?;
    let (lq, lk, d) = (dims.lq, dims.lk, HEAD_DIM);
    let scale = 1.0 / (d as f64).sqrt();
    for h in [0, HEADS - 1] {
        for i in [0, lq - 1] {
            let q = &q[(h * lq + i) * d..][..d];
            let scores: Vec<f64> = (0..lk)
                .map(|j| {
                    let key = &k[(h * lk + j) * d..][..d];
                    q.iter()
                        .zip(key)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            for e in 0..d {
                let want = (0..lk)
                    .map(|j| weights[j] * v[(h * lk + j) * d + e] as f64)
                    .sum::<f64>()
                    / sum;
                let o = got[(i * HEADS + h) * d + e] as f64;
                if !close(o, want, 1e-4) {
                    return Err(Error::Misuse(format!(
                        "the fused core gives {o} at row {i}, head {h}, element {e}; the f64 \
                         reference {want} (nothing was timed)"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// `first`, then every probe job, to be timed in turn.
pub(super) fn with_probes<'a>(
    mut first: Vec<&'a dyn Timed>,
    probes: &'a [(ProbeShape, Job)],
) -> Vec<&'a dyn Timed> {
    first.extend(probes.iter().map(|(_, p)| p as &dyn Timed));
    first
}

pub(super) fn describe(seqs: &[(usize, usize)]) -> String {
    let mut parts: Vec<(usize, (usize, usize))> = Vec::new();
    for &s in seqs {
        match parts.last_mut() {
            Some((n, last)) if *last == s => *n += 1,
            _ => parts.push((1, s)),
        }
    }
    parts
        .iter()
        .map(|&(n, (kv, rows))| match rows {
            1 => format!("{n}x{kv}"),
            _ => format!("{n}x{rows}rows@{kv}"),
        })
        .collect::<Vec<_>>()
        .join("+")
}

/// Every row of the serve bench at `size`, each printed through `report` as it lands.
pub fn run(
    gpu: &Gpu,
    size: ServeSize,
    time_in_turn: impl Fn(&[&dyn Timed]) -> Result<Vec<f64>>,
    mut report: impl FnMut(&ServeResult),
) -> Result<Vec<ServeResult>> {
    let mut rows = Vec::new();
    let timed = |jobs: &[&dyn Timed]| -> Result<Vec<f64>> {
        let ms = time_in_turn(jobs)?;
        match ms.len() == jobs.len() && ms.iter().all(|m| m.is_finite() && *m > 0.0) {
            true => Ok(ms),
            false => Err(Error::Misuse(format!(
                "the timer gave {ms:?} for {} jobs",
                jobs.len()
            ))),
        }
    };

    if !size.kv.is_empty() {
        kv::kv_decode(gpu, &size, &timed, &mut rows, &mut report)?;
        return Ok(rows);
    }

    // (a) + (b): the mixed and the uniform decode step, timed in turn.
    for (f16, dtype) in [(true, "f16"), (false, "f32")] {
        let (mixed_seqs, uniform_seqs) = (size.mixed_decode(), size.uniform_decode());
        let names = [
            ("mixed_decode", dtype, describe(&mixed_seqs), "NHD"),
            ("uniform_decode", dtype, describe(&uniform_seqs), "NHD"),
        ];
        let built = (|| -> Result<_> {
            let mixed =
                PagedBatch::new(gpu, &mixed_seqs, (kv_dtype(f16), KvLayout::Nhd), false, 11)?;
            let uniform = PagedBatch::new(
                gpu,
                &uniform_seqs,
                (kv_dtype(f16), KvLayout::Nhd),
                false,
                12,
            )?;
            let probes = probe_jobs(gpu, mixed.kv_bytes())?;
            Ok((mixed, uniform, probes))
        })();
        let Some((mixed, uniform, probes)) = or_skip(built, &names, &mut rows, &mut report)? else {
            continue;
        };
        mixed.check(gpu, "mixed decode")?;
        uniform.check(gpu, "uniform decode")?;
        let ms = timed(&with_probes(vec![&mixed, &uniform], &probes))?;
        for (i, batch) in [&mixed, &uniform].into_iter().enumerate() {
            let bytes = batch.kv_bytes();
            let r = ServeResult {
                variant: names[i].0,
                dtype,
                shape: names[i].2.clone(),
                kv_layout: "NHD",
                step_ms: ms[i],
                kv_gbps: bytes as f64 / ms[i] / 1e6,
                bounds: Bounds::measure(&probes, &ms[2..], bytes),
                extra: match i {
                    0 => vec![("skew_ratio", ms[0] / ms[1])],
                    _ => vec![("skew_ratio", ms[0] / ms[1]), ("mixed_ms", ms[0])],
                },
                skipped: None,
            };
            report(&r);
            rows.push(r);
        }
    }

    // (c): paged against the contiguous decode pass on the same keys and values, over pools
    // of either layout (the same values in each), the three timed in turn.
    for (batch, ctx) in contiguous_shapes(&size) {
        let seqs = vec![(ctx, 1); batch];
        let shape = describe(&seqs);
        let names = [
            ("paged_vs_contiguous", "f32", shape.clone(), "NHD"),
            ("paged_vs_contiguous", "f32", shape.clone(), "HND"),
        ];
        let built = (|| -> Result<_> {
            let nhd = PagedBatch::new(gpu, &seqs, (KvDtype::F32, KvLayout::Nhd), false, 13)?;
            let hnd = PagedBatch::new(gpu, &seqs, (KvDtype::F32, KvLayout::Hnd), false, 13)?;
            let dims = CoreDims {
                batch,
                heads: HEADS,
                lq: 1,
                lk: ctx,
                qk_head_dim: HEAD_DIM,
                v_head_dim: HEAD_DIM,
            };
            let (k, v) = (nhd.contiguous(0), nhd.contiguous(1));
            let scale = 1.0 / (HEAD_DIM as f32).sqrt();
            let contiguous = Job::decode(gpu, (&nhd.q_host, &k, &v), dims, KV_HEADS, scale)?;
            let probes = probe_jobs(gpu, nhd.kv_bytes())?;
            Ok((nhd, hnd, contiguous, probes))
        })();
        let Some((nhd, hnd, contiguous, probes)) = or_skip(built, &names, &mut rows, &mut report)?
        else {
            continue;
        };
        contiguous.run(None)?;
        let want = contiguous.read()?;
        for (paged, name) in [&nhd, &hnd].into_iter().zip(&names) {
            let layout = name.3;
            let got = paged.check(gpu, "paged decode")?;
            if let Some((i, (a, b))) = got
                .iter()
                .zip(&want)
                .enumerate()
                .find(|(_, (a, b))| !close(**a as f64, **b as f64, 1e-4))
            {
                return Err(Error::Misuse(format!(
                    "{shape}: the paged step over an {layout} pool gives {a} at element {i}, \
                     the contiguous decode pass {b} (nothing was timed)"
                )));
            }
        }
        let ms = timed(&with_probes(vec![&nhd, &hnd, &contiguous], &probes))?;
        let bytes = nhd.kv_bytes();
        for (i, (variant, dtype, shape, kv_layout)) in names.iter().cloned().enumerate() {
            let r = ServeResult {
                variant,
                dtype,
                shape,
                kv_layout,
                step_ms: ms[i],
                kv_gbps: bytes as f64 / ms[i] / 1e6,
                bounds: Bounds::measure(&probes, &ms[3..], bytes),
                extra: vec![
                    ("paged_vs_contiguous", ms[2] / ms[i]),
                    ("contiguous_ms", ms[2]),
                    ("contiguous_kv_gbps", bytes as f64 / ms[2] / 1e6),
                ],
                skipped: None,
            };
            report(&r);
            rows.push(r);
        }
    }

    // (d): prefill chunks and decode rows in one step, against the fused core.
    let step_seqs = size.mixed_step();
    let rows_per_chunk = step_seqs[0].1;
    let chunks = &step_seqs[..4];
    let mean_ctx = chunks.iter().map(|s| s.0).sum::<usize>() / chunks.len();
    let flash_dims = CoreDims {
        batch: 1,
        heads: HEADS,
        lq: rows_per_chunk,
        lk: mean_ctx,
        qk_head_dim: HEAD_DIM,
        v_head_dim: HEAD_DIM,
    };
    let flash_gflop = 4.0 * (HEADS * rows_per_chunk * mean_ctx * HEAD_DIM) as f64 / 1e9;
    for (f16, dtype) in [(true, "f16"), (false, "f32")] {
        let names = [("mixed_step", dtype, describe(&step_seqs), "NHD")];
        let built = (|| -> Result<_> {
            let step = PagedBatch::new(gpu, &step_seqs, (kv_dtype(f16), KvLayout::Nhd), true, 14)?;
            let mut rng = Rng(15);
            let z = HEADS * HEAD_DIM;
            // The f16 step's baseline reads f16 keys and values too (and f16 queries: the fused
            // core stores q, k and v alike): the same data type on both sides of the ratio, and
            // the reference uses the rounded values.
            let stored = |x: Vec<f32>| -> Vec<f32> {
                match f16 {
                    true => x
                        .into_iter()
                        .map(|e| half::f16::from_f32(e).to_f32())
                        .collect(),
                    false => x,
                }
            };
            let (q, k, v) = (
                stored(rng.floats(z * rows_per_chunk)),
                stored(rng.floats(z * mean_ctx)),
                stored(rng.floats(z * mean_ctx)),
            );
            let scale = 1.0 / (HEAD_DIM as f32).sqrt();
            let flash = match f16 {
                true => Job::fused_f16_kv(gpu, (&q, &k, &v), flash_dims, scale)?,
                false => Job::core(
                    gpu,
                    Core::Fused,
                    (&q, &k, &v),
                    flash_dims,
                    scale,
                    &Mask::None,
                )?,
            };
            let probes = probe_jobs(gpu, step.kv_bytes())?;
            Ok((step, flash, (q, k, v), probes))
        })();
        let Some((step, flash, flash_inputs, probes)) =
            or_skip(built, &names, &mut rows, &mut report)?
        else {
            continue;
        };
        step.check(gpu, "mixed step")?;
        check_flash(&flash, flash_dims, &flash_inputs)?;
        let ms = timed(&with_probes(vec![&step, &flash], &probes))?;
        let bytes = step.kv_bytes();
        let gflops = step.gflop() / ms[0] * 1e3;
        let flash_gflops = flash_gflop / ms[1] * 1e3;
        let r = ServeResult {
            variant: names[0].0,
            dtype,
            shape: names[0].2.clone(),
            kv_layout: "NHD",
            step_ms: ms[0],
            kv_gbps: bytes as f64 / ms[0] / 1e6,
            bounds: Bounds::measure(&probes, &ms[2..], bytes),
            extra: vec![
                ("gflops", gflops),
                ("flash_gflops", flash_gflops),
                ("vs_flash", gflops / flash_gflops),
            ],
            skipped: None,
        };
        report(&r);
        rows.push(r);
    }
    Ok(rows)
}

/// The float pool type of `f16`.
pub(super) fn kv_dtype(f16: bool) -> KvDtype {
    match f16 {
        true => KvDtype::F16,
        false => KvDtype::F32,
    }
}

#[cfg(test)]
mod tests {
    use super::{KvDtype, ServeSize};

    #[test]
    fn sizes_parse_and_divide_every_token_count() {
        assert_eq!(ServeSize::parse("serve:").unwrap(), ServeSize::default());
        let kv = ServeSize::parse("serve:div=4,kv=q8_0+Q4_0+q8_0").unwrap();
        assert_eq!((kv.div, kv.kv), (4, vec![KvDtype::Q8_0, KvDtype::Q4_0]));
        let s = ServeSize::parse("serve:div=64").unwrap();
        assert_eq!(s.mixed_decode().iter().map(|x| x.0).sum::<usize>(), 752);
        assert_eq!(s.uniform_decode(), vec![(47, 1); 16]);
        assert_eq!(s.mixed_step()[..4], [(4, 4), (20, 4), (68, 4), (132, 4)]);
        let full = ServeSize::default();
        assert_eq!(full.uniform_decode(), vec![(3_008, 1); 16]);
        assert_eq!(
            full.mixed_step()[..4],
            [(256, 256), (1_280, 256), (4_352, 256), (8_448, 256)]
        );
        for bad in [
            "serve:div=0",
            "serve:div=3",
            "serve:div=512",
            "serve:x=1",
            "serve:kv=",
            "serve:kv=q5_1",
            "decode:",
        ] {
            assert!(ServeSize::parse(bad).is_err(), "{bad}");
        }
    }
}
