//! Page pools of llama.cpp's q8_0 and q4_0 blocks: ragged appends quantize each block as
//! `kv_dtype::quantize_block` does (each value within half a step of what was appended, a
//! q4_0 value at the clamp within a step and the f16 rounding of 8), pages copy whole, and a batch mixing prefill rows
//! and decode rows over the pages equals the f64 reference computed on the pool's own
//! dequantized contents within f32 error — NHD and HND. Bad input is an `Err` naming it.
//!
//! Small shapes and one batch per (type, layout): each pipeline variant costs seconds to compile
//! on lavapipe, and a run of this file compiles the append, the bodies the adapter takes (decode
//! rows and blocks of rows on a CPU adapter, the tiles on a GPU or with GPU shapes forced) and
//! the merge once per type.

mod common;

use common::gpu;
use wgpu_mha::kv_dtype::{self, BLOCK};
use wgpu_mha::reference::Core;
use wgpu_mha::serve::{
    BatchAttention, BatchOptions, KvLayout, PageTable, PagedKvPool, PlanInputs, PoolConfig,
};
use wgpu_mha::{GpuTensor, KvDtype, Mask, MaskTensor, Tensor};

const QUANTIZED: [KvDtype; 2] = [KvDtype::Q8_0, KvDtype::Q4_0];
/// Query heads, KV heads, head size (one block: neighbouring rows share a scale word, written
/// by different invocations and different appends), tokens per page.
const H: usize = 4;
const H_KV: usize = 2;
const D: usize = 32;
const PS: usize = 4;

/// Values in [-1, 1) by seed, every 29th scaled up (blocks of uneven magnitudes, and q4_0's
/// clamp reached).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            if i % 29 == 0 {
                v * 6.0
            } else {
                v
            }
        })
        .collect()
}

fn tensor(rows: usize, data: &[f32]) -> GpuTensor {
    GpuTensor::upload(
        gpu(),
        &Tensor::new([rows, H_KV, D], data.to_vec()).expect("tensor"),
    )
    .expect("upload")
}

/// Sequences' tokens, their pages (out of order, one page left unlisted) and the pool they are
/// appended into.
struct Batch {
    lens: Vec<usize>,
    table: PageTable,
    config: PoolConfig,
    pool: PagedKvPool,
    /// What was appended, `[max_pages, 2, ...]` in the pool's layout (zeros elsewhere), and
    /// which elements were written.
    appended: Vec<f32>,
    written: Vec<bool>,
}

impl Batch {
    /// `lens` tokens per sequence, appended ragged in two rounds (the first `first` tokens of
    /// every sequence, then the rest), so that neighbouring rows' blocks meet in a scale word
    /// from two appends as well as within one.
    fn append(dtype: KvDtype, layout: KvLayout, lens: &[usize], first: usize) -> Batch {
        let g = gpu();
        let pages: Vec<usize> = lens.iter().map(|l| l.div_ceil(PS)).collect();
        let max_pages = pages.iter().sum::<usize>() + 1;
        // Page ids backwards (a sequence's pages are not in position order); page 0 unlisted.
        let ids: Vec<u32> = (0..max_pages as u32).rev().collect();
        let mut table = PageTable {
            kv_indptr: vec![0],
            ..Default::default()
        };
        for (s, &n) in pages.iter().enumerate() {
            let at = table.kv_indices.len();
            table.kv_indices.extend_from_slice(&ids[at..at + n]);
            table.kv_indptr.push(table.kv_indices.len() as u32);
            table.kv_last_page_len.push((lens[s] - (n - 1) * PS) as u32);
        }
        let config = PoolConfig {
            max_pages,
            page_size: PS,
            kv_heads: H_KV,
            head_dim: D,
            layout,
            dtype,
        };
        let pool = PagedKvPool::new(g, config).expect("pool");
        let mut appended = vec![0.0f32; config.elements()];
        let mut written = vec![false; config.elements()];
        for (round, range) in [(0, 0..first), (1, first..usize::MAX)] {
            let mut slots = Vec::new();
            let mut where_ = Vec::new();
            for (s, &len) in lens.iter().enumerate() {
                for t in range.start.min(len)..range.end.min(len) {
                    let page = table.pages(s)[t / PS] as usize;
                    slots.push((page * PS + t % PS) as i64);
                    where_.push((page, t % PS));
                }
            }
            // A skipped token (negative slot) between the others.
            slots.insert(1, -1);
            where_.insert(1, (usize::MAX, 0));
            let n = slots.len();
            let k = values(n * H_KV * D, 10 + round);
            let v = values(n * H_KV * D, 20 + round);
            pool.append(g, &tensor(n, &k), &tensor(n, &v), &slots)
                .expect("append");
            for (t, &(page, offset)) in where_.iter().enumerate() {
                if page == usize::MAX {
                    continue;
                }
                for h in 0..H_KV {
                    for d in 0..D {
                        let e = (t * H_KV + h) * D + d;
                        for (which, x) in [(0, k[e]), (1, v[e])] {
                            let at = config.index(page, which, offset, h, d);
                            appended[at] = x;
                            written[at] = true;
                        }
                    }
                }
            }
        }
        Batch {
            lens: lens.to_vec(),
            table,
            config,
            pool,
            appended,
            written,
        }
    }

