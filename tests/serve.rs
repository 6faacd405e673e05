//! Batched attention over a page pool against the f64 reference core, which sees each
//! sequence's keys gathered from its pages on the host: random tables (page sizes 1–256, pages
//! in random order and shared, NHD and HND, f32 and f16, every option), a 70,000-token context,
//! pages no sequence lists full of NaN, appends, bad inputs, and a plan that makes no buffer.

mod common;

use common::gpu;
use wgpu_mha::model::weights::SplitMix64;
use wgpu_mha::reference::Core;
use wgpu_mha::serve::{
    BatchAttention, BatchOptions, KvLayout, PageAllocator, PageTable, PagedKvPool, PlanInputs,
    PoolConfig,
};
use wgpu_mha::{Gpu, GpuTensor, KvDtype, Mask, MaskTensor, Tensor};

/// The tests' own seeded integers, from the library's SplitMix64.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `lo ..= hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.range(0, i);
            v.swap(i, j);
        }
    }
}

/// One step of a batch: its pool (host copy), table, query rows and options.
struct Batch {
    config: PoolConfig,
    pool: Vec<f32>,
    table: PageTable,
    qo_indptr: Vec<u32>,
    heads: usize,
    q: Vec<f32>,
    options: BatchOptions,
}

impl Batch {
    fn tokens(&self, s: usize) -> usize {
        self.table.tokens(s, self.config.page_size)
    }

    /// Sequence `s`'s keys (`which` 0) or values as `[tokens, H_kv·D]`, gathered from its pages
    /// (rounded as the pool stores them).
    fn gather(&self, s: usize, which: usize) -> Vec<f64> {
        let c = &self.config;
        let mut out = Vec::new();
        for t in 0..self.tokens(s) {
            let page = self.table.pages(s)[t / c.page_size] as usize;
            for h in 0..c.kv_heads {
                for d in 0..c.head_dim {
                    let x = self.pool[c.index(page, which, t % c.page_size, h, d)];
                    out.push(stored(x, c.dtype == KvDtype::F16));
                }
            }
        }
        out
    }

    /// Whether the query at position `pos` sees key `j`.
    fn visible(&self, pos: usize, j: usize) -> bool {
        let o = &self.options;
        (!o.causal || j <= pos) && o.window_left.is_none_or(|w| j + w >= pos)
    }

    /// `(out [total_q, H, D], lse [total_q, H])` in f64.
    fn reference(&self) -> (Vec<f64>, Vec<f64>) {
        let (h, c) = (self.heads, &self.config);
        let (h_kv, d) = (c.kv_heads, c.head_dim);
        let o = &self.options;
        let mut out = Vec::new();
        let mut lse = Vec::new();
        for s in 0..self.table.sequences() {
            let (q0, q1) = (self.qo_indptr[s] as usize, self.qo_indptr[s + 1] as usize);
            let (lq, lk) = (q1 - q0, self.tokens(s));
            if lq == 0 {
                continue;
            }
            let k = self.gather(s, 0);
            let v = self.gather(s, 1);
            let q: Vec<f64> = self.q[q0 * h * d..q1 * h * d]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let attend: Vec<u8> = (0..lq * lk)
                .map(|e| self.visible(lk - lq + e / lk, e % lk) as u8)
                .collect();
            let mask = Mask::Attend(MaskTensor::new([lq, lk], attend).expect("mask"));
            let scale = o.scale.unwrap_or(1.0 / (d as f32).sqrt()) as f64;
            let core = Core {
                batch: 1,
                heads: h,
                kv_heads: h_kv,
                lq,
                lk,
                dk: d,
                dv: d,
                scale,
                softcap: o.softcap,
                alibi_max_bias: o.alibi_max_bias,
                temperature: None,
                sinks: o.sinks.as_deref(),
                mask: &mask,
                top_left: false,
            };
            out.extend(core.run(&q, &k, &v).0);
            // The log-sum-exp of each row's visible scores (and sink), as the kernel defines it.
            for i in 0..lq {
                let pos = lk - lq + i;
                for head in 0..h {
                    let kvh = head / (h / h_kv);
                    let mut scores: Vec<f64> = (0..lk)
                        .filter(|&j| self.visible(pos, j))
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|e| q[(i * h + head) * d + e] * k[(j * h_kv + kvh) * d + e])
                                .sum();
                            let mut sc = dot * scale;
                            if let Some(cap) = o.softcap {
                                sc = cap as f64 * (sc / cap as f64).tanh();
                            }
                            if let Some(m) = o.alibi_max_bias {
                                let slope = wgpu_mha::model::config::alibi_slope(head, h, m as f64);
                                sc += slope * (j as f64 - pos as f64);
                            }
                            sc
                        })
                        .collect();
                    if let Some(sinks) = &o.sinks {
                        scores.push(sinks[head] as f64);
                    }
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    lse.push(m + scores.iter().map(|x| (x - m).exp()).sum::<f64>().ln());
                }
            }
        }
        (out, lse)
    }

    fn plan_inputs(&self) -> PlanInputs<'_> {
        PlanInputs {
            qo_indptr: &self.qo_indptr,
            table: &self.table,
            num_qo_heads: self.heads,
            num_kv_heads: self.config.kv_heads,
            head_dim: self.config.head_dim,
            page_size: self.config.page_size,
            layout: self.config.layout,
            dtype: self.config.dtype,
            options: self.options.clone(),
        }
    }

    /// Runs the batch on the GPU: `(out, lse, plan)`.
    fn run(&self) -> (Vec<f32>, Option<Vec<f32>>, BatchAttention) {
        let g = gpu();
        let total_q = *self.qo_indptr.last().expect("indptr") as usize;
        let d = self.config.head_dim;
        let plan = BatchAttention::plan(g, &self.plan_inputs()).expect("plan");
        let pool = PagedKvPool::upload(g, self.config, &self.pool).expect("pool");
        let q = GpuTensor::upload(
            g,
            &Tensor::new([total_q, self.heads, d], self.q.clone()).expect("q"),
        )
        .expect("q upload");
        let out = GpuTensor::zeros(g, &[total_q, self.heads, d]).expect("out");
        let lse = self
            .options
            .return_lse
            .then(|| GpuTensor::zeros(g, &[total_q, self.heads]).expect("lse"));
        plan.run(&q, &pool, &out, lse.as_ref()).expect("run");
        let out = out.read(g).expect("read out").data().to_vec();
        let lse = lse.map(|l| l.read(g).expect("read lse").data().to_vec());
        (out, lse, plan)
    }

    fn check(&self, label: &str) -> BatchAttention {
        let (out, lse, plan) = self.run();
        let (want, want_lse) = self.reference();
        assert!(
            out.iter().all(|x| x.is_finite()),
            "{label}: non-finite output"
        );
        let tol = common::tolerance(&want).max(if self.config.dtype == KvDtype::F16 {
            2e-5
        } else {
            1e-5
        });
        common::assert_within(label, &out, &want, tol);
        if let Some(lse) = lse {
            common::assert_within(&format!("{label} lse"), &lse, &want_lse, 1e-4);
        }
        plan
    }
}

