//! ALiBi generated in the shader from per-head slopes: the slopes are BLOOM's and MPT's (values
//! printed by transformers' `build_alibi_tensor` and `build_mpt_alibi_tensor`, for power-of-two
//! and other head counts), and every path (fused prefill and decode, multi-pass with
//! probabilities, a KV cache's steps) matches the f64 reference for each mask kind and for
//! queries fewer than keys. Head size 8, which the
//! rest of the suite compiles anyway.

mod common;

use common::{assert_feature_binds, assert_steps_match_causal_forward, check_both_paths_over};
use wgpu_mha::model::config::alibi_slope;
use wgpu_mha::{AttentionConfig, AttentionWeights, Error, Mask, Tensor};

#[test]
fn slopes_are_blooms() {
    // Both series print 6 heads' slopes alike, and the first ten of 12 heads' (eight exact
    // powers of two, then 2^-0.5 and 2^-1.5); only the float32 rounding of the last two differs.
    const SIX: [f64; 6] = [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125];
    let twelve = |last: [f64; 2]| {
        let mut s = vec![
            0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
        ];
        s.extend([0.7071067690849304, 0.3535533845424652]);
        s.extend(last);
        s
    };
    // transformers' build_alibi_tensor(…, n_head, float64)[:, 0, 1] for 4, 6 and 12 heads.
    let bloom: [(usize, Vec<f64>); 3] = [
        (4, vec![0.25, 0.0625, 0.015625, 0.00390625]),
        (6, SIX.to_vec()),
        (12, twelve([0.1767766773700714, 0.0883883386850357])),
    ];
    // MPT's build_mpt_alibi_tensor(n_head, 2)[:, 0, 0] negated (every other slope of the next
    // power of two's series, odd ones first): the same slopes in the same head order.
    let mpt: [(usize, Vec<f64>); 2] = [
        (6, SIX.to_vec()),
        (12, twelve([0.1767766922712326, 0.0883883461356163])),
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
        let label = format!("H {heads}");
        check_both_paths_over(&label, config, [b, lk], &[11, 1, 3], (40, 50), |lq| {
            masks(b, lq, lk)
        });
        // The biases bind: without them the answer is another one.
        assert_feature_binds(&label, config, [b, lk], |c, _| c.alibi = None);
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
    let x = Tensor::random([2, 10, 48], 8);
    assert_steps_match_causal_forward("alibi", config, &weights, &x, &[5, 1, 1, 3]);
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
