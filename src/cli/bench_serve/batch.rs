//! The serve bench's batches: one step of sequences over a page pool of random data in
//! shuffled page order, with the host copies its f64 check reads (see `bench_serve`).

use wgpu_mha::error::{Error, Result};
use wgpu_mha::gpu::timer::PassTimer;
use wgpu_mha::gpu::Gpu;
use wgpu_mha::kv_dtype::{self, KvDtype};
use wgpu_mha::model::tensor::Tensor;
use wgpu_mha::serve::{
    BatchAttention, BatchOptions, KvLayout, PageTable, PagedKvPool, PlanInputs, PoolConfig,
};
use wgpu_mha::GpuTensor;

use super::{HEADS, HEAD_DIM, KV_HEADS, PAGE};
use crate::cli::bench::Timed;

/// SplitMix64 → uniform floats in [-1, 1).
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn float(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(super) fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.float()).collect()
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// One step of a batch on the device, with the host copies its check reads.
pub(super) struct PagedBatch {
    pub(super) plan: BatchAttention,
    pub(super) pool: PagedKvPool,
    pub(super) q: GpuTensor,
    pub(super) out: GpuTensor,
    pub(super) host_pool: Vec<f32>,
    pub(super) table: PageTable,
    pub(super) seqs: Vec<(usize, usize)>,
    pub(super) q_host: Vec<f32>,
    pub(super) causal: bool,
}

impl Timed for PagedBatch {
    fn passes(&self) -> u32 {
        self.plan.passes().max(1)
    }
    fn run(&self, timer: Option<&mut PassTimer>) -> Result<Vec<(&'static str, f64)>> {
        self.plan
            .run_timed(&self.q, &self.pool, &self.out, None, timer)
    }
}

impl PagedBatch {
    /// `seqs` (`(kv tokens, query rows)`) over one pool of exactly their pages in `layout`,
    /// random, the pages in shuffled order. The same seed gives the same keys and values in
    /// either layout (drawn in NHD order, then placed).
    pub(super) fn new(
        gpu: &Gpu,
        seqs: &[(usize, usize)],
        (dtype, layout): (KvDtype, KvLayout),
        causal: bool,
        seed: u64,
    ) -> Result<Self> {
        let pages: Vec<usize> = seqs.iter().map(|s| s.0.div_ceil(PAGE)).collect();
        let config = PoolConfig {
            max_pages: pages.iter().sum(),
            page_size: PAGE,
            kv_heads: KV_HEADS,
            head_dim: HEAD_DIM,
            layout,
            dtype,
        };
        config.check(gpu)?;
        let mut rng = Rng(seed);
        let mut order: Vec<u32> = (0..config.max_pages as u32).collect();
        rng.shuffle(&mut order);
        let mut table = PageTable {
            kv_indptr: vec![0],
            kv_indices: order,
            kv_last_page_len: Vec::new(),
        };
        let mut qo_indptr = vec![0u32];
        for (&(tokens, rows), &n) in seqs.iter().zip(&pages) {
            let last = table.kv_indptr.last().copied().unwrap_or(0);
            table.kv_indptr.push(last + n as u32);
            table
                .kv_last_page_len
                .push((tokens - PAGE * (n - 1)) as u32);
            qo_indptr.push(qo_indptr.last().copied().unwrap_or(0) + rows as u32);
        }
        let total_q = *qo_indptr.last().unwrap_or(&0) as usize;
        let options = BatchOptions {
            causal,
            ..BatchOptions::default()
        };
        let plan = BatchAttention::plan(
            gpu,
            &PlanInputs {
                qo_indptr: &qo_indptr,
                table: &table,
                num_qo_heads: HEADS,
                num_kv_heads: KV_HEADS,
                head_dim: HEAD_DIM,
                page_size: PAGE,
                layout,
                dtype,
                options,
            },
        )?;
        let mut host_pool = placed(config, rng.floats(config.elements()));
        let pool = PagedKvPool::upload(gpu, config, &host_pool)?;
        if dtype.quantized() {
            // The check reads the pool as stored: its blocks dequantized.
            let words = kv_dtype::quantize(dtype, &host_pool)?;
            host_pool = kv_dtype::dequantize(dtype, &words, host_pool.len())?;
        }
        let q_host = rng.floats(total_q * HEADS * HEAD_DIM);
        let q = GpuTensor::upload(
            gpu,
            &Tensor::new([total_q, HEADS, HEAD_DIM], q_host.clone())?,
        )?;
        let out = GpuTensor::zeros(gpu, &[total_q, HEADS, HEAD_DIM])?;
        Ok(PagedBatch {
            plan,
            pool,
            q,
            out,
            host_pool,
            table,
            seqs: seqs.to_vec(),
            q_host,
            causal,
        })
    }

    /// K/V bytes one step reads (each sequence's keys and values once, in the pool's blocks).
    pub(super) fn kv_bytes(&self) -> u64 {
        let c = self.pool.config();
        let tokens: usize = self.seqs.iter().map(|s| s.0).sum();
        tokens as u64 * c.bytes_per_token()
    }