    /// Sequence `s`'s keys (`which` 0) or values `[tokens, H_kv·D]` from `pool` (host values in
    /// the pool's layout).
    fn gather(&self, pool: &[f32], s: usize, which: usize) -> Vec<f64> {
        let c = &self.config;
        let mut out = Vec::new();
        for t in 0..self.lens[s] {
            let page = self.table.pages(s)[t / PS] as usize;
            for h in 0..H_KV {
                for d in 0..D {
                    out.push(pool[c.index(page, which, t % PS, h, d)] as f64);
                }
            }
        }
        out
    }
}

/// Every block of the pool against what was appended into it: within half its step (q4_0 at
/// the clamp: a step), unwritten blocks zero.
fn check_blocks(label: &str, dtype: KvDtype, got: &[f32], appended: &[f32], written: &[bool]) {
    for (blk, ((g, a), w)) in got
        .chunks(BLOCK)
        .zip(appended.chunks(BLOCK))
        .zip(written.chunks(BLOCK))
        .enumerate()
    {
        if !w[0] {
            assert!(
                g.iter().all(|&x| x == 0.0),
                "{label}: block {blk} was never appended, holds {g:?}"
            );
            continue;
        }
        let (d, _) = kv_dtype::quantize_block(dtype, a);
        let d = d.to_f32().abs();
        let max = a
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        for (i, (&x, &y)) in a.iter().zip(g).enumerate() {
            // At q4_0's clamp (x/d ≥ 7.5, x up to 8 exact steps from 7 stored ones) a step, and
            // the f16 rounding of the step times 8: d · (1 + 8 · 2⁻¹¹).
            let clamped = dtype == KvDtype::Q4_0 && x * -8.0 / max >= 7.5;
            let bound = if clamped {
                d * (1.0 + 1.0 / 256.0)
            } else {
                d / 2.0 * (1.0 + 1e-6)
            };
            assert!(
                (x - y).abs() <= bound,
                "{label}: block {blk}[{i}] appended {x}, holds {y} (step {d})"
            );
        }
    }
}