/// The float pool type of `f16`.
fn float_dtype(f16: bool) -> KvDtype {
    if f16 {
        KvDtype::F16
    } else {
        KvDtype::F32
    }
}

fn stored(x: f32, f16: bool) -> f64 {
    if f16 {
        half::f16::from_f32(x).to_f64()
    } else {
        x as f64
    }
}

/// Random values in [-1, 1), by seed.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..len).map(|_| r.uniform(-1.0, 1.0)).collect()
}

/// A random batch: `n` sequences with contexts in `ctx`, query rows in `rows` (at most their
/// tokens), their pages scattered over a pool in random order, some sharing a prefix of pages.
#[allow(clippy::too_many_arguments)]
fn random_batch(
    seed: u64,
    n: usize,
    ctx: (usize, usize),
    rows: (usize, usize),
    page_size: usize,
    heads: (usize, usize),
    head_dim: usize,
    layout: KvLayout,
    f16: bool,
) -> Batch {
    let mut r = Rng::new(seed);
    let lens: Vec<usize> = (0..n).map(|_| r.range(ctx.0, ctx.1)).collect();
    let pages: Vec<usize> = lens.iter().map(|l| l.div_ceil(page_size).max(1)).collect();
    // Sequence 1 shares sequence 0's first whole pages (a prompt prefix), where both have them.
    let shared = if n > 1 {
        (lens[0].min(lens[1]) / page_size).saturating_sub(1)
    } else {
        0
    };
    let total: usize = pages.iter().sum::<usize>() - shared + 3;
    let mut ids: Vec<u32> = (0..total as u32).collect();
    r.shuffle(&mut ids);
    let mut table = PageTable {
        kv_indptr: vec![0],
        ..Default::default()
    };
    let mut next = 0;
    for (s, &p) in pages.iter().enumerate() {
        for i in 0..p {
            if s == 1 && i < shared {
                let page = table.kv_indices[i];
                table.kv_indices.push(page);
            } else {
                table.kv_indices.push(ids[next]);
                next += 1;
            }
        }
        table.kv_indptr.push(table.kv_indices.len() as u32);
        table
            .kv_last_page_len
            .push((lens[s] - (p - 1) * page_size) as u32);
    }
    let mut qo_indptr = vec![0u32];
    for &len in &lens {
        let q = r.range(rows.0, rows.1).min(len);
        qo_indptr.push(qo_indptr.last().expect("indptr") + q as u32);
    }
    let config = PoolConfig {
        max_pages: total,
        page_size,
        kv_heads: heads.1,
        head_dim,
        layout,
        dtype: float_dtype(f16),
    };
    let total_q = *qo_indptr.last().expect("indptr") as usize;
    Batch {
        pool: values(config.elements(), seed ^ 0x5eed),
        q: values(total_q * heads.0 * head_dim, seed ^ 0x9),
        config,
        table,
        qo_indptr,
        heads: heads.0,
        options: BatchOptions::default(),
    }
}

