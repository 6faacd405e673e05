//! ALiBi generated in the shader from per-head slopes: the slopes are BLOOM's and MPT's (values
//! printed by transformers' `build_alibi_tensor` and `build_mpt_alibi_tensor`, for power-of-two
//! and other head counts), and every path (fused prefill and decode, multi-pass with
//! probabilities, a KV cache's steps) matches the f64 reference for each mask kind and for
//! queries fewer than keys. Head size 8, which the
//! rest of the suite compiles anyway.

mod common;

use common::{assert_close, check_both_paths, gpu};
use wgpu_mha::model::config::alibi_slope;
use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Error, KvCache, Mask, MultiHeadAttention, Tensor,
};

#[test]
fn slopes_are_blooms() {
    // transformers' build_alibi_tensor(…, n_head, float64)[:, 0, 1] for 4, 6 and 12 heads.
    let bloom: [(usize, &[f64]); 3] = [
        (4, &[0.25, 0.0625, 0.015625, 0.00390625]),
        (6, &[0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]),
        (
            12,
            &[
                0.5,
                0.25,
                0.125,
                0.0625,
                0.03125,
                0.015625,
                0.0078125,
                0.00390625,
                0.7071067690849304,
                0.3535533845424652,
                0.1767766773700714,
                0.0883883386850357,
            ],
        ),
    ];
    // MPT's build_mpt_alibi_tensor(n_head, 2)[:, 0, 0] negated (every other slope of the next
    // power of two's series, odd ones first): the same slopes in the same head order.
    let mpt: [(usize, &[f64]); 2] = [
        (6, &[0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]),
        (
            12,
            &[
                0.5,
                0.25,
                0.125,
                0.0625,
                0.03125,
                0.015625,
                0.0078125,
                0.00390625,
                0.7071067690849304,
                0.3535533845424652,
                0.1767766922712326,
                0.0883883461356163,
            ],
        ),
    ];
    for (heads, slopes) in bloom.into_iter().chain(mpt) {
        for (h, want) in slopes.iter().enumerate() {
            let got = alibi_slope(h, heads, 8.0);
            assert!(
                (got - want).abs() < 1e-7,
                "{heads} heads, head {h}: {got} vs {want}"
            );
        }
    }
}

fn masks(b: usize, lq: usize, lk: usize) -> Vec<Mask> {
    let bits = common::bits(b * lq * lk, 17);
    vec![
        Mask::None,
        Mask::Causal,
        Mask::SlidingWindow(4),
        Mask::KeyPadding(vec![lk, lk - 3]),
        Mask::block([b, 1, lq, lk], &bits).unwrap(),
    ]
}

#[test]
fn alibi_matches_the_reference_on_every_path_and_mask() {
    // 4 heads (slopes of one series) and 6 (two interleaved series), GQA in the second; a
    // large max_bias makes the biases dominate the scores.
    for (heads, kv_heads, max_bias) in [(4, 4, 8.0), (6, 3, 16.0)] {
        let config = AttentionConfig::classic(8 * heads, heads)
            .unwrap()
            .with_kv_heads(kv_heads)
            .unwrap()
            .with_alibi(max_bias)
            .unwrap();
        let (b, lk) = (2, 11);
        for lq in [11, 1, 3] {
            let q = Tensor::random([b, lq, 8 * heads], 40 + lq as u64);
            let kv = Tensor::random([b, lk, 8 * heads], 50);
            for mask in masks(b, lq, lk) {
                check_both_paths(
                    &format!("H {heads} Lq {lq} {}", mask.kind_name()),
                    config,
                    &q,
                    &kv,
                    &mask,
                );
            }
        }
        // The biases bind: without them the answer is another one.
        let weights = AttentionWeights::random(&config, 42);
        let x = Tensor::random([b, lk, 8 * heads], 3);
        let plain = AttentionConfig {
            alibi: None,
            ..config
        };
        let with = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
        let without = reference::forward(&plain, &weights, &x, &x, &x, &Mask::Causal).unwrap();
        assert!(common::max_err_f64(&with.output, &without.output) > 1e-2);
    }
}

#[test]
fn a_kv_cache_decodes_with_alibi_like_the_reference() {
    let config = AttentionConfig::classic(48, 6)
        .unwrap()
        .with_kv_heads(1)
        .unwrap()
        .with_alibi(8.0)
        .unwrap();
    let weights = AttentionWeights::random(&config, 7);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let x = Tensor::random([2, 10, 48], 8);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let mut cache = KvCache::new(&mha, 2, 10).unwrap();
    for (pos, n) in [(0, 5), (5, 1), (6, 1), (7, 3)] {
        let rows: Vec<f32> = (0..2)
            .flat_map(|b| x.data()[(b * 10 + pos) * 48..(b * 10 + pos + n) * 48].to_vec())
            .collect();
        let step = mha
            .forward_step(&mut cache, &Tensor::new([2, n, 48], rows).unwrap())
            .unwrap();
        let r: Vec<f64> = (0..2)
            .flat_map(|b| want.output[(b * 10 + pos) * 48..(b * 10 + pos + n) * 48].to_vec())
            .collect();
        assert_close(&format!("step at {pos}"), step.data(), &r);
    }
}

#[test]
fn a_max_bias_that_is_not_finite_and_positive_is_refused() {
    for m in [0.0, -8.0, f32::NAN, f32::INFINITY] {
        match AttentionConfig::classic(32, 4).unwrap().with_alibi(m) {
            Err(Error::Config(text)) => assert!(text.contains("ALiBi"), "{text}"),
            other => panic!("max_bias {m}: {other:?}"),
        }
    }
}
