//! Rotary position embeddings and sliding windows: every variant against the f64 reference on
//! both paths and in f16, decoding with a KV cache equal to the full causal forward, and the
//! positions' checks. `tests/hf.rs` checks them against `transformers` (Llama, Mistral, …).

mod common;

use common::{assert_close, assert_within, gpu, options, relative_tolerance, BOTH_PATHS};
use wgpu_mha::model::rope::{Rope, RopeScaling};
use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Error, ForwardOptions, KvCache, Mask,
    MultiHeadAttention, Precision, StepOptions, Tensor,
};

fn llama(heads: usize, kv_heads: usize, rope: Rope) -> AttentionConfig {
    AttentionConfig::classic(8 * heads, heads)
        .unwrap()
        .with_kv_heads(kv_heads)
        .unwrap()
        .with_rope(rope)
        .unwrap()
}

fn ropes() -> Vec<Rope> {
    let plain = Rope::new(10_000.0, 8);
    vec![
        plain,
        // Partial rotary (GPT-NeoX's rotary_pct 0.5), interleaved pairs (GPT-J), scalings.
        Rope::new(10_000.0, 4),
        Rope {
            interleaved: true,
            ..plain
        },
        Rope {
            scaling: RopeScaling::Linear { factor: 4.0 },
            ..plain
        },
        Rope {
            theta: 500_000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_positions: 64.0,
            },
            ..plain
        },
    ]
}

#[test]
fn rotated_queries_and_keys_match_the_reference_on_both_paths() {
    let (b, l) = (2, 7);
    // Gapped positions, different per sequence.
    let positions: Vec<usize> = (0..b * l).map(|n| (n % l) * 3 + 100 * (n / l)).collect();
    for rope in ropes() {
        let config = llama(4, 2, rope);
        let weights = AttentionWeights::random(&config, 1);
        let module = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
        let x = Tensor::random([b, l, 32], 2);
        for (mask, pos) in [
            (Mask::Causal, None),
            (Mask::KeyPadding(vec![7, 4]), Some(&positions)),
        ] {
            let want = reference::forward_at(
                &config,
                &weights,
                &x,
                &x,
                &x,
                &mask,
                pos.map(|p| p.as_slice()),
            )
            .unwrap();
            // Without rotation the answer differs: the test can fail.
            let unrotated = AttentionConfig {
                rope: None,
                ..config
            };
            let plain = reference::forward(&unrotated, &weights, &x, &x, &x, &mask).unwrap();
            assert!(
                common::max_err_f64(&plain.output, &want.output) > 1e-3,
                "{rope:?}"
            );
            for path in BOTH_PATHS {
                let opts = ForwardOptions {
                    positions: pos.cloned(),
                    ..options(path, false)
                };
                let got = module.forward_with(&x, &x, &x, &mask, &opts).unwrap();
                assert_close(
                    &format!("{rope:?} {path:?}"),
                    got.output.data(),
                    &want.output,
                );
            }
        }
    }
}

#[test]
fn rope_in_f16_and_with_queries_past_the_keys_start() {
    let config = llama(4, 1, Rope::new(10_000.0, 8));
    let weights = AttentionWeights::random(&config, 3);
    // Cross form: 3 queries at the positions of the last 3 of 6 keys.
    let (q, kv) = (Tensor::random([1, 3, 32], 4), Tensor::random([1, 6, 32], 5));
    let want = reference::forward(&config, &weights, &q, &kv, &kv, &Mask::Causal).unwrap();
    let module = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let got = module.forward(&q, &kv, &kv, &Mask::Causal).unwrap();
    assert_close("cross", got.data(), &want.output);
    if gpu().has_f16() {
        let half =
            MultiHeadAttention::with_precision(gpu(), config, &weights, Precision::F16).unwrap();
        let got = half.forward(&q, &kv, &kv, &Mask::Causal).unwrap();
        assert_within(
            "f16",
            got.data(),
            &want.output,
            relative_tolerance(5e-3, &want.output),
        );
    }
    // More queries than keys have no positions to take.
    let err = module.forward(&kv, &q, &q, &Mask::None).unwrap_err();
    assert!(matches!(err, Error::Misuse(_)), "{err}");
    // Positions must be [B, Lk]; a module without RoPE takes none.
    let opts = ForwardOptions {
        positions: Some(vec![0; 5]),
        ..Default::default()
    };
    assert!(matches!(
        module.forward_with(&q, &kv, &kv, &Mask::None, &opts),
        Err(Error::Shape { .. })
    ));
    let (_, plain) = common::module(AttentionConfig::classic(32, 4).unwrap(), 6);
    let opts = ForwardOptions {
        positions: Some(vec![0; 6]),
        ..Default::default()
    };
    assert!(matches!(
        plain.forward_with(&q, &kv, &kv, &Mask::None, &opts),
        Err(Error::Misuse(_))
    ));
}

