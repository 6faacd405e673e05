//! A mask larger than one storage binding runs: each chunk of queries uploads only the window
//! of the mask it reads, so an `[L, L]` f32 bias past the binding limit gives the reference's
//! answer on both paths instead of a wgpu validation error. And a sliding window of any width
//! (2^31 ± 1, usize::MAX) is a window, never a wrapped negative one.

mod common;

use common::{assert_close, gpu, options};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Mask, MultiHeadAttention, Tensor,
};

#[test]
fn a_bias_larger_than_one_binding_runs_in_query_chunks() {
    // The first L whose [L, L] f32 bias exceeds the binding (5,793 at lavapipe's 128 MiB);
    // capped so that a device with larger bindings still runs a test of reasonable size.
    let limit = gpu().binding_limit();
    let l = (((limit / 4) as f64).sqrt() as usize + 1).min(6_000);
    let config = AttentionConfig::classic(8, 2).expect("config");
    let weights = AttentionWeights::random(&config, 1);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let x = Tensor::random([1, l, 8], 2);
    let bias = Mask::Bias(Tensor::random([l, l], 3).scaled(4.0));
    let want = reference::forward(&config, &weights, &x, &x, &x, &bias).expect("reference");
    for path in [AttentionPath::Fused, AttentionPath::MultiPass] {
        let got = mha
            .forward_with(&x, &x, &x, &bias, &options(path, false))
            .unwrap_or_else(|e| panic!("L = {l} {path:?}: {e}"));
        assert_close(
            &format!("L = {l} {path:?}"),
            got.output.data(),
            &want.output,
        );
    }
}

/// A sliding window of 2^31 ± 1 or usize::MAX keys is no window (a plain causal mask), on the
/// fused path (prefill and decode), the multi-pass path and a KvCache's steps. Such windows
/// used to wrap negative in the shaders' i32 arithmetic and in `Mask::hides`, hiding every key.
#[test]
fn windows_of_any_width_never_wrap() {
    let config = AttentionConfig::classic(16, 2).expect("config");
    let weights = AttentionWeights::random(&config, 4);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let x = Tensor::random([2, 7, 16], 5);
    let causal = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).expect("ref");
    let half = 1usize << 31;
    for w in [half - 1, half, half + 1, usize::MAX] {
        let window = Mask::SlidingWindow(w);
        let want = reference::forward(&config, &weights, &x, &x, &x, &window).expect("ref");
        assert_eq!(want.output, causal.output, "the reference, window {w}");
        for path in [AttentionPath::Fused, AttentionPath::MultiPass] {
            let got = mha
                .forward_with(&x, &x, &x, &window, &options(path, false))
                .unwrap_or_else(|e| panic!("window {w} {path:?}: {e}"));
            assert_close(
                &format!("window {w} {path:?}"),
                got.output.data(),
                &want.output,
            );
        }
        // Decode: one query row over the whole sequence (bottom-right aligned).
        let last: Vec<f32> = (0..2)
            .flat_map(|b| x.data()[(b * 7 + 6) * 16..(b * 7 + 7) * 16].to_vec())
            .collect();
        let q = Tensor::new([2, 1, 16], last).expect("q");
        let fused = options(AttentionPath::Fused, false);
        let got = mha
            .forward_with(&q, &x, &x, &window, &fused)
            .expect("decode");
        let rows: Vec<f64> = (0..2)
            .flat_map(|b| causal.output[(b * 7 + 6) * 16..(b * 7 + 7) * 16].to_vec())
            .collect();
        assert_close(&format!("decode, window {w}"), got.output.data(), &rows);
        // A KvCache step with the window as its mask.
        let mut cache = wgpu_mha::KvCache::new(&mha, 2, 7).expect("cache");
        let prefix: Vec<f32> = (0..2)
            .flat_map(|b| x.data()[b * 7 * 16..(b * 7 + 6) * 16].to_vec())
            .collect();
        let step_mask = window.clone();
        let opts = wgpu_mha::StepOptions {
            mask: Some(&step_mask),
            ..Default::default()
        };
        mha.forward_step_with(
            &mut cache,
            &Tensor::new([2, 6, 16], prefix).expect("x"),
            &opts,
        )
        .expect("prefill");
        let got = mha.forward_step_with(&mut cache, &q, &opts).expect("step");
        assert_close(&format!("step, window {w}"), got.data(), &rows);
    }
}

/// A decoder's padded batch as the compact mask (the causal or windowed rule in the shader,
/// one keep byte per key): equal to the f64 reference and to the materialised `[B, 1, Lq, Lk]`
/// mask it replaces, with left and right padding, on the fused (prefill and decode) and
/// multi-pass paths.
#[test]
fn padded_causal_masks_match_their_materialised_form() {
    use wgpu_mha::model::mask::AttnDims;
    use wgpu_mha::{MaskTensor, PaddingMask};
    let config = AttentionConfig::classic(32, 4).expect("config");
    let weights = AttentionWeights::random(&config, 7);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let (b, lk) = (2, 9);
    // Sequence 0 right-padded (6 real), sequence 1 left-padded (3 pads).
    let keep: Vec<u8> = (0..b * lk)
        .map(|e| match e / lk {
            0 => (e % lk < 6) as u8,
            _ => (e % lk >= 3) as u8,
        })
        .collect();
    let attention_mask = MaskTensor::new([b, lk], keep).expect("mask");
    for lq in [9, 1, 2] {
        let x = Tensor::random([b, lk, 32], 8);
        let q = Tensor::random([b, lq, 32], 9 + lq as u64);
        let dims = AttnDims {
            batch: b,
            heads: 4,
            lq,
            lk,
        };
        for window in [None, Some(3)] {
            let compact = Mask::causal_with_padding(window, &attention_mask);
            let base = window.map_or(Mask::Causal, Mask::SlidingWindow);
            let materialised = base
                .with_key_padding(&PaddingMask::HfAttention(attention_mask.clone()), dims)
                .expect("materialised");
            let want = reference::forward(&config, &weights, &q, &x, &x, &compact).expect("ref");
            let old = reference::forward(&config, &weights, &q, &x, &x, &materialised).unwrap();
            assert_eq!(
                want.output, old.output,
                "Lq {lq} window {window:?}: the reference"
            );
            for path in [AttentionPath::Fused, AttentionPath::MultiPass] {
                let label = format!("Lq {lq} window {window:?} {path:?}");
                let got = mha
                    .forward_with(&q, &x, &x, &compact, &options(path, false))
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_close(&label, got.output.data(), &want.output);
            }
        }
    }
}
