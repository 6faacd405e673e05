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
/// multi-pass paths. Lk spans several key tiles and query blocks, so the fused pass's causal
/// tile skipping meets rows that see no real key: a padded query of a left-padded sequence,
/// or a window over right padding. Such a row keeps the −1e9 answer, the mean of V over all
/// Lk keys, which only holds if no tile is skipped for it.
#[test]
fn padded_causal_masks_match_their_materialised_form() {
    use wgpu_mha::model::mask::AttnDims;
    use wgpu_mha::PaddingMask;
    let config = AttentionConfig::classic(32, 4).expect("config");
    let weights = AttentionWeights::random(&config, 7);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let (b, lk) = (2, 100);
    let attention_mask = padded_batch(lk);
    let x = Tensor::random([b, lk, 32], 8);
    for lq in [lk, 1, 2, 37] {
        let q = Tensor::random([b, lq, 32], 9 + lq as u64);
        let dims = AttnDims {
            batch: b,
            heads: 4,
            lq,
            lk,
        };
        for window in [None, Some(3), Some(40)] {
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
                for mask in [&compact, &materialised] {
                    let got = mha
                        .forward_with(&q, &x, &x, mask, &options(path, false))
                        .unwrap_or_else(|e| panic!("{label} {}: {e}", mask.kind_name()));
                    assert_close(
                        &format!("{label} {}", mask.kind_name()),
                        got.output.data(),
                        &want.output,
                    );
                }
            }
        }
    }
}

/// `[2, lk]` Hugging Face attention mask (1 = a real token): sequence 0 right-padded (57 real
/// tokens), sequence 1 left-padded (41 pads), both past one key tile and one query block.
fn padded_batch(lk: usize) -> wgpu_mha::MaskTensor {
    let keep: Vec<u8> = (0..2 * lk)
        .map(|e| match e / lk {
            0 => (e % lk < 57) as u8,
            _ => (e % lk >= 41) as u8,
        })
        .collect();
    wgpu_mha::MaskTensor::new([2, lk], keep).expect("mask")
}

/// The compact padded mask through a KvCache: a prefill of 100 tokens (past one query block and
/// several key tiles), then single tokens, each step with the attention mask cut to the keys it
/// has, equal to the f64 reference of that step's queries over the keys so far (a padded query
/// sees no real key and averages all of them, so its row depends on how many there are), plain
/// causal and windowed.
#[test]
fn padded_causal_masks_decode_through_a_kv_cache() {
    let config = AttentionConfig::classic(32, 4).expect("config");
    let weights = AttentionWeights::random(&config, 11);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).expect("module");
    let (b, lk, d) = (2, 104, 32);
    let attention_mask = padded_batch(lk);
    let x = Tensor::random([b, lk, d], 12);
    // Positions [from, to) of each sequence, from a [2, lk, width] tensor's data.
    let cut = |data: &[f32], width: usize, from: usize, to: usize| -> Vec<f32> {
        (0..b)
            .flat_map(|s| data[(s * lk + from) * width..(s * lk + to) * width].to_vec())
            .collect()
    };
    for window in [None, Some(5)] {
        let mut cache = wgpu_mha::KvCache::new(&mha, b, lk).expect("cache");
        let mut at = 0;
        for n in [100, 1, 1, 1, 1] {
            let keep = (0..b)
                .flat_map(|s| attention_mask.data()[s * lk..s * lk + at + n].to_vec())
                .collect();
            let keep = wgpu_mha::MaskTensor::new([b, at + n], keep).expect("keep");
            let mask = Mask::causal_with_padding(window, &keep);
            let x_new = Tensor::new([b, n, d], cut(x.data(), d, at, at + n)).expect("x");
            let x_all = Tensor::new([b, at + n, d], cut(x.data(), d, 0, at + n)).expect("x");
            let want = reference::forward(&config, &weights, &x_new, &x_all, &x_all, &mask)
                .expect("reference");
            let opts = wgpu_mha::StepOptions {
                mask: Some(&mask),
                ..Default::default()
            };
            let got = mha
                .forward_step_with(&mut cache, &x_new, &opts)
                .unwrap_or_else(|e| panic!("window {window:?} step at {at}: {e}"));
            assert_close(
                &format!("window {window:?} step at {at} (+{n})"),
                got.data(),
                &want.output,
            );
            at += n;
        }
    }
}
