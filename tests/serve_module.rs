//! The module on a page pool: a two-layer toy decoder (RoPE, GQA) serves requests that arrive
//! at different steps, prefill in chunks mixed with other requests' decode tokens, and finish;
//! every request's outputs equal the same request run alone through a `KvCache`, and the pool
//! is empty at the end.

mod common;

use common::gpu;
use common::hf_cases::{assert_every_family_in, case_module};
use wgpu_mha::model::rope::Rope;
use wgpu_mha::serve::{KvLayout, PageAllocator, PagedKvPool, PagedStep, PoolConfig, Sequence};
use wgpu_mha::{AttentionConfig, GpuTensor, KvCache, MultiHeadAttention, Tensor};

/// A request: its tokens' inputs (`[len, E]`, fixed in advance: a toy decoder feeds no output
/// back) and when it arrives.
struct Request {
    arrives: usize,
    x: Tensor,
}

fn decoder(config: AttentionConfig) -> [MultiHeadAttention; 2] {
    [1, 2].map(|seed| common::module(config, seed).1)
}

/// The request alone: both layers over all its tokens through `KvCache` steps, `[len, E]`.
fn alone(layers: &[MultiHeadAttention; 2], x: &Tensor) -> Vec<f32> {
    let len = x.shape()[1];
    let mut h = x.clone();
    for layer in layers {
        let mut cache = KvCache::new(layer, 1, len).expect("cache");
        h = layer.forward_step(&mut cache, &h).expect("step");
    }
    h.data().to_vec()
}

#[test]
fn a_continuous_batch_matches_each_request_alone() {
    let e = 32;
    let config = AttentionConfig::classic(e, 4)
        .expect("config")
        .with_kv_heads(2)
        .expect("gqa")
        .with_rope(Rope::new(10_000.0, 8))
        .expect("rope");
    let layers = decoder(config);
    let lens = [3, 40, 17, 1, 64, 25, 9];
    let requests: Vec<Request> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| Request {
            arrives: i / 2,
            x: Tensor::random([1, len, e], 100 + i as u64),
        })
        .collect();
    let want: Vec<Vec<f32>> = requests.iter().map(|r| alone(&layers, &r.x)).collect();

    for (page_size, layout) in [(4, KvLayout::Nhd), (16, KvLayout::Hnd), (1, KvLayout::Nhd)] {
        let pool_config = PoolConfig {
            max_pages: 200 / page_size + 40,
            page_size,
            kv_heads: 2,
            head_dim: 8,
            layout,
            dtype: wgpu_mha::KvDtype::F32,
        };
        let pools = [(); 2].map(|_| PagedKvPool::new(gpu(), pool_config).expect("pool"));
        let mut alloc = PageAllocator::new(pool_config.max_pages, page_size);
        // Per request: its pages and how many of its tokens have run.
        let mut running: Vec<Option<(Sequence, usize)>> = requests.iter().map(|_| None).collect();
        let mut got: Vec<Vec<f32>> = lens.iter().map(|&l| vec![f32::NAN; l * e]).collect();
        let mut step = 0;
        let chunk = 16;
        while running
            .iter()
            .zip(&lens)
            .any(|(r, &len)| r.as_ref().is_none_or(|(_, done)| *done < len))
        {
            // Arrivals, then each running request's next tokens: a prefill chunk or one.
            for (i, r) in requests.iter().enumerate() {
                if r.arrives == step && running[i].is_none() {
                    running[i] = Some((alloc.sequence(), 0));
                }
            }
            let mut batch = Vec::new(); // (request, first token, count)
            for (i, slot) in running.iter_mut().enumerate() {
                if let Some((seq, done)) = slot {
                    let count = (lens[i] - *done).min(chunk);
                    if count > 0 {
                        let grown = alloc.grow(seq, count).expect("pages");
                        assert!(grown.copies.is_empty());
                        batch.push((i, *done, count));
                    }
                }
            }
            if batch.is_empty() {
                step += 1;
                continue;
            }
            let seqs: Vec<&Sequence> = batch
                .iter()
                .map(|&(i, ..)| &running[i].as_ref().expect("running").0)
                .collect();
            let table = alloc.table(&seqs);
            let mut qo = vec![0u32];
            let mut x = Vec::new();
            for &(i, first, count) in &batch {
                qo.push(qo.last().expect("indptr") + count as u32);
                x.extend_from_slice(&requests[i].x.data()[first * e..(first + count) * e]);
            }
            let tokens = x.len() / e;
            let plan =
                PagedStep::new(gpu(), &config, &pool_config, &qo, &table, None).expect("step");
            let x =
                GpuTensor::upload(gpu(), &Tensor::new([tokens, e], x).expect("x")).expect("upload");
            // Both layers in one submission.
            let mut encoder = gpu().device().create_command_encoder(&Default::default());
            let h1 = layers[0]
                .record_paged_step(&mut encoder, &plan, &pools[0], &x)
                .expect("layer 1");
            let h2 = layers[1]
                .record_paged_step(&mut encoder, &plan, &pools[1], &h1)
                .expect("layer 2");
            gpu().queue().submit([encoder.finish()]);
            let out = h2.read(gpu()).expect("read");
            let mut row = 0;
            for &(i, first, count) in &batch {
                got[i][first * e..(first + count) * e]
                    .copy_from_slice(&out.data()[row * e..(row + count) * e]);
                row += count;
                let (seq, done) = running[i].as_mut().expect("running");
                *done += count;
                // Finished: its pages go back.
                if *done == lens[i] {
                    alloc.release(std::mem::take(seq));
                }
            }
            step += 1;
        }
        assert_eq!(alloc.used_pages(), 0, "the pool is empty at the end");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let err = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                err <= 1e-5,
                "request {i} (page {page_size}, {layout:?}): max error {err:.3e} against it alone"
            );
        }
    }
}

