//! Problems past a device limit are split (over batches, then query blocks) or routed to the
//! fused path, and give the reference's answer; only a problem that cannot fit at all is an
//! `Err(TooLarge)` saying how much it needed and what the limit is. Shapes are chosen to cross
//! a 16 MiB storage binding (the device is made with its binding capped there: lavapipe binds
//! 128 MiB, a real GPU 2 GiB or more, so the same shapes cross it everywhere, at an eighth of
//! the work lavapipe's own limit would take) and 65,535 workgroups per dimension.

mod common;

use std::sync::OnceLock;

use common::{assert_close, assert_module_matches_on_both_paths, assert_within, options};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Error, ForwardOptions, Gpu, Mask,
    MultiHeadAttention, Tensor,
};

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| common::gpu_with_binding_cap(common::SMALL_BINDING))
}

fn limit_bytes() -> u64 {
    gpu().limits().max_storage_buffer_binding_size
}

fn module(config: AttentionConfig, seed: u64) -> (AttentionWeights, MultiHeadAttention) {
    let weights = AttentionWeights::random(&config, seed);
    let mha = MultiHeadAttention::new(gpu(), config, &weights)
        .unwrap_or_else(|e| panic!("module for {config:?}: {e}"));
    (weights, mha)
}

#[test]
fn probabilities_larger_than_a_binding_are_computed_in_query_blocks() {
    // [1, 8, 750, 750] f32 scores = 18 MB > 16 MiB: the multi-pass path splits queries.
    let (b, h, l) = (1, 8, 750);
    assert!(
        (4 * b * h * l * l) as u64 > limit_bytes(),
        "shape must cross the binding limit"
    );
    let config = AttentionConfig::classic(16, h).unwrap();
    let (weights, mha) = module(config, 1);
    let x = Tensor::random([b, l, 16], 2);
    let got = mha
        .forward_with(
            &x,
            &x,
            &x,
            &Mask::Causal,
            &options(AttentionPath::MultiPass, true),
        )
        .expect("split, not refused");
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    assert_close("output", got.output.data(), &want.output);
    let probs = got.probs.expect("probabilities");
    assert_eq!(probs.shape(), &[b, h, l, l]);
    assert_within("probabilities", probs.data(), &want.probs, 1e-5);
}

#[test]
fn more_batch_heads_than_workgroups_per_dimension_are_split_over_batches() {
    // 8,200 × 8 = 65,600 (batch, head) pairs > 65,535 workgroups along z.
    let (b, h, l) = (8200, 8, 2);
    let max = gpu().limits().max_compute_workgroups_per_dimension as usize;
    assert!(b * h > max);
    let (weights, mha) = module(AttentionConfig::classic(16, h).unwrap(), 3);
    let q = Tensor::random([b, l, 16], 4);
    let kv = Tensor::random([b, 3, 16], 5);
    let lens: Vec<usize> = (0..b).map(|i| i % 4).collect(); // includes empty sequences
    let mask = Mask::KeyPadding(lens);
    assert_module_matches_on_both_paths("B·H past the limit", &mha, &weights, &q, &kv, &mask);
}

#[test]
fn auto_routes_scores_past_the_limit_to_the_fused_path() {
    let (b, h, l) = (1, 8, 750);
    let (_, mha) = module(AttentionConfig::classic(16, h).unwrap(), 6);
    let x = Tensor::random([b, l, 16], 7);
    let got = mha
        .forward_with(&x, &x, &x, &Mask::None, &ForwardOptions::default())
        .unwrap();
    assert_eq!(got.path, AttentionPath::Fused);
    assert!(
        mha.workspace_bytes() < limit_bytes(),
        "no [B, H, Lq, Lk] buffer was allocated"
    );
}

#[test]
fn keys_and_values_past_one_binding_together_get_a_buffer_each() {
    // K and V of 33,792 keys × 64 floats are 8.25 MiB each: packed with Q they exceed the
    // 16 MiB binding, alone they fit; and keys cannot be split into chunks.
    // (Capped so that a device with larger bindings still runs a test of reasonable size.)
    let lk = (limit_bytes() as usize / (2 * 4 * 64) + 1024).min(300_000);
    let config = AttentionConfig::classic(64, 1).unwrap();
    let (weights, mha) = module(config, 11);
    let q = Tensor::random([1, 4, 64], 12);
    let k = Tensor::random([1, lk, 64], 13);
    let v = Tensor::random([1, lk, 64], 14);
    let runs = [
        ("shared key/value", &k, AttentionPath::Fused),
        ("shared key/value", &k, AttentionPath::MultiPass),
        ("distinct key and value", &v, AttentionPath::Fused),
    ];
    for (label, value, path) in runs {
        let want = reference::forward(&config, &weights, &q, &k, value, &Mask::None).unwrap();
        let got = mha
            .forward_with(&q, &k, value, &Mask::None, &options(path, false))
            .unwrap_or_else(|e| panic!("{label} {path:?}, Lk = {lk}: {e}"));
        assert_close(
            &format!("{label} {path:?}"),
            got.output.data(),
            &want.output,
        );
    }
}

#[test]
fn a_problem_that_cannot_fit_is_an_error_with_the_figures() {
    // One batch of keys alone is 600,000 × 8 floats = 19.2 MB > 16 MiB: nothing to split.
    let (_, mha) = module(AttentionConfig::classic(8, 1).unwrap(), 8);
    let q = Tensor::random([1, 1, 8], 9);
    let kv = Tensor::zeros([1, 600_000, 8]);
    let err = mha
        .forward(&q, &kv, &kv, &Mask::None)
        .expect_err("cannot fit");
    match &err {
        Error::TooLarge { needed, limit, .. } => {
            assert!(needed > limit);
            assert_eq!(*limit, limit_bytes());
        }
        other => panic!("expected TooLarge, got {other}"),
    }
    assert!(err.to_string().contains("bytes"), "{err}");
}

#[test]
fn weights_larger_than_a_binding_are_refused_at_construction() {
    // W_q and W_k of 1,500² floats each: 18 MB packed > 16 MiB.
    let config = AttentionConfig::per_head(1500, 1500, 1, 1).unwrap();
    let weights = AttentionWeights::random(&config, 10);
    let err = MultiHeadAttention::new(gpu(), config, &weights)
        .err()
        .expect("too large");
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}
