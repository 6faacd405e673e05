//! The decode pass (few query rows per sequence, split over key ranges and combined by a
//! reduce pass), which the fused path picks by itself for small Lq: equal to the multi-pass
//! path and the f64 reference at key counts on both sides of each split boundary, for GQA
//! groups, every mask kind, the −1e9 rule and PyTorch's NaN; and a KV cache decoding a long
//! context without any B·H·capacity² buffer.

mod common;

use common::{assert_close, gpu, options};
use wgpu_mha::kernels::decode;
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, KvCache, Mask, MultiHeadAttention,
    Tensor,
};

fn module(kv_heads: usize) -> (AttentionConfig, AttentionWeights, MultiHeadAttention) {
    module_of_width(32, kv_heads)
}

/// Four heads of `embed / 4`: 32 gives d8 (rows read as vec4s), 36 gives d9 (element by
/// element).
fn module_of_width(
    embed: usize,
    kv_heads: usize,
) -> (AttentionConfig, AttentionWeights, MultiHeadAttention) {
    let config = AttentionConfig::classic(embed, 4)
        .unwrap()
        .with_kv_heads(kv_heads)
        .unwrap();
    let weights = AttentionWeights::random(&config, 1);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    (config, weights, mha)
}

/// Keys per split of the decode pass this device runs for `lq` rows of `config`.
fn keys_per_split(config: &AttentionConfig, lq: usize) -> usize {
    let (group, d) = (config.kv_group(), config.qk_head_dim);
    decode::shape(gpu(), group, lq, d, config.v_head_dim, false).keys_per_split()
}

fn masks(b: usize, lq: usize, lk: usize) -> Vec<Mask> {
    let bits = common::bits(b * lq * lk, 3);
    vec![
        Mask::None,
        Mask::Causal,
        Mask::SlidingWindow(300),
        // Batch 1 has no valid key: the seeds' −1e9 rule gives the mean of V.
        Mask::KeyPadding(vec![lk, 0]),
        Mask::block([b, 1, lq, lk], &bits).unwrap(),
    ]
}

#[test]
fn decode_equals_multi_pass_and_the_reference_across_split_boundaries() {
    for (embed, kv_heads) in [(32, 4), (32, 2), (32, 1), (36, 2)] {
        let (config, weights, mha) = module_of_width(embed, kv_heads);
        for lq in [1, 2] {
            let s = keys_per_split(&config, lq);
            for lk in [1, s - 1, s, s + 1, 3 * s + 7] {
                let q = Tensor::random([2, lq, embed], lk as u64);
                let kv = Tensor::random([2, lk, embed], 7 * lk as u64);
                for mask in masks(2, lq, lk) {
                    let label = format!(
                        "E {embed} H_kv {kv_heads} Lk {lk} Lq {lq} {}",
                        mask.kind_name()
                    );
                    let want = reference::forward(&config, &weights, &q, &kv, &kv, &mask).unwrap();
                    let fused = mha
                        .forward_with(&q, &kv, &kv, &mask, &options(AttentionPath::Fused, false))
                        .unwrap();
                    assert_close(&label, fused.output.data(), &want.output);
                    let multi = mha
                        .forward_with(
                            &q,
                            &kv,
                            &kv,
                            &mask,
                            &options(AttentionPath::MultiPass, false),
                        )
                        .unwrap();
                    let d = fused.output.max_abs_diff(multi.output.data());
                    assert!(d <= 1e-5, "{label}: decode vs multi-pass {d:.3e}");
                }
            }
        }
    }
}

/// Heads wider than `decode_lane_keys` takes (d132 here) run `decode_attention`, whose lanes
/// share each key, on every adapter class.
#[test]
fn a_head_too_wide_for_lane_keys_decodes_on_shared_keys_like_the_reference() {
    let config = AttentionConfig::classic(264, 2)
        .unwrap()
        .with_kv_heads(1)
        .unwrap();
    let weights = AttentionWeights::random(&config, 3);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let shape = decode::shape(gpu(), 2, 1, 132, 132, false);
    assert!(!shape.lane_keys, "{shape:?}");
    let s = shape.keys_per_split();
    for lk in [s - 1, s + 1] {
        let q = Tensor::random([2, 1, 264], lk as u64);
        let kv = Tensor::random([2, lk, 264], 3 * lk as u64);
        let bits = common::bits(2 * lk, 5);
        for mask in [Mask::Causal, Mask::block([2, 1, 1, lk], &bits).unwrap()] {
            let label = format!("d132 Lk {lk} {}", mask.kind_name());
            let want = reference::forward(&config, &weights, &q, &kv, &kv, &mask).unwrap();
            let fused = mha
                .forward_with(&q, &kv, &kv, &mask, &options(AttentionPath::Fused, false))
                .unwrap();
            assert_close(&label, fused.output.data(), &want.output);
        }
    }
}

