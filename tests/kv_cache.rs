//! KV cache decoding equals one full causal forward, for both module shapes and both paths.

mod common;

use common::{assert_close, assert_within, gpu, module, tolerance, BOTH_PATHS};
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Error, KvCache, Mask, MaskTensor,
    MultiHeadAttention, PaddingMask, StepOptions, Tensor,
};

/// Rows `start..start + n` of every batch of a `[B, L, W]` tensor.
fn rows(t: &Tensor, start: usize, n: usize) -> Tensor {
    let (b, l, w) = (t.shape()[0], t.shape()[1], t.shape()[2]);
    let mut data = Vec::with_capacity(b * n * w);
    for bi in 0..b {
        data.extend_from_slice(&t.data()[(bi * l + start) * w..(bi * l + start + n) * w]);
    }
    Tensor::new([b, n, w], data).unwrap()
}

fn rows_f64(v: &[f64], shape: [usize; 3], start: usize, n: usize) -> Vec<f64> {
    let [b, l, w] = shape;
    (0..b)
        .flat_map(|bi| {
            v[(bi * l + start) * w..(bi * l + start + n) * w]
                .iter()
                .copied()
        })
        .collect()
}

/// Feeds `x` in chunks of the given sizes and checks every step against the full causal
/// forward on the GPU and the f64 reference. `x_kv` = `None` means self-attention steps.
fn decode_and_check(
    label: &str,
    config: AttentionConfig,
    path: AttentionPath,
    x: &Tensor,
    x_kv: Option<&Tensor>,
    chunks: &[usize],
) {
    let (weights, mha) = module(config, 11);
    let (b, l) = (x.shape()[0], x.shape()[1]);
    let kv = x_kv.unwrap_or(x);
    let full = mha.forward(x, kv, kv, &Mask::Causal).unwrap();
    let want = reference::forward(&config, &weights, x, kv, kv, &Mask::Causal).unwrap();
    let out_shape = [b, l, config.output_dim()];

    let mut cache = KvCache::with_path(&mha, b, l, path).unwrap();
    assert_eq!(cache.path(), path, "{label}");
    let mut pos = 0;
    for &n in chunks {
        let step = match x_kv {
            None => mha.forward_step(&mut cache, &rows(x, pos, n)).unwrap(),
            Some(kv) => mha
                .forward_step_cross(&mut cache, &rows(x, pos, n), &rows(kv, pos, n))
                .unwrap(),
        };
        assert_eq!(step.shape(), &[b, n, config.output_dim()], "{label}");
        let host = rows(&full, pos, n);
        let d = step.max_abs_diff(host.data());
        assert!(
            d <= 1e-5,
            "{label}: step at {pos} (+{n}) differs from the full forward by {d:.3e}"
        );
        let r = rows_f64(&want.output, out_shape, pos, n);
        assert_within(
            &format!("{label}: step at {pos} vs reference"),
            step.data(),
            &r,
            tolerance(&want.output),
        );
        pos += n;
        assert_eq!(cache.len(), pos);
    }
    assert_eq!(pos, l, "{label}: chunks must cover the sequence");
}

/// Decodes on both paths, token by token after a prefill of `chunks[0]`.
fn decode_on_both_paths(
    label: &str,
    config: AttentionConfig,
    x: &Tensor,
    x_kv: Option<&Tensor>,
    chunks: &[usize],
) {
    for path in BOTH_PATHS {
        decode_and_check(&format!("{label} {path:?}"), config, path, x, x_kv, chunks);
    }
}

#[test]
fn classic_token_by_token_equals_full_causal_forward() {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let x = Tensor::random([2, 7, 32], 1);
    decode_on_both_paths("classic", config, &x, None, &[1; 7]);
}

#[test]
fn per_head_token_by_token_equals_full_causal_forward() {
    let config = AttentionConfig::per_head(24, 8, 12, 3).unwrap();
    let x = Tensor::random([2, 6, 24], 2);
    decode_on_both_paths("per-head", config, &x, None, &[1; 6]);
}

#[test]
fn per_head_cross_steps_equal_full_causal_cross_forward() {
    let config = AttentionConfig::per_head(20, 4, 8, 2).unwrap();
    let x_q = Tensor::random([1, 5, 20], 3);
    let x_kv = Tensor::random([1, 5, 20], 4);
    decode_on_both_paths("per-head cross", config, &x_q, Some(&x_kv), &[2, 1, 1, 1]);
}

