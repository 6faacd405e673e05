//! Llama 4's chunked local attention (`Mask::Chunked`: causal within chunks of positions, with
//! or without a padding keep mask) and its attention temperature tuning (the scaled score of
//! the query at position p times ln(1 + ⌊(p + 1)/floor_scale⌋)·attn_scale + 1), each on the
//! fused path (prefill and decode shapes), the multi-pass path (probabilities too) and a KV
//! cache's steps across chunk boundaries, against the f64 reference; both change the answer,
//! so an engine that ignored them would fail.

mod common;

use common::{assert_close, check_both_paths, gpu, BOTH_PATHS};
use wgpu_mha::model::config::TemperatureTuning;
use wgpu_mha::model::mask::{AttnDims, MaskTensor};
use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Error, KvCache, Mask, MultiHeadAttention,
    StepOptions, Tensor,
};

const TUNING: TemperatureTuning = TemperatureTuning {
    floor_scale: 2.0,
    attn_scale: 0.5,
};

fn gqa() -> AttentionConfig {
    AttentionConfig::classic(32, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
}

fn chunked(b: usize, lk: usize, chunk: usize) -> Vec<Mask> {
    // Sequence 1 pads its last 2 keys.
    let keep: Vec<u8> = (0..b * lk)
        .map(|e| (e / lk == 0 || e % lk < lk - 2) as u8)
        .collect();
    vec![
        Mask::Chunked { chunk, keep: None },
        Mask::Chunked {
            chunk,
            keep: Some(MaskTensor::new([b, lk], keep).unwrap()),
        },
    ]
}

#[test]
fn chunks_and_temperature_match_the_reference_on_every_path() {
    let (b, lk) = (2, 13);
    for (tuned, config) in [
        (false, gqa()),
        (true, gqa().with_temperature(TUNING).unwrap()),
    ] {
        for lq in [13, 1, 2] {
            let q = Tensor::random([b, lq, 32], 20 + lq as u64);
            let kv = Tensor::random([b, lk, 32], 30);
            let mut masks = chunked(b, lk, 4);
            masks.push(Mask::Chunked {
                chunk: 1,
                keep: None,
            });
            masks.push(Mask::Chunked {
                chunk: 64,
                keep: None,
            });
            if tuned {
                masks.extend([Mask::Causal, Mask::SlidingWindow(3), Mask::None]);
            }
            for mask in masks {
                check_both_paths(
                    &format!("tuned {tuned} Lq {lq} {mask:?}"),
                    config,
                    &q,
                    &kv,
                    &mask,
                );
            }
        }
    }
    // Both bind: without either the answer is another one.
    let config = gqa().with_temperature(TUNING).unwrap();
    let weights = AttentionWeights::random(&config, 42);
    let x = Tensor::random([b, lk, 32], 3);
    let run = |c: &AttentionConfig, m: &Mask| reference::forward(c, &weights, &x, &x, &x, m);
    let chunk = Mask::Chunked {
        chunk: 4,
        keep: None,
    };
    let both = run(&config, &chunk).unwrap();
    let causal = run(&config, &Mask::Causal).unwrap();
    let untuned = run(&gqa(), &chunk).unwrap();
    assert!(common::max_err_f64(&both.output, &causal.output) > 1e-2);
    assert!(common::max_err_f64(&both.output, &untuned.output) > 1e-2);
}

#[test]
fn the_chunked_mask_hides_what_its_rule_says() {
    // Bottom-right: with Lq 3 of Lk 7, queries sit at positions 4, 5, 6; chunk 3 starts at 3
    // and 6.
    let m = Mask::Chunked {
        chunk: 3,
        keep: None,
    };
    let config = AttentionConfig::classic(4, 1).unwrap();
    let weights = AttentionWeights::random(&config, 1);
    let (q, kv) = (Tensor::random([1, 3, 4], 2), Tensor::random([1, 7, 4], 3));
    let probs = reference::forward(&config, &weights, &q, &kv, &kv, &m)
        .unwrap()
        .probs;
    let seen = |i: usize| -> Vec<usize> { (0..7).filter(|&j| probs[i * 7 + j] > 0.0).collect() };
    assert_eq!(seen(0), [3, 4]);
    assert_eq!(seen(1), [3, 4, 5]);
    assert_eq!(seen(2), [6]);
    let dims = AttnDims {
        batch: 1,
        heads: 1,
        lq: 3,
        lk: 7,
    };
    assert!(matches!(
        Mask::Chunked {
            chunk: 0,
            keep: None
        }
        .check(dims),
        Err(Error::Mask(_))
    ));
    let bad_keep = Mask::Chunked {
        chunk: 2,
        keep: Some(MaskTensor::new([2, 7], vec![1; 14]).unwrap()),
    };
    assert!(matches!(bad_keep.check(dims), Err(Error::Mask(_))));
}

#[test]
fn a_kv_cache_steps_across_chunks_like_the_forward() {
    let config = AttentionConfig::per_head(24, 16, 8, 4)
        .unwrap()
        .with_kv_heads(1)
        .unwrap()
        .with_temperature(TUNING)
        .unwrap();
    let weights = AttentionWeights::random(&config, 5);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let x = Tensor::random([2, 9, 24], 6);
    let mask = |_: usize| Mask::Chunked {
        chunk: 3,
        keep: None,
    };
    let want = reference::forward(&config, &weights, &x, &x, &x, &mask(0)).unwrap();
    let out = config.output_dim();
    for path in BOTH_PATHS {
        let mut cache = KvCache::with_path(&mha, 2, 9, path).unwrap();
        for (pos, n) in [(0, 4), (4, 1), (5, 1), (6, 3)] {
            let rows: Vec<f32> = (0..2)
                .flat_map(|b| x.data()[(b * 9 + pos) * 24..(b * 9 + pos + n) * 24].to_vec())
                .collect();
            let m = mask(pos);
            let step_options = StepOptions {
                mask: Some(&m),
                ..Default::default()
            };
            let step = mha
                .forward_step_with(
                    &mut cache,
                    &Tensor::new([2, n, 24], rows).unwrap(),
                    &step_options,
                )
                .unwrap();
            let r: Vec<f64> = (0..2)
                .flat_map(|b| want.output[(b * 9 + pos) * out..(b * 9 + pos + n) * out].to_vec())
                .collect();
            assert_close(&format!("{path:?} step at {pos}"), step.data(), &r);
        }
    }
}

#[test]
fn a_temperature_that_is_not_finite_is_refused() {
    for (floor_scale, attn_scale) in [
        (0.0, 0.1),
        (-1.0, 0.1),
        (f32::NAN, 0.1),
        (2.0, f32::INFINITY),
    ] {
        let t = TemperatureTuning {
            floor_scale,
            attn_scale,
        };
        match gqa().with_temperature(t) {
            Err(Error::Config(m)) => assert!(m.contains("temperature"), "{m}"),
            other => panic!("{t:?}: {other:?}"),
        }
    }
}