/// What a randomised test draws its batches from: head counts `(H, H_kv)`, head sizes, up to
/// how many sequences, the longest context on pages of one token and of more, query rows.
struct Draw {
    heads: &'static [(usize, usize)],
    head_dims: &'static [usize],
    max_seqs: usize,
    max_ctx: [usize; 2],
    rows: (usize, usize),
}

impl Draw {
    /// Test case `seed`'s batch (pages of 1, 16, 64 or 256 by seed), its shape drawn by `r`
    /// and its tokens by `batch_seed`, with random options: the batch, its label, its longest
    /// context.
    fn batch(&self, r: &mut Rng, seed: u64, batch_seed: u64, f16: bool) -> (Batch, String, usize) {
        let page_size = [1, 16, 64, 256][seed as usize % 4];
        let heads = self.heads[r.range(0, self.heads.len() - 1)];
        let head_dim = self.head_dims[r.range(0, self.head_dims.len() - 1)];
        let layout = if r.coin() {
            KvLayout::Nhd
        } else {
            KvLayout::Hnd
        };
        let n = r.range(1, self.max_seqs);
        let max_ctx = self.max_ctx[usize::from(page_size > 1)];
        let mut b = random_batch(
            batch_seed,
            n,
            (1, max_ctx),
            self.rows,
            page_size,
            heads,
            head_dim,
            layout,
            f16 && r.coin(),
        );
        b.options = random_options(r, heads.0);
        let label = format!(
            "seed {seed}: {n} seqs, page {page_size}, heads {heads:?}, d {head_dim}, {layout:?}, \
             {}, {:?}",
            b.config.dtype, b.options
        );
        (b, label, max_ctx)
    }
}

/// A random choice of every option.
fn random_options(r: &mut Rng, heads: usize) -> BatchOptions {
    BatchOptions {
        causal: r.range(0, 3) > 0,
        window_left: r.coin().then(|| r.range(0, 300)),
        scale: r.coin().then_some(0.3),
        softcap: (r.range(0, 3) == 0).then_some(2.5),
        alibi_max_bias: (r.range(0, 3) == 0).then_some(8.0),
        sinks: (r.range(0, 3) == 0).then(|| values(heads, r.next())),
        return_lse: r.coin(),
        ..Default::default()
    }
}

#[test]
fn random_batches_match_the_reference_gathering_pages() {
    let f16 = gpu().has_f16();
    let (mut split, mut register_tiled) = (false, false);
    for seed in 0..16u64 {
        let draw = Draw {
            heads: &[(4, 4), (4, 2), (8, 1), (6, 3)],
            head_dims: &[8, 16, 12, 64, 30],
            max_seqs: 12,
            max_ctx: [300, 900],
            rows: (1, 40),
        };
        let (b, label, max_ctx) = draw.batch(&mut Rng::new(seed * 7 + 1), seed, seed, f16);
        let plan = b.check(&label);
        split |= plan.chunk_keys() < max_ctx;
        register_tiled |= plan.register_tiled();
    }
    assert!(
        split,
        "no batch split its keys into chunks: the merge went untested"
    );
    let cpu = gpu().kernel_class() == wgpu_mha::KernelClass::Cpu;
    assert_eq!(
        register_tiled, cpu,
        "the register-tiled body ran on a CPU adapter only"
    );
}

#[test]
fn many_sequences_of_mixed_lengths_decode_and_prefill_together() {
    // 64 sequences: most decode one row, a few run prefill chunks of up to 300 rows.
    let mut b = random_batch(
        99,
        64,
        (1, 400),
        (1, 1),
        16,
        (8, 2),
        32,
        KvLayout::Nhd,
        false,
    );
    let mut qo = vec![0u32];
    for s in 0..64 {
        let rows = if s % 16 == 3 { b.tokens(s).min(300) } else { 1 };
        qo.push(qo.last().expect("indptr") + rows as u32);
    }
    b.qo_indptr = qo;
    b.q = values(*b.qo_indptr.last().expect("indptr") as usize * 8 * 32, 5);
    b.options.causal = true;
    b.options.return_lse = true;
    let plan = b.check("64 mixed sequences");
    // On a CPU adapter the decode rows run the lane keys and the prefill blocks the register
    // tiles, two dispatches of one plan (GL: the register tiles for both).
    let g = gpu();
    let bodies: Vec<_> = plan.bodies().collect();
    match (g.kernel_class(), g.info().backend) {
        (wgpu_mha::KernelClass::Gpu, _) => assert_eq!(bodies.len(), 1, "{plan:?}"),
        (_, wgpu::Backend::Gl) => assert!(plan.register_tiled() && !plan.lane_keys()),
        _ => assert!(plan.register_tiled() && plan.lane_keys() && bodies.len() == 2),
    }
}