#[test]
fn prefill_then_single_steps() {
    let classic = AttentionConfig::classic(24, 3).unwrap();
    let x = Tensor::random([3, 8, 24], 5);
    let per_head = AttentionConfig::per_head(16, 8, 4, 2).unwrap();
    let y = Tensor::random([2, 8, 16], 6);
    let (fused, multi_pass) = (AttentionPath::Fused, AttentionPath::MultiPass);
    let runs: [(&str, AttentionConfig, AttentionPath, &Tensor, &[usize]); 4] = [
        ("classic prefill 5", classic, fused, &x, &[5, 1, 1, 1]),
        (
            "classic prefill 3 multipass",
            classic,
            multi_pass,
            &x,
            &[3, 2, 1, 1, 1],
        ),
        ("per-head prefill 4", per_head, fused, &y, &[4, 1, 1, 1, 1]),
        (
            "per-head whole sequence at once",
            per_head,
            multi_pass,
            &y,
            &[8],
        ),
    ];
    for (label, config, path, x, chunks) in runs {
        decode_and_check(label, config, path, x, None, chunks);
    }
}

#[test]
fn growing_past_capacity_is_an_error_and_leaves_the_cache_unchanged() {
    let config = AttentionConfig::classic(16, 2).unwrap();
    let (_, mha) = module(config, 12);
    let x = Tensor::random([1, 5, 16], 7);
    let full = mha.forward(&x, &x, &x, &Mask::Causal).unwrap();

    let mut cache = KvCache::new(&mha, 1, 5).unwrap();
    mha.forward_step(&mut cache, &rows(&x, 0, 4)).unwrap();
    // Two more tokens do not fit: a clear error, nothing written.
    let err = mha
        .forward_step(&mut cache, &Tensor::random([1, 2, 16], 99))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::KvCacheFull {
                len: 4,
                new: 2,
                capacity: 5
            }
        ),
        "unexpected error: {err}"
    );
    assert!(err.to_string().contains("capacity 5"), "{err}");
    assert_eq!(cache.len(), 4);
    // The cache still holds exactly the first four tokens: the fifth step is what the full
    // forward gives at position 4.
    let last = mha.forward_step(&mut cache, &rows(&x, 4, 1)).unwrap();
    assert!(last.max_abs_diff(rows(&full, 4, 1).data()) <= 1e-5);
    assert_eq!(cache.remaining(), 0);
    assert!(matches!(
        mha.forward_step(&mut cache, &rows(&x, 0, 1)),
        Err(Error::KvCacheFull { .. })
    ));
}

#[test]
fn reset_starts_a_new_sequence() {
    let config = AttentionConfig::per_head(16, 4, 4, 4).unwrap();
    let (_, mha) = module(config, 13);
    let a = Tensor::random([1, 4, 16], 8);
    let b = Tensor::random([1, 4, 16], 9);
    let full_b = mha.forward(&b, &b, &b, &Mask::Causal).unwrap();

    let mut cache = KvCache::new(&mha, 1, 4).unwrap();
    mha.forward_step(&mut cache, &a).unwrap();
    assert_eq!(cache.len(), 4);
    cache.reset();
    assert!(cache.is_empty());
    for t in 0..4 {
        let step = mha.forward_step(&mut cache, &rows(&b, t, 1)).unwrap();
        assert!(
            step.max_abs_diff(rows(&full_b, t, 1).data()) <= 1e-5,
            "after reset, token {t}"
        );
    }
}

#[test]
fn bad_inputs_are_errors() {
    let config = AttentionConfig::classic(16, 2).unwrap();
    let (_, mha) = module(config, 14);
    let (_, other) = module(config, 15);
    let mut cache = KvCache::new(&mha, 2, 4).unwrap();
    // Wrong batch, wrong width.
    assert!(matches!(
        mha.forward_step(&mut cache, &Tensor::random([1, 1, 16], 0)),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        mha.forward_step(&mut cache, &Tensor::random([2, 1, 8], 0)),
        Err(Error::Shape { .. })
    ));
    // A cache belongs to the module that made it.
    assert!(other
        .forward_step(&mut cache, &Tensor::random([2, 1, 16], 0))
        .is_err());
    assert!(KvCache::new(&mha, 1, 0).is_err());
    assert_eq!(cache.len(), 0);
    // Zero new tokens: an empty answer, nothing cached.
    let none = mha
        .forward_step(&mut cache, &Tensor::zeros([2, 0, 16]))
        .unwrap();
    assert_eq!(none.shape(), &[2, 0, 16]);
    assert_eq!(cache.len(), 0);
}

fn masked(mask: &Mask) -> StepOptions<'_> {
    StepOptions {
        mask: Some(mask),
        ..Default::default()
    }
}