#[test]
fn appended_blocks_round_trip_within_half_a_step_and_pages_copy_whole() {
    let g = gpu();
    for dtype in QUANTIZED {
        for layout in [KvLayout::Nhd, KvLayout::Hnd] {
            let label = format!("{dtype} {layout:?}");
            let b = Batch::append(dtype, layout, &[5, 3, 9], 2);
            let got = b.pool.read(g).expect("read");
            check_blocks(&label, dtype, &got, &b.appended, &b.written);
            // The words are the CPU quantizer's: the same pool uploaded from its values reads
            // back the same.
            let again = PagedKvPool::upload(g, b.config, &got).expect("upload");
            assert_eq!(again.read(g).expect("read"), got, "{label}: re-upload");
            // Copy on write: a listed page's quants and scales land in page 0, the unlisted one.
            let from = b.table.kv_indices[1];
            let mut encoder = g
                .device()
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            b.pool
                .record_copy_pages(g, &mut encoder, &[(from, 0)])
                .expect("copy");
            g.queue().submit([encoder.finish()]);
            let copied = b.pool.read(g).expect("read");
            let page = b.config.page_elements();
            let from = from as usize;
            assert_eq!(
                copied[..page],
                got[from * page..][..page],
                "{label}: copied page"
            );
            assert_eq!(copied[page..], got[page..], "{label}: other pages");
        }
    }
}

#[test]
fn mixed_prefill_and_decode_match_the_reference_on_the_dequantized_pool() {
    let g = gpu();
    // Decode rows (1 query row) beside blocks of rows, one sequence long enough that its keys
    // are split into chunks (items start mid-sequence, their states merged).
    let lens = [1, 7, 13, 300, 6];
    let rows = [1, 1, 5, 1, 6];
    let mut qo_indptr = vec![0u32];
    for r in rows {
        qo_indptr.push(qo_indptr[qo_indptr.len() - 1] + r as u32);
    }
    let total_q = qo_indptr[rows.len()] as usize;
    let q_host = values(total_q * H * D, 7);
    let q =
        GpuTensor::upload(g, &Tensor::new([total_q, H, D], q_host.clone()).expect("q")).expect("q");
    for dtype in QUANTIZED {
        for layout in [KvLayout::Nhd, KvLayout::Hnd] {
            let label = format!("{dtype} {layout:?}");
            let b = Batch::append(dtype, layout, &lens, 3);
            let options = BatchOptions {
                causal: true,
                return_lse: true,
                ..Default::default()
            };
            let plan = BatchAttention::plan(
                g,
                &PlanInputs {
                    qo_indptr: &qo_indptr,
                    table: &b.table,
                    num_qo_heads: H,
                    num_kv_heads: H_KV,
                    head_dim: D,
                    page_size: PS,
                    layout,
                    dtype,
                    options,
                },
            )
            .expect("plan");
            let out = GpuTensor::zeros(g, &[total_q, H, D]).expect("out");
            let lse = GpuTensor::zeros(g, &[total_q, H]).expect("lse");
            plan.run(&q, &b.pool, &out, Some(&lse)).expect("run");
            let got = out.read(g).expect("out").data().to_vec();
            let got_lse = lse.read(g).expect("lse").data().to_vec();

            // The reference over what the pool holds, dequantized on the host.
            let words = b.pool.read_words(g).expect("words");
            let stored = kv_dtype::dequantize(dtype, &words, b.config.elements()).expect("deq");
            let (mut want, mut want_lse) = (Vec::new(), Vec::new());
            for (s, (&lk, &lq)) in lens.iter().zip(&rows).enumerate() {
                let q0 = qo_indptr[s] as usize;
                let qs: Vec<f64> = q_host[q0 * H * D..(q0 + lq) * H * D]
                    .iter()
                    .map(|&x| x as f64)
                    .collect();
                let (k, v) = (b.gather(&stored, s, 0), b.gather(&stored, s, 1));
                let attend = (0..lq * lk)
                    .map(|e| (e % lk <= lk - lq + e / lk) as u8)
                    .collect();
                let mask = Mask::Attend(MaskTensor::new([lq, lk], attend).expect("mask"));
                let scale = 1.0 / (D as f64).sqrt();
                let core = Core {
                    batch: 1,
                    heads: H,
                    kv_heads: H_KV,
                    lq,
                    lk,
                    dk: D,
                    dv: D,
                    scale,
                    softcap: None,
                    alibi_max_bias: None,
                    temperature: None,
                    sinks: None,
                    mask: &mask,
                    top_left: false,
                };
                want.extend(core.run(&qs, &k, &v).0);
                for i in 0..lq {
                    for h in 0..H {
                        let kvh = h / (H / H_KV);
                        let scores: Vec<f64> = (0..=lk - lq + i)
                            .map(|j| {
                                let dot: f64 = (0..D)
                                    .map(|e| qs[(i * H + h) * D + e] * k[(j * H_KV + kvh) * D + e])
                                    .sum();
                                dot * scale
                            })
                            .collect();
                        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        want_lse.push(m + scores.iter().map(|x| (x - m).exp()).sum::<f64>().ln());
                    }
                }
            }
            let bodies: Vec<_> = plan.bodies().collect();
            let label = format!("{label}, bodies {bodies:?}");
            assert!(
                plan.chunk_keys() < 300,
                "{label}: the long sequence is split"
            );
            common::assert_within(&label, &got, &want, common::tolerance(&want));
            common::assert_within(&format!("{label} lse"), &got_lse, &want_lse, 1e-4);
            // The pool's blocks are the appended values' (the reference is not of garbage).
            check_blocks(&label, dtype, &stored, &b.appended, &b.written);
        }
    }
}