#[test]
fn sliding_windows_match_the_reference_and_decode_like_the_full_forward() {
    let config = llama(4, 2, Rope::new(10_000.0, 8));
    let weights = AttentionWeights::random(&config, 7);
    let module = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let (b, l) = (2, 9);
    let x = Tensor::random([b, l, 32], 8);
    for window in [1, 3, 9] {
        let mask = Mask::SlidingWindow(window);
        let want = reference::forward(&config, &weights, &x, &x, &x, &mask).unwrap();
        for path in BOTH_PATHS {
            let got = module
                .forward_with(&x, &x, &x, &mask, &options(path, false))
                .unwrap();
            assert_close(
                &format!("window {window} {path:?}"),
                got.output.data(),
                &want.output,
            );
            // Token by token after a prefill of 4: each step's window over the cache.
            let mut cache = KvCache::with_path(&module, b, l, path).unwrap();
            let w = config.output_dim();
            for (pos, n) in [(0, 4), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1)] {
                let rows: Vec<f32> = (0..b)
                    .flat_map(|bi| x.data()[(bi * l + pos) * 32..][..n * 32].to_vec())
                    .collect();
                let step = module
                    .forward_step_with(
                        &mut cache,
                        &Tensor::new([b, n, 32], rows).unwrap(),
                        &StepOptions {
                            mask: Some(&mask),
                            ..Default::default()
                        },
                    )
                    .unwrap();
                let r: Vec<f64> = (0..b)
                    .flat_map(|bi| want.output[(bi * l + pos) * w..][..n * w].to_vec())
                    .collect();
                assert_close(
                    &format!("window {window} {path:?} step at {pos}"),
                    step.data(),
                    &r,
                );
            }
        }
    }
    // The window differs from plain causal (so the test can fail), and 0 is refused.
    let causal = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let windowed =
        reference::forward(&config, &weights, &x, &x, &x, &Mask::SlidingWindow(3)).unwrap();
    assert!(common::max_err_f64(&causal.output, &windowed.output) > 1e-3);
    assert!(matches!(
        module.forward(&x, &x, &x, &Mask::SlidingWindow(0)),
        Err(Error::Mask(_))
    ));
}

#[test]
fn rope_decoding_with_a_cache_equals_the_causal_forward() {
    for rope in ropes() {
        let config = llama(4, 2, rope);
        let weights = AttentionWeights::random(&config, 9);
        let module = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
        let x = Tensor::random([1, 6, 32], 10);
        let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
        // Gapped positions, given to the forward and step by step to the cache.
        let gapped: Vec<usize> = (0..6).map(|i| 5 + 3 * i).collect();
        let at = reference::forward_at(&config, &weights, &x, &x, &x, &Mask::Causal, Some(&gapped))
            .unwrap();
        let mut cache = KvCache::new(&module, 1, 6).unwrap();
        let mut gapped_cache = KvCache::new(&module, 1, 6).unwrap();
        for (pos, n) in [(0, 2), (2, 1), (3, 1), (4, 2)] {
            let rows =
                Tensor::new([1, n, 32], x.data()[pos * 32..(pos + n) * 32].to_vec()).unwrap();
            let step = module.forward_step(&mut cache, &rows).unwrap();
            assert_close(
                &format!("{rope:?} step at {pos}"),
                step.data(),
                &want.output[pos * 32..(pos + n) * 32],
            );
            let options = StepOptions {
                positions: Some(&gapped[pos..pos + n]),
                ..Default::default()
            };
            let step = module
                .forward_step_with(&mut gapped_cache, &rows, &options)
                .unwrap();
            assert_close(
                &format!("{rope:?} gapped step at {pos}"),
                step.data(),
                &at.output[pos * 32..(pos + n) * 32],
            );
        }
    }
}