/// A batch of prompts of different lengths, left-padded to one length (Hugging Face's
/// `attention_mask`, 1 = real token): each step's mask is causal combined with the padding of
/// the positions so far. Every real token's step equals the full forward under the same
/// composed mask. (A padding query sees no key at all; under the seeds' −1e9 rule its row is
/// the mean of V over however many keys its call has, so those rows are not compared.)
#[test]
fn left_padded_prompts_decode_like_the_full_forward_with_their_padding() {
    let config = AttentionConfig::classic(24, 3).unwrap();
    let (b, l) = (3, 7);
    let pads = [0, 2, 5]; // leading padding tokens per sequence
    let keep: Vec<u8> = (0..b * l).map(|n| (n % l >= pads[n / l]) as u8).collect();
    let padding = |len: usize| {
        let cut: Vec<u8> = (0..b)
            .flat_map(|bi| keep[bi * l..bi * l + len].to_vec())
            .collect();
        PaddingMask::HfAttention(MaskTensor::new([b, len], cut).unwrap())
    };
    let dims = |lq: usize, lk: usize| AttnDims {
        batch: b,
        heads: config.heads,
        lq,
        lk,
    };
    let x = Tensor::random([b, l, 24], 21);
    for path in BOTH_PATHS {
        let (weights, mha) = module(config, 22);
        let full_mask = Mask::Causal
            .with_key_padding(&padding(l), dims(l, l))
            .unwrap();
        let want = reference::forward(&config, &weights, &x, &x, &x, &full_mask).unwrap();
        let mut cache = KvCache::with_path(&mha, b, l, path).unwrap();
        let mut pos = 0;
        for n in [3, 1, 1, 1, 1] {
            let mask = Mask::Causal
                .with_key_padding(&padding(pos + n), dims(n, pos + n))
                .unwrap();
            let step = mha
                .forward_step_with(&mut cache, &rows(&x, pos, n), &masked(&mask))
                .unwrap();
            let w = config.output_dim();
            for (bi, &pad) in pads.iter().enumerate() {
                for i in (0..n).filter(|&i| pos + i >= pad) {
                    let got = &step.data()[(bi * n + i) * w..][..w];
                    let r = &want.output[(bi * l + pos + i) * w..][..w];
                    assert_within(
                        &format!("{path:?} batch {bi} position {}", pos + i),
                        got,
                        r,
                        tolerance(&want.output),
                    );
                }
            }
            pos += n;
        }
        assert_eq!(cache.len(), l);
        // The mask is checked against this step's [B, H, n, len + n] before anything runs.
        let mut fresh = KvCache::with_path(&mha, b, l, path).unwrap();
        let wrong = Mask::Causal
            .with_key_padding(&padding(l), dims(1, l))
            .unwrap();
        let err = mha
            .forward_step_with(&mut fresh, &rows(&x, 0, 1), &masked(&wrong))
            .unwrap_err();
        assert!(matches!(err, Error::Mask(_)), "{err}");
        assert_eq!(fresh.len(), 0);
    }
}

/// A long cache holds its keys and values and step buffers for the steps actually asked for:
/// at h32 / kv_heads 8 / d128 and 32k tokens (268 MB of K/V in f32) the step buffers used to
/// be sized for the longest step one binding holds (about 670 MB more); now they start at a
/// few tokens and grow with the steps, and `bytes()` says what is held.
#[test]
fn a_long_cache_holds_step_buffers_for_the_steps_asked_for() {
    let config = AttentionConfig::classic(4096, 32)
        .unwrap()
        .with_kv_heads(8)
        .unwrap();
    let weights = AttentionWeights::random(&config, 1);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let cache = KvCache::new(&mha, 1, 32_768).unwrap();
    let bytes = cache.bytes();
    let kv = 2 * 8 * 32_768 * 128 * 4u64;
    // Chunks round the capacity up to whole chunks, never by more than one chunk.
    assert!(
        bytes.keys_values >= kv && bytes.keys_values < kv + kv / 4,
        "{bytes:?}"
    );
    assert!(bytes.step < kv / 8, "step buffers {bytes:?}");
    eprintln!("32k h32/kvh8/d128 cache: {bytes:?}");
    // A small module: a step longer than any before grows them, and the answer holds.
    let small = AttentionConfig::classic(32, 4).unwrap();
    let w = AttentionWeights::random(&small, 2);
    let mha = MultiHeadAttention::new(gpu(), small, &w).unwrap();
    let mut cache = KvCache::new(&mha, 1, 400).unwrap();
    let before = cache.bytes().step;
    let x = Tensor::random([1, 400, 32], 3);
    let want = reference::forward(&small, &w, &x, &x, &x, &Mask::Causal).unwrap();
    let prefill = mha.forward_step(&mut cache, &rows(&x, 0, 300)).unwrap();
    assert!(
        cache.bytes().step > before,
        "{before} → {:?}",
        cache.bytes()
    );
    assert_close(
        "prefill of 300",
        prefill.data(),
        &rows_f64(&want.output, [1, 400, 32], 0, 300),
    );
    let next = mha.forward_step(&mut cache, &rows(&x, 300, 100)).unwrap();
    assert_close(
        "100 more",
        next.data(),
        &rows_f64(&want.output, [1, 400, 32], 300, 100),
    );
    assert!(cache.reserve(&mha, cache.max_step() + 1).is_err());
}