#[test]
fn a_context_of_70000_tokens_matches_the_reference() {
    let mut b = random_batch(
        7,
        2,
        (69_000, 70_000),
        (1, 4),
        256,
        (4, 2),
        16,
        KvLayout::Hnd,
        false,
    );
    b.options = BatchOptions {
        causal: true,
        return_lse: true,
        ..Default::default()
    };
    let plan = b.check("70k context");
    assert!(plan.chunk_keys() < 69_000, "a 70k context is split");
}

#[test]
fn pages_no_sequence_lists_are_never_read() {
    for layout in [KvLayout::Nhd, KvLayout::Hnd] {
        let mut b = random_batch(3, 5, (1, 200), (1, 9), 16, (4, 2), 16, layout, false);
        let c = b.config;
        // NaN in every page no sequence lists, and past each sequence's last token.
        let mut listed = vec![usize::MAX; c.max_pages]; // page → tokens used in it
        for s in 0..b.table.sequences() {
            let tokens = b.tokens(s);
            for (i, &p) in b.table.pages(s).iter().enumerate() {
                let used = (tokens - i * c.page_size).min(c.page_size);
                let slot = &mut listed[p as usize];
                *slot = if *slot == usize::MAX {
                    used
                } else {
                    (*slot).max(used)
                };
            }
        }
        for (page, &used) in listed.iter().enumerate() {
            let from = if used == usize::MAX { 0 } else { used };
            for offset in from..c.page_size {
                for which in 0..2 {
                    for h in 0..c.kv_heads {
                        for d in 0..c.head_dim {
                            b.pool[c.index(page, which, offset, h, d)] = f32::NAN;
                        }
                    }
                }
            }
        }
        b.options.causal = true;
        b.check(&format!("NaN outside the listed tokens, {layout:?}"));
    }
}

#[test]
fn the_same_batch_gives_bit_identical_outputs() {
    let mut b = random_batch(
        11,
        6,
        (100, 800),
        (1, 30),
        16,
        (4, 1),
        32,
        KvLayout::Nhd,
        false,
    );
    b.options.causal = true;
    let (first, _, _) = b.run();
    let (second, _, _) = b.run();
    assert!(
        first
            .iter()
            .zip(&second)
            .all(|(a, c)| a.to_bits() == c.to_bits()),
        "two plans of one batch differ"
    );
}

#[test]
fn runs_of_one_plan_make_no_buffer() {
    // A device of its own: the counters are per device, and the shared one's buffers come and
    // go with the tests running beside this one.
    let own = Gpu::new().expect("GPU tests need an adapter");
    let g = &own;
    let mut b = random_batch(
        5,
        8,
        (10, 600),
        (1, 20),
        16,
        (4, 2),
        16,
        KvLayout::Nhd,
        false,
    );
    b.options.causal = true;
    b.options.return_lse = true;
    let total_q = *b.qo_indptr.last().expect("indptr") as usize;
    let plan = BatchAttention::plan(g, &b.plan_inputs()).expect("plan");
    let pool = PagedKvPool::upload(g, b.config, &b.pool).expect("pool");
    let q =
        GpuTensor::upload(g, &Tensor::new([total_q, 4, 16], b.q.clone()).expect("q")).expect("q");
    let out = GpuTensor::zeros(g, &[total_q, 4, 16]).expect("out");
    let lse = GpuTensor::zeros(g, &[total_q, 4]).expect("lse");
    // Warm: the passes are compiled and cached by the plan already; one run settles the rest.
    plan.run(&q, &pool, &out, Some(&lse)).expect("run");
    let before = g.live_objects().buffers;
    let mut encoder = g.device().create_command_encoder(&Default::default());
    for _ in 0..32 {
        plan.record(&mut encoder, &q, &pool, &out, Some(&lse))
            .expect("record");
    }
    let after = g.live_objects().buffers;
    g.queue().submit([encoder.finish()]);
    assert_eq!(after, before, "32 layer calls of one plan made buffers");
    let (want, _) = b.reference();
    common::assert_close(
        "after 32 layer calls",
        out.read(g).expect("read").data(),
        &want,
    );
}

#[test]
fn appends_land_in_their_slots_and_skip_negative_ones() {
    let g = gpu();
    for (layout, f16) in [
        (KvLayout::Nhd, false),
        (KvLayout::Hnd, false),
        (KvLayout::Hnd, g.has_f16()),
    ] {
        let config = PoolConfig {
            max_pages: 5,
            page_size: 4,
            kv_heads: 2,
            head_dim: 6,
            layout,
            dtype: float_dtype(f16),
        };
        let pool = PagedKvPool::new(g, config).expect("pool");
        let slots: Vec<i64> = vec![0, 19, -1, 7, 8];
        let keys = values(slots.len() * 12, 1);
        let vals = values(slots.len() * 12, 2);
        let upload = |data: &[f32]| {
            GpuTensor::upload(
                g,
                &Tensor::new([slots.len(), 2, 6], data.to_vec()).expect("t"),
            )
            .expect("upload")
        };
        pool.append(g, &upload(&keys), &upload(&vals), &slots)
            .expect("append");
        let got = pool.read(g).expect("read");
        let mut want = vec![0.0f32; config.elements()];
        for (t, &slot) in slots.iter().enumerate().filter(|(_, &s)| s >= 0) {
            let (page, offset) = (slot as usize / 4, slot as usize % 4);
            for h in 0..2 {
                for d in 0..6 {
                    let e = (t * 2 + h) * 6 + d;
                    want[config.index(page, 0, offset, h, d)] = stored(keys[e], f16) as f32;
                    want[config.index(page, 1, offset, h, d)] = stored(vals[e], f16) as f32;
                }
            }
        }
        assert_eq!(got, want, "{layout:?} f16 {f16}");
        let err = pool
            .append(g, &upload(&keys), &upload(&vals), &[0, 1, 2, 3, 20])
            .expect_err("slot 20 is past 5 pages of 4");
        assert!(err.to_string().contains("slot_mapping[4] is 20"), "{err}");
    }
}

