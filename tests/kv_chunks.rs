//! KV caches stored in chunks (each chunk its own K and V buffers, as a cache larger than one
//! storage binding is stored): prefills crossing chunk ends, single steps on both sides of
//! them, RoPE, GQA, rows read element by element (d9), f16, and a 32,768-token context — each
//! equal to the f64 reference of the full causal forward.

mod common;

use common::{assert_close, assert_within, gpu, relative_tolerance};
use wgpu_mha::model::rope::Rope;
use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, KvCache, Mask, MultiHeadAttention, Precision,
    Tensor,
};

/// Rows `start..start + n` of every sequence of `[B, L, E]` data.
fn rows(data: &[f32], b: usize, l: usize, e: usize, start: usize, n: usize) -> Vec<f32> {
    (0..b)
        .flat_map(|s| data[(s * l + start) * e..(s * l + start + n) * e].to_vec())
        .collect()
}

fn rows_f64(data: &[f64], b: usize, l: usize, e: usize, start: usize, n: usize) -> Vec<f64> {
    (0..b)
        .flat_map(|s| data[(s * l + start) * e..(s * l + start + n) * e].to_vec())
        .collect()
}

/// Steps of these sizes through a cache chunked at one chunk unit, each checked against the
/// full causal forward.
fn decode_in_chunks(config: AttentionConfig, precision: Precision, steps: &[usize]) {
    let weights = AttentionWeights::random(&config, 3);
    let mha = MultiHeadAttention::with_precision(gpu(), config, &weights, precision).unwrap();
    let (b, e) = (2, config.model_dim);
    let len: usize = steps.iter().sum();
    let unit = KvCache::chunk_unit(&mha);
    let mut cache = KvCache::chunked(&mha, b, len, unit).unwrap();
    assert_eq!(cache.chunks(), len.div_ceil(unit));
    assert!(cache.chunks() >= 2, "the steps must cross a chunk's end");
    let x = Tensor::random([b, len, e], 4);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let tolerance = match precision {
        Precision::F16 => relative_tolerance(5e-3, &want.output),
        _ => common::tolerance(&want.output),
    };
    let mut pos = 0;
    for &n in steps {
        let input = Tensor::new([b, n, e], rows(x.data(), b, len, e, pos, n)).unwrap();
        let step = mha.forward_step(&mut cache, &input).unwrap();
        let expected = rows_f64(&want.output, b, len, e, pos, n);
        let label = format!("{config:?} {precision:?}: step of {n} at {pos}");
        assert_within(&label, step.data(), &expected, tolerance);
        pos += n;
    }
}

/// Steps around the first two chunk ends: a prefill across the first, single tokens (the
/// decode pass) up to and past the second, a short prefill across nothing.
fn steps(unit: usize) -> Vec<usize> {
    vec![unit + 40, 1, unit - 43, 1, 1, 1, 5, 1]
}

fn unit_of(config: AttentionConfig) -> usize {
    let weights = AttentionWeights::random(&config, 3);
    KvCache::chunk_unit(&MultiHeadAttention::new(gpu(), config, &weights).unwrap())
}

#[test]
fn a_chunked_cache_decodes_like_the_full_causal_forward() {
    let gqa_rope = AttentionConfig::classic(32, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
        .with_rope(Rope::new(10_000.0, 8))
        .unwrap();
    // d9: K/V rows read element by element; one key/value head (MQA).
    let odd = AttentionConfig::classic(36, 4)
        .unwrap()
        .with_kv_heads(1)
        .unwrap();
    for config in [gqa_rope, odd] {
        decode_in_chunks(config, Precision::F32, &steps(unit_of(config)));
    }
}

#[test]
fn a_chunked_f16_cache_decodes_like_the_full_causal_forward() {
    if !gpu().has_f16() {
        eprintln!("no SHADER_F16 on {}: not run", gpu().describe());
        return;
    }
    let config = AttentionConfig::classic(32, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap();
    decode_in_chunks(config, Precision::F16, &steps(unit_of(config)));
}

#[test]
fn a_32k_context_in_eight_chunks_decodes_like_the_reference() {
    let config = AttentionConfig::classic(16, 2)
        .unwrap()
        .with_kv_heads(1)
        .unwrap();
    let weights = AttentionWeights::random(&config, 5);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let (ctx, chunk, e) = (32_768, 4_096, 16);
    let x = Tensor::random([1, ctx + 2, e], 6);
    let mut cache = KvCache::chunked(&mha, 1, ctx + 2, chunk).unwrap();
    assert_eq!(cache.chunks(), 9);
    for start in (0..ctx).step_by(chunk) {
        let input = Tensor::new([1, chunk, e], rows(x.data(), 1, ctx + 2, e, start, chunk));
        mha.forward_step(&mut cache, &input.unwrap()).unwrap();
    }
    // The last two tokens one by one: each sees every key before it (causal, bottom-right).
    for pos in [ctx, ctx + 1] {
        let token = Tensor::new([1, 1, e], rows(x.data(), 1, ctx + 2, e, pos, 1)).unwrap();
        let step = mha.forward_step(&mut cache, &token).unwrap();
        let keys = Tensor::new([1, pos + 1, e], rows(x.data(), 1, ctx + 2, e, 0, pos + 1));
        let keys = keys.unwrap();
        let want = reference::forward(&config, &weights, &token, &keys, &keys, &Mask::Causal);
        assert_close(
            &format!("step at {pos}"),
            step.data(),
            &want.unwrap().output,
        );
    }
}

#[test]
fn chunked_caches_refuse_what_they_cannot_run() {
    let config = AttentionConfig::classic(16, 2).unwrap();
    let weights = AttentionWeights::random(&config, 7);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    assert!(KvCache::chunked(&mha, 1, 100, 0).is_err());
    let mut cache = KvCache::chunked(&mha, 1, 1000, 1).unwrap();
    // Rounded up to whole units: 1,000 tokens in one or two chunks.
    assert!(cache.chunks() <= 2);
    let x = Tensor::random([1, 1001, 16], 8);
    assert!(
        mha.forward_step(&mut cache, &x).is_err(),
        "past the capacity"
    );
    assert_eq!(cache.len(), 0);
}