#[test]
fn modules_a_pool_does_not_hold_yet_are_refused() {
    let base = AttentionConfig::classic(16, 2).expect("config");
    let pool_config = PoolConfig::new(4, 2, 8);
    let pool = PagedKvPool::new(gpu(), pool_config).expect("pool");
    let mut alloc = PageAllocator::new(4, 16);
    let mut seq = alloc.sequence();
    alloc.grow(&mut seq, 3).expect("pages");
    let table = alloc.table(&[&seq]);
    let step = PagedStep::new(gpu(), &base, &pool_config, &[0, 3], &table, None).expect("step");
    let x = GpuTensor::zeros(gpu(), &[3, 16]).expect("x");
    for (config, want) in [
        (base.with_sinks().expect("sinks"), "attention sinks"),
        (base.with_appended_keys(true, false), "appended keys"),
    ] {
        let (_, mha) = common::module(config, 3);
        let mut encoder = gpu().device().create_command_encoder(&Default::default());
        let err = mha
            .record_paged_step(&mut encoder, &step, &pool, &x)
            .expect_err(want)
            .to_string();
        assert!(err.contains(want), "{err} should name {want}");
    }
    let (_, mha) = common::module(base, 3);
    let mut encoder = gpu().device().create_command_encoder(&Default::default());
    let wrong = GpuTensor::zeros(gpu(), &[4, 16]).expect("x");
    let err = mha
        .record_paged_step(&mut encoder, &step, &pool, &wrong)
        .expect_err("4 rows for 3 tokens")
        .to_string();
    assert!(err.contains("paged step input"), "{err}");
}

