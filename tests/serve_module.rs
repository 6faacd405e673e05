//! The module on a page pool: a two-layer toy decoder (RoPE, GQA) serves requests that arrive
//! at different steps, prefill in chunks mixed with other requests' decode tokens, and finish;
//! every request's outputs equal the same request run alone through a `KvCache`, and the pool
//! is empty at the end.

mod common;

use common::gpu;
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
            f16: false,
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
