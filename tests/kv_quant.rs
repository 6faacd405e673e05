//! Quantized KV caches (q8_0, q4_0): every step's output equals the f64 reference computed on
//! the keys and values the cache holds, dequantized (the quantization is the only
//! approximation), on the decode and flash passes, in one chunk and across chunks, over f32
//! and f16 modules, GQA; each block round-trips within half its step; bad input is an `Err`.

mod common;

use common::{assert_within, gpu, relative_tolerance, sdpa_core};
use wgpu_mha::kv_dtype::{quantize_block, BLOCK};
use wgpu_mha::reference;
use wgpu_mha::{
    AttentionConfig, AttentionPath, AttentionWeights, Error, KvCache, KvDtype, Mask,
    MultiHeadAttention, Precision, SdpaOptions, Tensor,
};

/// `[B, H_kv, L, d]` as `[B, L, H_kv·d]` in f64 (the reference core's layout).
fn sequence_major(t: &Tensor) -> Vec<f64> {
    let [b, h, l, d] = t.shape()[..] else {
        panic!("[B, H, L, d]")
    };
    let mut out = vec![0.0; b * h * l * d];
    for bi in 0..b {
        for hi in 0..h {
            for li in 0..l {
                for e in 0..d {
                    out[((bi * l + li) * h + hi) * d + e] =
                        t.data()[((bi * h + hi) * l + li) * d + e] as f64;
                }
            }
        }
    }
    out
}

/// The f64 reference of one causal step: the `[b, n, E]` `rows` projected to queries, attending
/// (bottom-right aligned) to `lk` keys and values in the reference core's layout, then the
/// output projection.
fn step_reference(
    config: AttentionConfig,
    weights: &AttentionWeights,
    rows: &[f32],
    [b, n, lk]: [usize; 3],
    keys: &[f64],
    values: &[f64],
) -> Vec<f64> {
    let x64: Vec<f64> = rows.iter().map(|&v| v as f64).collect();
    let q = reference::linear(&x64, b * n, &weights.q);
    let options = SdpaOptions {
        mask: Mask::Causal,
        scale: Some(config.scale()),
        ..Default::default()
    };
    let (h, kvh, dk, dv) = (
        config.heads,
        config.kv_heads,
        config.qk_head_dim,
        config.v_head_dim,
    );
    let (combined, _) = sdpa_core([b, h, kvh, n, lk, dk, dv], &options).run(&q, keys, values);
    reference::linear(&combined, b * n, weights.o.as_ref().unwrap())
}

/// Every block of `exact` (the f32 cache's) against `stored` (the quantized cache's, decoded):
/// within half a step (a q4_0 value at the clamp: within a step). The largest error, in steps.
fn check_round_trip(label: &str, dtype: KvDtype, exact: &Tensor, stored: &Tensor) -> f64 {
    let mut worst = 0.0f64;
    for (blk, (x, y)) in exact
        .data()
        .chunks(BLOCK)
        .zip(stored.data().chunks(BLOCK))
        .enumerate()
    {
        // The device rounds its scale to f16 itself: allow that rounding's worth of slack.
        let d = quantize_block(dtype, x).0.to_f32().abs() as f64;
        for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
            let at_clamp = dtype == KvDtype::Q4_0 && (a as f64 / d).abs() >= 7.45;
            let step = if at_clamp { d } else { d / 2.0 };
            let err = (a as f64 - b as f64).abs();
            assert!(
                err <= step * 1.002 + 1e-30,
                "{label}: block {blk}[{i}]: {a} stored as {b}, step {d}"
            );
            if d > 0.0 {
                worst = worst.max(err / d);
            }
        }
    }
    worst
}