/// Every decoder family's attention on a page pool equals transformers: each causal
/// self-attention case file of `tests/fixtures/hf` is served as a batch of its sequences (their
/// real tokens), a prefill of all but the last token, then the last, both through
/// `record_paged_step`, every row against transformers' float64 answer within the case's bound.
/// Modules a pool does not hold yet (sinks, MLA, T5's relative bias, appended keys) are
/// refused by name; their count is checked too.
#[test]
fn every_decoder_family_on_a_pool_answers_as_transformers() {
    let (mut served, mut refused) = (Vec::new(), Vec::new());
    for path in common::fixtures("hf") {
        let (file, module) = case_module(&path);
        let name = common::file_name(&path);
        let self_causal =
            file.metadata("causal") == Some("true") && file.metadata("attention") == Some("self");
        if !self_causal || name.contains("_dynamic.") {
            continue;
        }
        let x = file.tensor_f32("hidden_states").expect("hidden_states");
        let [b, l, e] = x.shape()[..] else {
            panic!("{name}: rank")
        };
        // Each sequence's real tokens (rows the attention mask keeps, left or right padding)
        // and their RoPE positions.
        let real: Vec<Vec<usize>> = match file.contains("attention_mask") {
            true => {
                let m = file.mask_tensor("attention_mask").expect("mask");
                (0..b)
                    .map(|bi| (0..l).filter(|&i| m.data()[bi * l + i] != 0).collect())
                    .collect()
            }
            false => vec![(0..l).collect(); b],
        };
        let positions: Vec<Vec<usize>> = match file.contains("position_ids") {
            true => {
                let (_, p) = file.tensor_indices("position_ids").expect("position_ids");
                real.iter()
                    .enumerate()
                    .map(|(bi, rows)| rows.iter().map(|&i| p[bi * l + i]).collect())
                    .collect()
            }
            false => real.iter().map(|rows| (0..rows.len()).collect()).collect(),
        };
        let lengths: Vec<usize> = real.iter().map(Vec::len).collect();
        let (_, want) = file.tensor_f64("out_f64").expect("out_f64");
        let bound = file
            .metadata("err_f32_vs_f64")
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(1e-4, |err| (10.0 * err).max(1e-5));
        let c = module.config;
        // Llama 4's chunked layers go on: the module itself must refuse them (a step takes a
        // window, no chunks), as it refuses temperature tuning, gates and output norms.
        if module.relative_bias.is_some() || module.mla.is_some() {
            refused.push(name);
            continue;
        }
        let mha = MultiHeadAttention::new(gpu(), c, &module.weights).expect("mha");
        let pool_config = PoolConfig {
            page_size: 4,
            ..PoolConfig::new(b * l.div_ceil(4) + 1, c.kv_heads, c.qk_head_dim)
        };
        let pool = PagedKvPool::new(gpu(), pool_config).expect("pool");
        let mut alloc = PageAllocator::new(pool_config.max_pages, 4);
        let mut seqs: Vec<Sequence> = (0..b).map(|_| alloc.sequence()).collect();
        let out_dim = c.output_dim();
        let mut outcome = Ok(());
        for prefill in [true, false] {
            // Step 1: every sequence's tokens but its last; step 2: the last.
            let counts: Vec<usize> = lengths
                .iter()
                .map(|&len| match (prefill, len > 1) {
                    (true, true) => len - 1,
                    (true, false) => len,
                    (false, true) => 1,
                    (false, false) => 0,
                })
                .collect();
            let starts: Vec<usize> = lengths
                .iter()
                .zip(&counts)
                .map(|(&len, &n)| if prefill { 0 } else { len - n })
                .collect();
            let mut qo = vec![0u32];
            let mut rows = Vec::new();
            let mut rope_positions = Vec::new();
            for bi in 0..b {
                alloc.grow(&mut seqs[bi], counts[bi]).expect("pages");
                qo.push(qo.last().expect("indptr") + counts[bi] as u32);
                for t in starts[bi]..starts[bi] + counts[bi] {
                    let i = real[bi][t];
                    rows.extend_from_slice(&x.data()[(bi * l + i) * e..(bi * l + i + 1) * e]);
                    rope_positions.push(positions[bi][t]);
                }
            }
            let tokens = rows.len() / e;
            let table = alloc.table(&seqs.iter().collect::<Vec<_>>());
            let window = module.window.map(|w| w - 1);
            let step = PagedStep::new(gpu(), &c, &pool_config, &qo, &table, window)
                .and_then(|s| s.with_rope_positions(&rope_positions))
                .expect("step");
            let xs =
                GpuTensor::upload(gpu(), &Tensor::new([tokens, e], rows).expect("x")).expect("x");
            let got = match mha.forward_paged_step(&step, &pool, &xs) {
                Ok(out) => out.read(gpu()).expect("read"),
                Err(err) => {
                    outcome = Err(err);
                    break;
                }
            };
            let mut row = 0;
            for bi in 0..b {
                for &i in &real[bi][starts[bi]..starts[bi] + counts[bi]] {
                    let expected = &want[(bi * l + i) * out_dim..(bi * l + i + 1) * out_dim];
                    let g = &got.data()[row * out_dim..(row + 1) * out_dim];
                    let label = format!("{name}: sequence {bi} token {i}");
                    common::assert_within(&label, g, expected, bound);
                    row += 1;
                }
            }
        }
        match outcome {
            Ok(()) => served.push(name),
            Err(err) => {
                assert!(err.to_string().contains("on a page pool"), "{name}: {err}");
                refused.push(name);
            }
        }
    }
    println!("served on a pool: {served:?}\nrefused: {refused:?}");
    assert_every_family_in(
        &served,
        &[
            "bart_decoder",
            "bloom",
            "clip_text",
            "codegen",
            "cohere",
            "falcon",
            "gemma_",
            "gemma2",
            "gemma3",
            "gpt2",
            "gpt_bigcode",
            "gpt_neo_",
            "gpt_neox",
            "gptj",
            "granite",
            "llama",
            "mistral",
            "mpt",
            "olmo_",
            "olmo2",
            "phi_",
            "phi3",
            "qwen2",
            "qwen3",
            "stablelm",
            "starcoder2",
            "xglm",
            "dbrx",
            "jamba",
        ],
        "served on a pool",
    );
    // What a pool does not hold yet: latent (MLA) caches, sinks, T5's (UMT5's, LongT5's)
    // relative bias, Llama 4's chunks and temperature, Qwen3-Next's output gate, BitNet's
    // output norm.
    let not_yet = [
        "deepseek_v2",
        "deepseek_v3",
        "gpt_oss",
        "t5_decoder",
        "umt5_decoder",
        "longt5_decoder",
        "llama4_text",
        "qwen3_next",
        "bitnet",
    ];
    for name in &refused {
        assert!(
            not_yet.iter().any(|f| name.starts_with(f)),
            "{name} was refused"
        );
    }
}