#[test]
fn an_allocator_serves_a_shared_prompt_with_copy_on_write() {
    // Two sequences share a 10-token prompt (page 4), then each appends its own tokens; the
    // batch then attends both through the pool the allocator filled.
    let g = gpu();
    let (h, h_kv, d, ps) = (4, 2, 8, 4);
    let config = PoolConfig {
        max_pages: 8,
        page_size: ps,
        kv_heads: h_kv,
        head_dim: d,
        layout: KvLayout::Nhd,
        dtype: KvDtype::F32,
    };
    let pool = PagedKvPool::new(g, config).expect("pool");
    let mut alloc = PageAllocator::new(config.max_pages, ps);
    let mut host = vec![0.0f32; config.elements()];
    let append = |slots: &[i64], seed: u64, host: &mut Vec<f32>| {
        let k = values(slots.len() * h_kv * d, seed);
        let v = values(slots.len() * h_kv * d, seed + 1);
        let t = |x: &[f32]| {
            GpuTensor::upload(
                g,
                &Tensor::new([slots.len(), h_kv, d], x.to_vec()).expect("t"),
            )
            .expect("upload")
        };
        pool.append(g, &t(&k), &t(&v), slots).expect("append");
        for (i, &slot) in slots.iter().enumerate() {
            let (page, off) = (slot as usize / ps, slot as usize % ps);
            for kvh in 0..h_kv {
                for e in 0..d {
                    host[config.index(page, 0, off, kvh, e)] = k[(i * h_kv + kvh) * d + e];
                    host[config.index(page, 1, off, kvh, e)] = v[(i * h_kv + kvh) * d + e];
                }
            }
        }
    };
    let mut a = alloc.sequence();
    let grown = alloc.grow(&mut a, 10).expect("prompt");
    append(&grown.slots, 1, &mut host);
    let mut b = alloc.fork(&a);
    for (seq, seed) in [(&mut a, 10), (&mut b, 20)] {
        let grown = alloc.grow(seq, 3).expect("room");
        let mut encoder = g.device().create_command_encoder(&Default::default());
        pool.record_copy_pages(g, &mut encoder, &grown.copies)
            .expect("copy");
        g.queue().submit([encoder.finish()]);
        for &(from, to) in &grown.copies {
            let n = config.page_elements();
            let page: Vec<f32> = host[from as usize * n..][..n].to_vec();
            host[to as usize * n..][..n].copy_from_slice(&page);
        }
        append(&grown.slots, seed, &mut host);
    }
    assert_eq!(
        pool.read(g).expect("read"),
        host,
        "the pool is what the host expects"
    );
    assert_ne!(
        a.pages().last(),
        b.pages().last(),
        "the shared last page was copied"
    );
    assert_eq!(
        a.pages()[..2],
        b.pages()[..2],
        "whole prompt pages stay shared"
    );
    let table = alloc.table(&[&a, &b]);
    alloc.check_held(&table).expect("held");
    let batch = Batch {
        config,
        pool: host,
        table,
        qo_indptr: vec![0, 3, 6],
        heads: h,
        q: values(6 * h * d, 3),
        options: BatchOptions {
            causal: true,
            ..Default::default()
        },
    };
    batch.check("shared prompt");
    alloc.release(a);
    alloc.release(b);
    assert_eq!(
        alloc.free_pages(),
        config.max_pages,
        "the pool is empty at the end"
    );
}