/// Steps of `steps` tokens through a `dtype` cache (chunked at one chunk unit when `chunked`)
/// and an f32 twin; each step's output against the f64 core over the quantized cache's own
/// keys and values.
fn steps_match_reference(
    config: AttentionConfig,
    precision: Precision,
    dtype: KvDtype,
    steps: &[usize],
    chunked: bool,
) {
    let label = format!(
        "{dtype} {precision:?} h{}/{} d{}",
        config.heads, config.kv_heads, config.qk_head_dim
    );
    let weights = AttentionWeights::random(&config, 5);
    let mha = MultiHeadAttention::with_precision(gpu(), config, &weights, precision).unwrap();
    let (b, e) = (2, config.model_dim);
    let len: usize = steps.iter().sum();
    let mut cache = match chunked {
        true => KvCache::chunked_with(&mha, b, len, KvCache::chunk_unit(&mha), Some(dtype)),
        false => KvCache::new_with(&mha, b, len, dtype),
    }
    .unwrap();
    assert_eq!(cache.dtype(), dtype);
    if chunked {
        assert!(
            cache.chunks() >= 2,
            "{label}: the steps must cross a chunk's end"
        );
    }
    let mut twin = KvCache::new(&mha, b, len).unwrap();
    let x = Tensor::random([b, len, e], 6);
    let mut pos = 0;
    for &n in steps {
        let rows: Vec<f32> = (0..b)
            .flat_map(|s| x.data()[(s * len + pos) * e..(s * len + pos + n) * e].to_vec())
            .collect();
        let input = Tensor::new([b, n, e], rows.clone()).unwrap();
        let got = mha.forward_step(&mut cache, &input).unwrap();
        mha.forward_step(&mut twin, &input).unwrap();
        let (keys, values) = cache.read_keys_values(gpu()).unwrap();
        let (exact_keys, exact_values) = twin.read_keys_values(gpu()).unwrap();
        if precision == Precision::F32 {
            check_round_trip(&format!("{label} keys"), dtype, &exact_keys, &keys);
            check_round_trip(&format!("{label} values"), dtype, &exact_values, &values);
        }
        // The reference over the keys and values as the cache decodes them.
        let (keys, values) = (sequence_major(&keys), sequence_major(&values));
        let want = step_reference(config, &weights, &rows, [b, n, pos + n], &keys, &values);
        let tolerance = match precision {
            Precision::F32 => relative_tolerance(1e-5, &want),
            _ => relative_tolerance(5e-3, &want),
        };
        assert_within(
            &format!("{label}: step of {n} at {pos}"),
            got.data(),
            &want,
            tolerance,
        );
        pos += n;
    }
}

#[test]
fn q8_0_and_q4_0_steps_equal_the_reference_on_their_dequantized_cache() {
    // d64 throughout: each head size is a pipeline of its own per type, which GL compiles slowly.
    let mha = AttentionConfig::classic(128, 2).unwrap();
    let gqa = AttentionConfig::classic(256, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap();
    for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
        // A prefill (flash), single tokens (decode), a short prefill, and more single tokens.
        steps_match_reference(mha, Precision::F32, dtype, &[37, 1, 1, 6, 1], false);
        steps_match_reference(gqa, Precision::F32, dtype, &[20, 1, 3, 1], false);
    }
}

#[test]
fn quantized_steps_cross_chunk_ends() {
    let config = AttentionConfig::classic(128, 2).unwrap(); // d64
    let probe =
        MultiHeadAttention::new(gpu(), config, &AttentionWeights::random(&config, 1)).unwrap();
    let unit = KvCache::chunk_unit(&probe);
    for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
        steps_match_reference(
            config,
            Precision::F32,
            dtype,
            &[unit - 3, 1, 1, 1, 1, 5, 1],
            true,
        );
    }
}

#[test]
fn quantized_caches_over_an_f16_module() {
    if !gpu().has_f16() {
        eprintln!("skipped: no SHADER_F16 on {}", gpu().describe());
        return;
    }
    let config = AttentionConfig::classic(128, 2).unwrap();
    for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
        steps_match_reference(config, Precision::F16, dtype, &[9, 1, 1], false);
    }
}