#[test]
fn quantized_pools_report_their_bytes_and_refuse_partial_blocks() {
    let g = gpu();
    let config = PoolConfig {
        dtype: KvDtype::Q8_0,
        ..PoolConfig::new(3, H_KV, D)
    };
    // K and V of 2 heads of 32: 4 blocks of 34 (q8_0) or 18 (q4_0) bytes per token.
    assert_eq!(config.bytes_per_token(), 4 * 34);
    let q4 = PoolConfig {
        dtype: KvDtype::Q4_0,
        ..config
    };
    assert_eq!(q4.bytes_per_token(), 4 * 18);
    assert_eq!(config.bytes(), KvDtype::Q8_0.bytes_for(config.elements()));
    assert_eq!(config.bytes(), 3 * 16 * 4 * 34);

    // Head size 40 is not whole blocks: the pool, the upload and the plan say so.
    let bad = PoolConfig {
        head_dim: 40,
        ..config
    };
    let err = PagedKvPool::new(g, bad).expect_err("head_dim 40 in q8_0");
    assert!(err.to_string().contains("head_dim 40"), "{err}");
    let err = PagedKvPool::upload(g, bad, &vec![0.0; bad.elements()]).expect_err("upload");
    assert!(err.to_string().contains("head_dim 40"), "{err}");
    let table = PageTable {
        kv_indptr: vec![0, 1],
        kv_indices: vec![0],
        kv_last_page_len: vec![1],
    };
    let inputs = |head_dim: usize, dtype: KvDtype| PlanInputs {
        qo_indptr: &[0, 1],
        table: &table,
        num_qo_heads: H,
        num_kv_heads: H_KV,
        head_dim,
        page_size: 16,
        layout: KvLayout::Nhd,
        dtype,
        options: BatchOptions::default(),
    };
    let err = BatchAttention::plan(g, &inputs(40, KvDtype::Q8_0)).expect_err("plan d40");
    assert!(err.to_string().contains("head_dim 40"), "{err}");

    // A plan for q4_0 pages refuses a q8_0 pool, naming both.
    let plan = BatchAttention::plan(g, &inputs(D, KvDtype::Q4_0)).expect("plan");
    let pool = PagedKvPool::new(g, config).expect("pool");
    let q = GpuTensor::zeros(g, &[1, H, D]).expect("q");
    let out = GpuTensor::zeros(g, &[1, H, D]).expect("out");
    let err = plan
        .run(&q, &pool, &out, None)
        .expect_err("q8_0 pool, q4_0 plan");
    assert!(
        err.to_string().contains("q8_0") && err.to_string().contains("q4_0"),
        "{err}"
    );
}