#[test]
fn bad_inputs_are_named_before_anything_is_recorded() {
    let g = gpu();
    let b = random_batch(2, 3, (5, 40), (1, 3), 4, (4, 2), 8, KvLayout::Nhd, false);
    let plan_err = |inputs: PlanInputs| {
        BatchAttention::plan(g, &inputs)
            .expect_err("bad plan")
            .to_string()
    };
    let mut long_q = b.qo_indptr.clone();
    long_q[1] = b.tokens(0) as u32 + 1;
    for i in 2..long_q.len() {
        long_q[i] = long_q[i].max(long_q[i - 1]);
    }
    let mut bad_table = b.table.clone();
    bad_table.kv_last_page_len[0] = 0;
    let sinks = BatchOptions {
        sinks: Some(vec![0.0; 3]),
        ..Default::default()
    };
    let cases: Vec<(String, &str)> = vec![
        (
            plan_err(PlanInputs {
                qo_indptr: &long_q,
                options: BatchOptions {
                    causal: true,
                    ..Default::default()
                },
                ..b.plan_inputs()
            }),
            "sequence 0 has",
        ),
        (
            plan_err(PlanInputs {
                num_kv_heads: 3,
                ..b.plan_inputs()
            }),
            "num_qo_heads 4",
        ),
        (
            plan_err(PlanInputs {
                page_size: 3,
                ..b.plan_inputs()
            }),
            "page_size 3",
        ),
        (
            plan_err(PlanInputs {
                table: &bad_table,
                ..b.plan_inputs()
            }),
            "kv_last_page_len[0] is 0",
        ),
        (
            plan_err(PlanInputs {
                options: sinks,
                ..b.plan_inputs()
            }),
            "sinks has 3 values",
        ),
    ];
    for (err, want) in cases {
        assert!(err.contains(want), "{err} should name {want}");
    }
    // At run time: a pool too small for the table, and tensors of the wrong shape.
    let total_q = *b.qo_indptr.last().expect("indptr") as usize;
    let plan = BatchAttention::plan(g, &b.plan_inputs()).expect("plan");
    let small = PagedKvPool::new(
        g,
        PoolConfig {
            max_pages: 1,
            ..b.config
        },
    )
    .expect("pool");
    let pool = PagedKvPool::upload(g, b.config, &b.pool).expect("pool");
    let q = GpuTensor::zeros(g, &[total_q, 4, 8]).expect("q");
    let out = GpuTensor::zeros(g, &[total_q, 4, 8]).expect("out");
    let wrong = GpuTensor::zeros(g, &[total_q + 1, 4, 8]).expect("wrong");
    let mut encoder = g.device().create_command_encoder(&Default::default());
    for (result, want) in [
        (
            plan.record(&mut encoder, &q, &small, &out, None),
            "past the pool's 1 pages",
        ),
        (
            plan.record(&mut encoder, &wrong, &pool, &out, None),
            "q has shape",
        ),
        (
            plan.record(&mut encoder, &q, &pool, &q, None),
            "buffers of their own",
        ),
    ] {
        let err = result.expect_err(want).to_string();
        assert!(err.contains(want), "{err} should name {want}");
    }
    // Nothing was recorded: the encoder still finishes and submits cleanly.
    g.queue().submit([encoder.finish()]);
    g.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Random (mostly wrong) tables and query indices never panic the plan: each is `Ok` or an
    /// `Err` naming the table; and an `Ok` plan runs over a pool holding every page it lists.
    #[test]
    fn random_tables_never_panic(
        indptr in proptest::collection::vec(0u32..12, 1..6),
        indices in proptest::collection::vec(0u32..8, 0..12),
        last in proptest::collection::vec(0u32..6, 0..6),
        qo in proptest::collection::vec(0u32..10, 0..7),
    ) {
        let g = gpu();
        let table = PageTable { kv_indptr: indptr, kv_indices: indices, kv_last_page_len: last };
        let inputs = PlanInputs {
            qo_indptr: &qo,
            table: &table,
            num_qo_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
            page_size: 4,
            layout: KvLayout::Nhd,
            dtype: KvDtype::F32,
            options: BatchOptions { causal: true, ..Default::default() },
        };
        match BatchAttention::plan(g, &inputs) {
            Err(e) => proptest::prop_assert!(
                matches!(e, wgpu_mha::Error::PageTable(_)),
                "{e}"
            ),
            Ok(plan) => {
                let config = PoolConfig { page_size: 4, ..PoolConfig::new(8, 1, 4) };
                let pool = PagedKvPool::new(g, config).expect("pool");
                let q = GpuTensor::zeros(g, &[plan.total_q(), 2, 4]).expect("q");
                let out = GpuTensor::zeros(g, &[plan.total_q(), 2, 4]).expect("out");
                plan.run(&q, &pool, &out, None).expect("a valid plan runs");
            }
        }
    }
}