#[test]
fn a_row_of_only_minus_infinity_is_nan_as_on_the_other_paths() {
    let (config, _, mha) = module(2);
    let split = keys_per_split(&config, 1);
    let lk = split + 3;
    let q = Tensor::random([1, 1, 32], 1);
    let kv = Tensor::random([1, lk, 32], 2);
    // Every key −inf: NaN. Only the keys of the second split finite: an ordinary answer.
    let all = Mask::Bias(Tensor::new([lk], vec![f32::NEG_INFINITY; lk]).unwrap());
    let tail: Vec<f32> = (0..lk)
        .map(|j| if j < split { f32::NEG_INFINITY } else { 0.0 })
        .collect();
    let tail = Mask::Bias(Tensor::new([lk], tail).unwrap());
    for path in [AttentionPath::Fused, AttentionPath::MultiPass] {
        let out = mha
            .forward_with(&q, &kv, &kv, &all, &options(path, false))
            .unwrap();
        assert!(out.output.data().iter().all(|v| v.is_nan()), "{path:?}");
        let out = mha
            .forward_with(&q, &kv, &kv, &tail, &options(path, false))
            .unwrap();
        assert!(out.output.data().iter().all(|v| v.is_finite()), "{path:?}");
    }
}

#[test]
fn a_long_context_decodes_with_the_state_of_its_splits_only() {
    // 16,384 keys: 32 splits per step; the cache holds K/V and the decode state, never a
    // B·H·capacity² buffer (which would be 4 GiB here).
    let (config, weights, mha) = module(2);
    let (ctx, chunk) = (16_384, 4_096);
    let x = Tensor::random([1, ctx + 1, 32], 5);
    let mut cache = KvCache::new(&mha, 1, ctx + 1).unwrap();
    assert_eq!(cache.path(), AttentionPath::Fused);
    for start in (0..ctx).step_by(chunk) {
        let rows = Tensor::new(
            [1, chunk, 32],
            x.data()[start * 32..(start + chunk) * 32].to_vec(),
        )
        .unwrap();
        mha.forward_step(&mut cache, &rows).unwrap();
    }
    let last = Tensor::new([1, 1, 32], x.data()[ctx * 32..].to_vec()).unwrap();
    let step = mha.forward_step(&mut cache, &last).unwrap();
    // The reference for the last query alone: causal bottom-right, it sees every key.
    let want = reference::forward(&config, &weights, &last, &x, &x, &Mask::Causal).unwrap();
    assert_close("step at 16,384", step.data(), &want.output);
}

#[test]
fn an_f16_module_caches_f16_keys_and_decodes_like_its_forward() {
    if !gpu().has_f16() {
        eprintln!(
            "no SHADER_F16 on {}: the f16 cache is not run",
            gpu().describe()
        );
        return;
    }
    let config = AttentionConfig::classic(32, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap();
    let weights = AttentionWeights::random(&config, 9);
    let half =
        MultiHeadAttention::with_precision(gpu(), config, &weights, wgpu_mha::Precision::F16)
            .unwrap();
    let x = Tensor::random([2, 7, 32], 10);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let mut cache = KvCache::new(&half, 2, 7).unwrap();
    for (pos, n) in [(0, 3), (3, 1), (4, 1), (5, 2)] {
        let rows: Vec<f32> = (0..2)
            .flat_map(|b| x.data()[(b * 7 + pos) * 32..(b * 7 + pos + n) * 32].to_vec())
            .collect();
        let step = half
            .forward_step(&mut cache, &Tensor::new([2, n, 32], rows).unwrap())
            .unwrap();
        let r: Vec<f64> = (0..2)
            .flat_map(|b| want.output[(b * 7 + pos) * 32..(b * 7 + pos + n) * 32].to_vec())
            .collect();
        common::assert_within(
            &format!("f16 step at {pos}"),
            step.data(),
            &r,
            common::relative_tolerance(5e-3, &want.output),
        );
    }
    assert!(KvCache::with_path(&half, 1, 4, AttentionPath::MultiPass).is_err());
}