#[test]
fn quantized_caches_report_their_blocks_bytes() {
    let config = AttentionConfig::classic(256, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap();
    let mha =
        MultiHeadAttention::new(gpu(), config, &AttentionWeights::random(&config, 1)).unwrap();
    let f32_cache = KvCache::new(&mha, 3, 100).unwrap();
    for (dtype, per_32) in [(KvDtype::Q8_0, 34), (KvDtype::Q4_0, 18)] {
        let cache = KvCache::new_with(&mha, 3, 100, dtype).unwrap();
        let bytes = cache.bytes();
        // Per token: K and V of 2 heads of 64 values, in blocks of 32.
        assert_eq!(
            bytes.per_token,
            (2 * 2 * 64 / 32 * per_32) as u64,
            "{dtype}"
        );
        let exact = 3 * 100 * bytes.per_token;
        assert!(
            bytes.keys_values >= exact && bytes.keys_values <= exact + 64,
            "{dtype}: {} bytes for {exact}",
            bytes.keys_values
        );
        assert!(
            bytes.keys_values * 3 < f32_cache.bytes().keys_values,
            "{dtype}"
        );
    }
}

#[test]
fn what_a_quantized_cache_cannot_hold_is_an_error_naming_it() {
    let odd = AttentionConfig::classic(80, 2).unwrap(); // d40
    let mha = MultiHeadAttention::new(gpu(), odd, &AttentionWeights::random(&odd, 1)).unwrap();
    let e = KvCache::new_with(&mha, 1, 8, KvDtype::Q8_0).unwrap_err();
    assert!(
        matches!(e, Error::Config(_)) && e.to_string().contains("40"),
        "{e}"
    );
    let config = AttentionConfig::classic(128, 4).unwrap();
    let mha =
        MultiHeadAttention::new(gpu(), config, &AttentionWeights::random(&config, 1)).unwrap();
    // A float type other than the module's.
    let e = KvCache::new_with(&mha, 1, 8, KvDtype::F16).unwrap_err();
    assert!(e.to_string().contains("f16 KV cache"), "{e}");
    // Heads too wide for the fused pass: the module runs multi-pass, which reads no blocks.
    let wide = AttentionConfig::classic(1024, 1).unwrap();
    let mha = MultiHeadAttention::new(gpu(), wide, &AttentionWeights::random(&wide, 1)).unwrap();
    if KvCache::with_path(&mha, 1, 8, AttentionPath::Fused).is_err() {
        let e = KvCache::new_with(&mha, 1, 8, KvDtype::Q4_0).unwrap_err();
        assert!(e.to_string().contains("multi-pass"), "{e}");
    }
    assert!(KvDtype::parse("q4_1").is_err());
}

/// MLA's latent cache stores keys only and reads its values from them: one quantized buffer,
/// one scales plane, read as keys and as values. A module with W_v = W_k (what the loader builds
/// for DeepSeek's absorbed form) stands in for it; the reference attends to the dequantized
/// keys as both.
#[test]
fn a_latent_cache_reads_its_values_from_its_quantized_keys() {
    let config = AttentionConfig::classic(128, 2)
        .unwrap()
        .with_values_from_keys()
        .unwrap();
    let mut weights = AttentionWeights::random(&config, 8);
    weights.v = weights.k.clone();
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let (b, e, len) = (2, config.model_dim, 12);
    let mut cache = KvCache::new_with(&mha, b, len, KvDtype::Q8_0).unwrap();
    // Keys only: 2 heads of 64 values, 34 bytes per 32.
    assert_eq!(cache.bytes().per_token, 2 * 64 / 32 * 34);
    let x = Tensor::random([b, len, e], 9);
    let mut pos = 0;
    for n in [5, 1, 1, 5] {
        let rows: Vec<f32> = (0..b)
            .flat_map(|s| x.data()[(s * len + pos) * e..(s * len + pos + n) * e].to_vec())
            .collect();
        let got = mha
            .forward_step(&mut cache, &Tensor::new([b, n, e], rows.clone()).unwrap())
            .unwrap();
        let (keys, values) = cache.read_keys_values(gpu()).unwrap();
        assert_eq!(keys.data(), values.data(), "the values are the keys");
        let kv = sequence_major(&keys);
        let want = step_reference(config, &weights, &rows, [b, n, pos + n], &kv, &kv);
        let tol = relative_tolerance(1e-5, &want);
        assert_within(
            &format!("latent q8_0: step of {n} at {pos}"),
            got.data(),
            &want,
            tol,
        );
        pos += n;
    }
}

/// `[B, H, L, d]` (Bhld) data as the reference core's `[B, L, H·d]`.
fn bhld_to_sequence_major(x: &[f32], [b, h, l, d]: [usize; 4]) -> Vec<f64> {
    sequence_major(&Tensor::new([b, h, l, d], x.to_vec()).unwrap())
}

/// `scaled_dot_product_attention` on device tensors with q8_0 / q4_0 keys and values (f32
/// queries), on the decode route (one query row) and the flash route (many), GQA: equal to the
/// f64 core over the dequantized blocks. The multi-pass core is refused by name.
#[test]
fn sdpa_reads_quantized_keys_and_values() {
    use wgpu::util::DeviceExt;
    use wgpu_mha::kv_dtype::{dequantize, quantize};
    use wgpu_mha::{scaled_dot_product_attention, DeviceTensor, Elem, GpuTensor, Layout};
    let (b, h, kvh, lk, d) = (2, 4, 2, 70, 64);
    let upload = |words: &[u32]| {
        gpu()
            .device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("quantized test tensor"),
                contents: bytemuck::cast_slice(words),
                usage: wgpu::BufferUsages::STORAGE,
            })
    };
    for (dtype, elem) in [(KvDtype::Q8_0, Elem::Q8_0), (KvDtype::Q4_0, Elem::Q4_0)] {
        let kv_len = b * kvh * lk * d;
        let k = Tensor::random([kv_len], 11).into_data();
        let v = Tensor::random([kv_len], 12).into_data();
        let (kw, vw) = (quantize(dtype, &k).unwrap(), quantize(dtype, &v).unwrap());
        let (kb, vb) = (upload(&kw), upload(&vw));
        let scales = dtype.scales_word(kv_len);
        let kt = DeviceTensor::new(&kb, [b, kvh, lk, d], Layout::Bhld).quantized(elem, scales);
        let vt = DeviceTensor::new(&vb, [b, kvh, lk, d], Layout::Bhld).quantized(elem, scales);
        let (k_deq, v_deq) = (
            dequantize(dtype, &kw, kv_len).unwrap(),
            dequantize(dtype, &vw, kv_len).unwrap(),
        );
        for lq in [1, 20] {
            let q = Tensor::random([b, h, lq, d], 13);
            let qt = GpuTensor::upload(gpu(), &q).unwrap();
            let out = GpuTensor::zeros(gpu(), &[b, h, lq, d]).unwrap();
            let options = SdpaOptions {
                mask: Mask::Causal,
                ..Default::default()
            };
            scaled_dot_product_attention(
                gpu(),
                &DeviceTensor::new(qt.buffer(), [b, h, lq, d], Layout::Bhld),
                &kt,
                &vt,
                &DeviceTensor::new(out.buffer(), [b, h, lq, d], Layout::Bhld),
                &options,
            )
            .unwrap_or_else(|e| panic!("{dtype} lq {lq}: {e}"));
            let got = out.read(gpu()).unwrap().into_data();
            let (want, _) = sdpa_core([b, h, kvh, lq, lk, d, d], &options).run(
                &bhld_to_sequence_major(q.data(), [b, h, lq, d]),
                &bhld_to_sequence_major(&k_deq, [b, kvh, lk, d]),
                &bhld_to_sequence_major(&v_deq, [b, kvh, lk, d]),
            );
            // The device's [B, H, Lq, d] in the reference's [B, Lq, H·d].
            let got = bhld_to_sequence_major(&got, [b, h, lq, d]);
            let got: Vec<f32> = got.iter().map(|&x| x as f32).collect();
            assert_within(
                &format!("sdpa {dtype} lq {lq}"),
                &got,
                &want,
                relative_tolerance(1e-5, &want),
            );
        }
        // Probabilities need the multi-pass core, which reads no blocks.
        let q = GpuTensor::zeros(gpu(), &[b, h, 1, d]).unwrap();
        let out = GpuTensor::zeros(gpu(), &[b, h, 1, d]).unwrap();
        let e = scaled_dot_product_attention(
            gpu(),
            &DeviceTensor::new(q.buffer(), [b, h, 1, d], Layout::Bhld),
            &kt,
            &vt,
            &DeviceTensor::new(out.buffer(), [b, h, 1, d], Layout::Bhld),
            &SdpaOptions {
                return_probs: true,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("multi-pass"), "{e}");
    }
}