#[test]
fn merge_states_is_the_softmax_over_both_key_sets() {
    let g = gpu();
    let (n, h, d) = (5, 3, 7);
    let v_a = values(n * h * d, 1);
    let v_b = values(n * h * d, 2);
    let mut s_a: Vec<f32> = values(n * h, 3).iter().map(|x| 4.0 * x).collect();
    let s_b: Vec<f32> = values(n * h, 4).iter().map(|x| 30.0 * x).collect();
    // A part that saw no key weighs nothing; a row neither part saw is 0 with lse −inf.
    s_a[2] = f32::NEG_INFINITY;
    let mut s_b = s_b;
    s_b[7] = f32::NEG_INFINITY;
    s_a[7] = f32::NEG_INFINITY;
    let up = |data: &[f32], shape: &[usize]| {
        GpuTensor::upload(g, &Tensor::new(shape.to_vec(), data.to_vec()).expect("t")).expect("up")
    };
    let (va, sa, vb, sb) = (
        up(&v_a, &[n, h, d]),
        up(&s_a, &[n, h]),
        up(&v_b, &[n, h, d]),
        up(&s_b, &[n, h]),
    );
    let (vo, so) = (
        GpuTensor::zeros(g, &[n, h, d]).expect("v"),
        GpuTensor::zeros(g, &[n, h]).expect("s"),
    );
    let state = |out, lse| wgpu_mha::serve::State { out, lse };
    wgpu_mha::serve::merge_states(g, state(&va, &sa), state(&vb, &sb), state(&vo, &so))
        .expect("merge");
    let (mut want_v, mut want_s) = (Vec::new(), Vec::new());
    for r in 0..n * h {
        let (a, b) = (s_a[r] as f64, s_b[r] as f64);
        let m = a.max(b);
        let (wa, wb) = if m == f64::NEG_INFINITY {
            (0.0, 0.0)
        } else {
            ((a - m).exp(), (b - m).exp())
        };
        let total = wa + wb;
        want_s.push(if total > 0.0 {
            m + total.ln()
        } else {
            f64::NEG_INFINITY
        });
        for e in 0..d {
            let i = r * d + e;
            let v = wa * v_a[i] as f64 + wb * v_b[i] as f64;
            want_v.push(if total > 0.0 { v / total } else { 0.0 });
        }
    }
    common::assert_close("merged out", vo.read(g).expect("read").data(), &want_v);
    let got_s = so.read(g).expect("read").data().to_vec();
    assert_eq!(got_s[7], f32::NEG_INFINITY, "a row no part saw");
    let finite: Vec<usize> = (0..n * h).filter(|&r| r != 7).collect();
    let got: Vec<f32> = finite.iter().map(|&r| got_s[r]).collect();
    let want: Vec<f64> = finite.iter().map(|&r| want_s[r]).collect();
    common::assert_within("merged lse", &got, &want, 1e-5);
    let err = wgpu_mha::serve::merge_states(g, state(&va, &sa), state(&vb, &sb), state(&va, &so))
        .expect_err("an input as output");
    assert!(err.to_string().contains("writes its own buffers"), "{err}");
}

/// Cascade attention: four sequences share a prompt prefix of whole pages. Attending the prefix
/// once for every sequence's rows (no positions: all rows in one "sequence"), each suffix
/// causally, and merging the two states equals attending each sequence whole.
#[test]
fn a_shared_prefix_attended_once_and_merged_equals_the_whole() {
    let g = gpu();
    let (h, h_kv, d, ps) = (4, 2, 16, 16);
    let (prefix_pages, seqs) = (5, 4);
    let suffix_tokens = [20, 33, 16, 47];
    let rows = [1, 5, 16, 1];
    let mut b = random_batch(
        21,
        1,
        (10, 10),
        (1, 1),
        ps,
        (h, h_kv),
        d,
        KvLayout::Nhd,
        false,
    );
    // Pages: 0..5 the prefix, then each suffix's own.
    let suffix_pages: Vec<usize> = suffix_tokens
        .iter()
        .map(|t: &usize| t.div_ceil(ps))
        .collect();
    let max_pages = prefix_pages + suffix_pages.iter().sum::<usize>();
    b.config.max_pages = max_pages;
    b.pool = values(b.config.elements(), 77);
    let mut whole = PageTable {
        kv_indptr: vec![0],
        ..Default::default()
    };
    let mut suffix = whole.clone();
    let mut next = prefix_pages as u32;
    for s in 0..seqs {
        let own: Vec<u32> = (next..next + suffix_pages[s] as u32).collect();
        next += suffix_pages[s] as u32;
        whole.kv_indices.extend(0..prefix_pages as u32);
        whole.kv_indices.extend(&own);
        whole.kv_indptr.push(whole.kv_indices.len() as u32);
        suffix.kv_indices.extend(&own);
        suffix.kv_indptr.push(suffix.kv_indices.len() as u32);
        let last = (suffix_tokens[s] - (suffix_pages[s] - 1) * ps) as u32;
        whole.kv_last_page_len.push(last);
        suffix.kv_last_page_len.push(last);
    }
    let mut qo = vec![0u32];
    for r in rows {
        qo.push(qo.last().expect("indptr") + r);
    }
    let total_q = *qo.last().expect("indptr") as usize;
    b.table = whole;
    b.qo_indptr = qo.clone();
    b.q = values(total_q * h * d, 8);
    b.options = BatchOptions {
        causal: true,
        return_lse: true,
        ..Default::default()
    };
    // The whole batch, as the reference sees it, is what the cascade must give.
    let (want, _) = b.reference();

    let prefix = PageTable {
        kv_indptr: vec![0, prefix_pages as u32],
        kv_indices: (0..prefix_pages as u32).collect(),
        kv_last_page_len: vec![ps as u32],
    };
    let all_rows = [0, total_q as u32];
    let level = |table: &PageTable, qo_indptr: &[u32], causal: bool| {
        let inputs = PlanInputs {
            qo_indptr,
            table,
            options: BatchOptions {
                causal,
                return_lse: true,
                ..Default::default()
            },
            ..b.plan_inputs()
        };
        BatchAttention::plan(g, &inputs).expect("plan")
    };
    let pool = PagedKvPool::upload(g, b.config, &b.pool).expect("pool");
    let q =
        GpuTensor::upload(g, &Tensor::new([total_q, h, d], b.q.clone()).expect("q")).expect("q");
    let part = || {
        (
            GpuTensor::zeros(g, &[total_q, h, d]).expect("out"),
            GpuTensor::zeros(g, &[total_q, h]).expect("lse"),
        )
    };
    let (prefix_out, prefix_lse) = part();
    let (suffix_out, suffix_lse) = part();
    let (out, lse) = part();
    level(&prefix, &all_rows, false)
        .run(&q, &pool, &prefix_out, Some(&prefix_lse))
        .expect("prefix once");
    level(&suffix, &qo, true)
        .run(&q, &pool, &suffix_out, Some(&suffix_lse))
        .expect("suffixes");
    let state = |out, lse| wgpu_mha::serve::State { out, lse };
    wgpu_mha::serve::merge_states(
        g,
        state(&prefix_out, &prefix_lse),
        state(&suffix_out, &suffix_lse),
        state(&out, &lse),
    )
    .expect("merge");
    common::assert_close("cascade", out.read(g).expect("read").data(), &want);
}