    /// Multiply-adds of `q·kᵀ` and `p·v`, ×2: 4 · H · D per visible key of each row.
    pub(super) fn gflop(&self) -> f64 {
        let keys: usize = self
            .seqs
            .iter()
            .map(|&(kv, rows)| {
                (0..rows)
                    .map(|i| if self.causal { kv - rows + i + 1 } else { kv })
                    .sum::<usize>()
            })
            .sum();
        4.0 * (HEADS * HEAD_DIM) as f64 * keys as f64 / 1e9
    }

    /// Element `d` of key (`which` 0) or value `j` of sequence `s`, head `kvh`, as stored.
    fn kv(&self, which: usize, s: usize, j: usize, kvh: usize, d: usize) -> f64 {
        let c = self.pool.config();
        let page = self.table.pages(s)[j / PAGE] as usize;
        let x = self.host_pool[c.index(page, which, j % PAGE, kvh, d)];
        if c.dtype == KvDtype::F16 {
            half::f16::from_f32(x).to_f64()
        } else {
            x as f64
        }
    }

    /// Keys and values `[B, H_kv, ctx, D]` of sequences that all hold `ctx` tokens, in the
    /// contiguous decode pass's layout.
    pub(super) fn contiguous(&self, which: usize) -> Vec<f32> {
        let ctx = self.seqs[0].0;
        let mut out = Vec::with_capacity(self.seqs.len() * KV_HEADS * ctx * HEAD_DIM);
        for s in 0..self.seqs.len() {
            for kvh in 0..KV_HEADS {
                for j in 0..ctx {
                    out.extend((0..HEAD_DIM).map(|d| self.kv(which, s, j, kvh, d) as f32));
                }
            }
        }
        out
    }

    /// Runs the step once and checks the first and last row, first and last head, of the first,
    /// a middle and the last sequence against an f64 reference over their pages. The output
    /// of that run.
    pub(super) fn check(&self, gpu: &Gpu, what: &str) -> Result<Vec<f32>> {
        self.run(None)?;
        let got = self.out.read(gpu)?.into_data();
        let f16 = self.pool.config().dtype == KvDtype::F16;
        let tolerance = if f16 { 2e-3 } else { 1e-4 };
        let scale = 1.0 / (HEAD_DIM as f64).sqrt();
        let n = self.seqs.len();
        let mut q_begin = vec![0];
        for s in &self.seqs {
            q_begin.push(q_begin.last().copied().unwrap_or(0) + s.1);
        }
        for s in [0, n / 2, n - 1] {
            let (kv, rows) = self.seqs[s];
            for i in [0, rows - 1] {
                let row = q_begin[s] + i;
                let visible = if self.causal { kv - rows + i + 1 } else { kv };
                for h in [0, HEADS - 1] {
                    let kvh = h / (HEADS / KV_HEADS);
                    let q = &self.q_host[(row * HEADS + h) * HEAD_DIM..][..HEAD_DIM];
                    let scores: Vec<f64> = (0..visible)
                        .map(|j| {
                            let dot: f64 = (0..HEAD_DIM)
                                .map(|d| q[d] as f64 * self.kv(0, s, j, kvh, d))
                                .sum();
                            dot * scale
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = weights.iter().sum();
                    let out = &got[(row * HEADS + h) * HEAD_DIM..][..HEAD_DIM];
                    for (d, &o) in out.iter().enumerate() {
                        let want = (0..visible)
                            .map(|j| weights[j] * self.kv(1, s, j, kvh, d))
                            .sum::<f64>()
                            / sum;
                        let diff = (o as f64 - want).abs();
                        if diff.is_nan() || diff > tolerance * (1.0 + want.abs()) {
                            return Err(Error::Misuse(format!(
                                "{what}: batched paged attention gives {o} at sequence {s}, row \
                                 {i}, head {h}, element {d}; the f64 reference {want} (nothing \
                                 was timed)"
                            )));
                        }
                    }
                }
            }
        }
        Ok(got)
    }
}

/// `got` within `tolerance · (1 + |want|)` of `want` (false for NaN).
pub(super) fn close(got: f64, want: f64, tolerance: f64) -> bool {
    (got - want).abs() <= tolerance * (1.0 + want.abs())
}

/// A pool's values drawn in NHD order (`drawn`), in `config`'s layout.
fn placed(config: PoolConfig, drawn: Vec<f32>) -> Vec<f32> {
    if config.layout == KvLayout::Nhd {
        return drawn;
    }
    let nhd = PoolConfig {
        layout: KvLayout::Nhd,
        ..config
    };
    let mut out = vec![0.0; drawn.len()];
    for page in 0..config.max_pages {
        for which in 0..2 {
            for offset in 0..config.page_size {
                for kvh in 0..config.kv_heads {
                    let (to, from) = (
                        config.index(page, which, offset, kvh, 0),
                        nhd.index(page, which, offset, kvh, 0),
                    );
                    out[to..to + config.head_dim]
                        .copy_from_slice(&drawn[from..from + config.head_dim]);
                }
            }
        }
    }
    out
}