/// After `warm_up_paged`, serving compiles nothing: on a device of its own (so no other test's
/// passes count), every pass a step runs — at any mix of prefill chunks, decode rows and keys
/// split across work items — is already compiled, over f32 and f16 pools. The warm-up itself
/// compiles (the count would not move if it did nothing), holds only the passes it used (not a
/// contiguous forward's), and refuses what a step refuses.
#[test]
fn after_a_warm_up_no_step_compiles_a_pass() {
    let config = AttentionConfig::classic(32, 4)
        .expect("config")
        .with_kv_heads(2)
        .expect("gqa")
        .with_rope(Rope::new(10_000.0, 8))
        .expect("rope");
    let mut dtypes = vec![wgpu_mha::KvDtype::F32];
    if gpu().has_f16() {
        dtypes.push(wgpu_mha::KvDtype::F16);
    }
    for dtype in dtypes {
        let device = wgpu_mha::Gpu::new().expect("a device of this test's own");
        let weights = wgpu_mha::AttentionWeights::random(&config, 5);
        let layer = MultiHeadAttention::new(&device, config, &weights).expect("layer");
        let pool_config = PoolConfig {
            dtype,
            ..PoolConfig::new(200, 2, 8)
        };
        // A forward over a contiguous batch first: its attention pass is no paged step's, so
        // the warm-up must not hold it.
        let x = Tensor::random([1, 3, 32], 1);
        layer
            .forward(&x, &x, &x, &wgpu_mha::Mask::None)
            .expect("a contiguous forward");
        let made = device.cached_passes();
        let warm = layer.warm_up_paged(&pool_config).expect("warm up");
        let compiled = device.cached_passes();
        assert!(
            compiled > made && !warm.is_empty(),
            "{dtype:?}: the warm-up compiled"
        );
        assert!(
            warm.len() < compiled,
            "{dtype:?}: the warm-up holds {} passes, every one of the device's {compiled}",
            warm.len()
        );
        // The attention's own warm-up holds its bodies and merge, all among the layer's.
        let attention = wgpu_mha::serve::BatchAttention::warm_up(&device, 4, 2, 8, dtype)
            .expect("the attention's warm-up");
        assert!(
            !attention.is_empty() && attention.len() < warm.len(),
            "{dtype:?}: the attention's warm-up holds {} passes, the layer's {}",
            attention.len(),
            warm.len()
        );
        assert_eq!(device.cached_passes(), compiled, "{dtype:?}: nothing new");

        let pool = PagedKvPool::new(&device, pool_config).expect("pool");
        let mut alloc = PageAllocator::new(pool_config.max_pages, pool_config.page_size);
        let mut seqs: Vec<Sequence> = (0..4).map(|_| alloc.sequence()).collect();
        // New tokens per sequence and step: prefill chunks of many widths (every power of two
        // of query rows a tile shape takes), then decode rows over up to 1,700 keys (split),
        // some steps mixing both.
        let steps: [[usize; 4]; 8] = [
            [1, 0, 0, 0],
            [2, 3, 0, 0],
            [5, 9, 17, 0],
            [256, 1, 33, 64],
            [512, 1, 1, 1],
            [900, 1, 0, 1],
            [1, 1, 1, 1],
            [1, 0, 100, 1],
        ];
        for (n, counts) in steps.iter().enumerate() {
            let mut qo = vec![0u32];
            let mut running = Vec::new();
            for (seq, &count) in seqs.iter_mut().zip(counts) {
                if count > 0 {
                    alloc.grow(seq, count).expect("pages");
                    qo.push(qo.last().expect("indptr") + count as u32);
                    running.push(&*seq);
                }
            }
            let table = alloc.table(&running);
            let tokens = *qo.last().expect("indptr") as usize;
            let step =
                PagedStep::new(&device, &config, &pool_config, &qo, &table, None).expect("step");
            let x = GpuTensor::upload(&device, &Tensor::random([tokens, 32], n as u64)).expect("x");
            let out = layer
                .forward_paged_step(&step, &pool, &x)
                .expect("step")
                .read(&device)
                .expect("read");
            assert!(out.data().iter().all(|v| v.is_finite()), "step {n}: finite");
            assert_eq!(
                device.cached_passes(),
                compiled,
                "{dtype:?}, step {n} ({counts:?} new tokens) compiled a pass the warm-up did not"
            );
        }
        drop(warm);
    }

    let wrong_pool = PoolConfig::new(4, 1, 8);
    let (_, layer) = common::module(config, 3);
    let err = layer
        .warm_up_paged(&wrong_pool)
        .expect_err("a pool of 1 KV head for a layer of 2")
        .to_string();
    assert!(err.contains("kv_heads"), "{err}");
    let (_, sinks) = common::module(config.with_sinks().expect("sinks"), 3);
    let err = sinks
        .warm_up_paged(&PoolConfig::new(4, 2, 8))
        .expect_err("sinks")
        .to_string();
    assert!(err.contains("attention sinks"), "{err}");
}