#[test]
fn an_uploaded_pool_reads_back_and_copies_pages() {
    let g = gpu();
    let config = PoolConfig {
        page_size: 2,
        ..PoolConfig::new(3, 1, 4)
    };
    let data = values(config.elements(), 9);
    let pool = PagedKvPool::upload(g, config, &data).expect("upload");
    assert_eq!(pool.read(g).expect("read"), data);
    let mut encoder = g.device().create_command_encoder(&Default::default());
    pool.record_copy_pages(g, &mut encoder, &[(0, 2)])
        .expect("copy");
    g.queue().submit([encoder.finish()]);
    let n = config.page_elements();
    let mut want = data.clone();
    want.copy_within(0..n, 2 * n);
    assert_eq!(pool.read(g).expect("read"), want);
}

/// Decode batches (one query row per sequence): on a CPU adapter the lane-keys body runs them
/// (on a GPU, with GPU kernel shapes forced, or on GL, the tiles do); every option, page sizes, f16,
/// both layouts, keys split into chunks.
#[test]
fn decode_batches_match_the_reference() {
    let g = gpu();
    let f16 = g.has_f16();
    let cpu = g.kernel_class() == wgpu_mha::KernelClass::Cpu;
    let gl = g.info().backend == wgpu::Backend::Gl;
    let (mut split, mut lane_keys) = (false, false);
    for seed in 0..10u64 {
        let draw = Draw {
            heads: &[(4, 4), (8, 2), (8, 1), (6, 3), (16, 2)],
            head_dims: &[8, 12, 64, 128, 30],
            max_seqs: 20,
            max_ctx: [400, 3000],
            rows: (1, 1),
        };
        let (b, label, max_ctx) = draw.batch(&mut Rng::new(seed * 13 + 5), seed, seed + 100, f16);
        let label = format!("decode {label}");
        let plan = b.check(&label);
        // A CPU adapter runs the lane-keys body where it takes the heads, else the register
        // tiles; GL's llvmpipe never the lane keys (its GLSL route compiles them for minutes).
        assert_eq!(
            plan.lane_keys() || plan.register_tiled(),
            cpu,
            "{label}: {plan:?}"
        );
        assert!(!(plan.lane_keys() && gl), "{label}: {plan:?}");
        lane_keys |= plan.lane_keys();
        split |= plan.chunk_keys() < max_ctx;
    }
    assert!(
        split,
        "no decode batch split its keys: the merge went untested"
    );
    assert!(
        lane_keys || !cpu || gl,
        "no decode batch ran the lane-keys body"
    );
}

/// An f16 pool whose head size is whole vec4s is read as u32 words, two per vec4
/// (`paged_rows_half.wgsl`), by the decode and prefill bodies: against the reference at head
/// sizes 4 and 0 mod 8, both layouts, decode rows and prefill chunks.
#[test]
fn f16_pools_read_as_words_match_the_reference() {
    let g = gpu();
    if !g.has_f16() {
        return; // no f16 pool without SHADER_F16 (GL)
    }
    for (i, head_dim) in [12, 20, 64, 128].into_iter().enumerate() {
        for layout in [KvLayout::Nhd, KvLayout::Hnd] {
            for (rows, what) in [((1, 1), "decode"), ((30, 90), "prefill")] {
                let b = random_batch(
                    700 + i as u64,
                    5,
                    (100, 700),
                    rows,
                    16,
                    (8, 2),
                    head_dim,
                    layout,
                    true,
                );
                b.check(&format!("f16 {what}, d {head_dim}, {layout:?}"));
            }
        }
    }
}
