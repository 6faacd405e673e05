//! The module on the caller's buffers (issue 35): `record_forward` / `forward_device` over
//! `DeviceTensor` views — offsets into an arena, both layouts, slabs with spare rows, GQA with
//! RoPE, self-attention and a module without W_o — checked against the f64 reference and
//! against the host forward; every refused argument named, with the caller's encoder left
//! as it was.

mod common;

use common::{assert_close, gpu, gqa_rope, module};
use wgpu::util::DeviceExt;
use wgpu_mha::model::rope::Rope;
use wgpu_mha::{reference, AttentionConfig, DeviceTensor, ForwardOptions, Layout, Mask, Tensor};

const ALL: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// A buffer of `values` with `usage`.
fn buffer(values: &[f32], usage: wgpu::BufferUsages) -> wgpu::Buffer {
    gpu()
        .device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("test arena"),
            contents: bytemuck::cast_slice(values),
            usage,
        })
}

/// Elements `from..from + len` of `buffer` (which has COPY_SRC), read back.
fn read(buffer: &wgpu::Buffer, from: usize, len: usize) -> Vec<f32> {
    let device = gpu().device();
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test readback"),
        size: 4 * len as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, 4 * from as u64, &staging, 0, 4 * len as u64);
    gpu().queue().submit([encoder.finish()]);
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let values =
        bytemuck::cast_slice(&staging.slice(..).get_mapped_range().expect("mapped")).to_vec();
    staging.unmap();
    values
}

/// Rows `[B, L, W]` of `t` laid out with `capacity` rows per sequence from element `offset`
/// of an arena of `len` elements filled with `fill`.
fn place(arena: &mut [f32], t: &Tensor, offset: usize, capacity: usize) {
    let (b, l, w) = (t.shape()[0], t.shape()[1], t.shape()[2]);
    for bi in 0..b {
        let dst = offset + bi * capacity * w;
        arena[dst..dst + l * w].copy_from_slice(&t.data()[bi * l * w..(bi + 1) * l * w]);
    }
}

/// The rows of a `[B, L, W]` slab with `capacity` rows per sequence at `offset`.
fn gather(values: &[f32], shape: [usize; 3], offset: usize, capacity: usize) -> Vec<f32> {
    let [b, l, w] = shape;
    (0..b)
        .flat_map(|bi| {
            let at = offset + bi * capacity * w;
            values[at..at + l * w].to_vec()
        })
        .collect()
}

const SENTINEL: f32 = 7.25;

/// One problem on views: query, key and value at offsets of one arena (key in Blhd as heads,
/// value in a slab of spare rows), out in a slab of another buffer; checked against the f64
/// reference and the host forward, and every element around out's rows left alone.
fn check_views(label: &str, config: AttentionConfig, b: usize, lq: usize, lk: usize, mask: Mask) {
    let (weights, mha) = module(config, 11);
    let c = *mha.config();
    let q = Tensor::random([b, lq, c.model_dim], 1);
    let k = Tensor::random([b, lk, c.key_dim], 2);
    let v = Tensor::random([b, lk, c.value_dim], 3);
    // Offsets not multiples of 4 (the scalar GEMM), value in a slab of lk + 3 rows (copied).
    let (q_at, k_at) = (5, 5 + b * lq * c.model_dim + 3);
    let v_at = k_at + b * lk * c.key_dim + 1;
    let v_cap = lk + 3;
    let mut arena = vec![SENTINEL; v_at + b * v_cap * c.value_dim + 7];
    place(&mut arena, &q, q_at, lq);
    place(&mut arena, &k, k_at, lk);
    place(&mut arena, &v, v_at, v_cap);
    let arena = buffer(&arena, ALL);
    let o = c.output_dim();
    let (out_at, out_cap) = (9, lq + 2);
    let out_len = out_at + b * out_cap * o + 5;
    let out_buf = buffer(&vec![SENTINEL; out_len], ALL);

    let heads = 2; // key as [B, L, 2, key_dim / 2] in Blhd: the same rows.
    let query = DeviceTensor::new(&arena, [b, 1, lq, c.model_dim], Layout::Bhld).at_offset(q_at);
    let key =
        DeviceTensor::new(&arena, [b, heads, lk, c.key_dim / heads], Layout::Blhd).at_offset(k_at);
    let value = DeviceTensor::new(&arena, [b, 1, lk, c.value_dim], Layout::Blhd)
        .at_offset(v_at)
        .with_capacity(v_cap);
    let out = DeviceTensor::new(&out_buf, [b, 1, lq, o], Layout::Bhld)
        .at_offset(out_at)
        .with_capacity(out_cap);
    let options = ForwardOptions::default();
    mha.forward_device(&query, &key, &value, &out, &mask, &options)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let all = read(&out_buf, 0, out_len);
    let got = gather(&all, [b, lq, o], out_at, out_cap);
    let want = reference::forward(&c, &weights, &q, &k, &v, &mask).expect("reference");
    assert_close(label, &got, &want.output);
    let host = mha.forward(&q, &k, &v, &mask).expect("host forward");
    let err = common::max_err_f64(
        &got.iter().map(|&x| x as f64).collect::<Vec<_>>(),
        &host.data().iter().map(|&x| x as f64).collect::<Vec<_>>(),
    );
    assert!(err <= 1e-6, "{label}: views vs host forward {err:.3e}");
    // Nothing outside out's rows was written.
    let mut touched = vec![false; out_len];
    for bi in 0..b {
        let at = out_at + bi * out_cap * o;
        touched[at..at + lq * o].iter_mut().for_each(|t| *t = true);
    }
    let stray = all
        .iter()
        .zip(&touched)
        .filter(|(x, t)| !**t && **x != SENTINEL)
        .count();
    assert_eq!(
        stray, 0,
        "{label}: {stray} elements outside out's rows changed"
    );
}

#[test]
fn views_at_offsets_in_both_layouts_match_the_reference_and_the_host_forward() {
    check_views(
        "classic",
        AttentionConfig::classic(16, 2).unwrap(),
        2,
        3,
        5,
        Mask::None,
    );
    check_views("gqa + rope, causal", gqa_rope(), 2, 4, 4, Mask::Causal);
    // No W_o: the attention core writes the caller's slab itself.
    check_views(
        "per-head, decode rows",
        AttentionConfig::per_head(12, 4, 6, 2).unwrap(),
        2,
        1,
        6,
        Mask::None,
    );
}

#[test]
fn self_attention_on_one_view_is_recorded_into_the_callers_encoder() {
    let (weights, mha) = module(gqa_rope(), 5);
    let c = *mha.config();
    let (b, l) = (2, 4);
    let x = Tensor::random([b, l, c.model_dim], 6);
    // The caller's own pass (a copy) puts x into the arena inside the same encoder.
    let staged = buffer(x.data(), ALL);
    let at = 12;
    let arena = buffer(&vec![0.0; at + b * l * c.model_dim], ALL);
    let out_buf = buffer(&vec![SENTINEL; b * l * c.model_dim], ALL);
    let view = DeviceTensor::new(&arena, [b, 1, l, c.model_dim], Layout::Bhld).at_offset(at);
    let out = DeviceTensor::new(&out_buf, [b, 4, l, 4], Layout::Blhd);
    let mut encoder = gpu().device().create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(&staged, 0, &arena, 4 * at as u64, 4 * x.data().len() as u64);
    let result = mha
        .record_forward(
            &mut encoder,
            &view,
            &view,
            &view,
            &out,
            &Mask::Causal,
            &ForwardOptions::default(),
        )
        .expect("record_forward");
    assert!(result.probs.is_none());
    gpu().queue().submit([encoder.finish()]);
    let got = read(&out_buf, 0, b * l * c.model_dim);
    let want = reference::forward(&c, &weights, &x, &x, &x, &Mask::Causal).expect("reference");
    assert_close("self-attention view", &got, &want.output);
}

#[test]
fn probabilities_come_back_beside_the_callers_output() {
    let config = AttentionConfig::classic(8, 2).unwrap();
    let (weights, mha) = module(config, 9);
    let x = Tensor::random([1, 3, 8], 10);
    let arena = buffer(x.data(), ALL);
    let out_buf = buffer(&[0.0; 24], ALL);
    let view = DeviceTensor::new(&arena, [1, 1, 3, 8], Layout::Bhld);
    let out = DeviceTensor::new(&out_buf, [1, 1, 3, 8], Layout::Bhld);
    let options = ForwardOptions {
        return_probs: true,
        ..Default::default()
    };
    let result = mha
        .forward_device(&view, &view, &view, &out, &Mask::None, &options)
        .expect("forward_device");
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::None).unwrap();
    assert_close("output", &read(&out_buf, 0, 24), &want.output);
    let probs = result.probs.expect("probabilities").read(gpu()).unwrap();
    common::assert_within("probabilities", probs.data(), &want.probs, 1e-5);
}

/// Every refusal names its argument, comes before anything is recorded, and leaves the
/// caller's encoder working: its own copy, recorded before them, runs.
#[test]
fn every_bad_argument_is_named_and_the_encoder_still_runs() {
    let (_, mha) = module(AttentionConfig::classic(8, 2).unwrap(), 3);
    let (b, l, e) = (2, 3, 8);
    let n = b * l * e;
    let arena = buffer(&vec![0.5; 4 * n], ALL);
    let storage_only = buffer(&vec![0.5; 2 * n], wgpu::BufferUsages::STORAGE);
    let no_storage = buffer(&vec![0.5; n], wgpu::BufferUsages::COPY_SRC);
    let out_buf = buffer(&vec![0.0; 2 * n], ALL);
    let x = DeviceTensor::new(&arena, [b, 1, l, e], Layout::Bhld);
    let out = DeviceTensor::new(&out_buf, [b, 1, l, e], Layout::Bhld);
    let mask = Mask::None;
    let options = ForwardOptions::default();
    let slab = DeviceTensor::new(&storage_only, [b, 1, l, e], Layout::Bhld).with_capacity(l + 1);
    let overlapping = DeviceTensor::new(&arena, [b, 1, l, e], Layout::Bhld).at_offset(n + 8);
    // A slab input (copied, not bound) in a destroyed buffer: wgpu would reject the copy only
    // when the caller's encoder is submitted.
    let destroyed = buffer(&vec![0.5; 2 * n], ALL);
    destroyed.destroy();
    let destroyed_slab =
        DeviceTensor::new(&destroyed, [b, 1, l, e], Layout::Bhld).with_capacity(l + 1);
    // (case, [query, key, value, out], the argument named, what the message says)
    let cases: Vec<(&str, [DeviceTensor; 4], &str, &str)> = vec![
        ("f16 query", [x.f16(), x, x, out], "query", "f32"),
        (
            "head-split query",
            [
                DeviceTensor::new(&arena, [b, 2, l, 4], Layout::Bhld),
                x,
                x,
                out,
            ],
            "query",
            "head-split",
        ),
        (
            "key of the wrong width",
            [
                x,
                DeviceTensor::new(&arena, [b, 1, l, 4], Layout::Bhld),
                x,
                out,
            ],
            "key",
            "[batch, Lk, 8]",
        ),
        (
            "value without STORAGE",
            [
                x,
                x,
                DeviceTensor::new(&no_storage, [b, 1, l, e], Layout::Bhld),
                out,
            ],
            "value",
            "STORAGE",
        ),
        (
            "query past its buffer",
            [x.at_offset(3 * n + 1), x, x, out],
            "query",
            "past",
        ),
        (
            "out of the wrong length",
            [
                x,
                x,
                x,
                DeviceTensor::new(&out_buf, [b, 1, l + 1, e], Layout::Bhld),
            ],
            "out",
            "[2, 3, 8]",
        ),
        (
            "out over the value",
            [x, x, x.at_offset(n), overlapping],
            "value",
            "overlaps",
        ),
        (
            "a slab input without COPY_SRC",
            [x, x, slab, out],
            "value",
            "COPY_SRC",
        ),
        (
            "a destroyed slab input",
            [x, destroyed_slab, destroyed_slab, out],
            "key",
            "destroyed",
        ),
    ];
    let device = gpu().device();
    let mine = buffer(&[1.0, 2.0, 3.0, 4.0], ALL);
    let copy = buffer(&[0.0; 4], ALL);
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(&mine, 0, &copy, 0, 16);
    for (label, [q, k, v, o], name, what) in &cases {
        let err = mha
            .record_forward(&mut encoder, q, k, v, o, &mask, &options)
            .expect_err(label)
            .to_string();
        assert!(
            err.contains(name) && err.contains(what),
            "{label}: the error should name {name} and say {what}: {err}"
        );
    }
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    gpu().queue().submit([encoder.finish()]);
    let error = pollster::block_on(scope.pop());
    assert!(error.is_none(), "the caller's encoder failed: {error:?}");
    assert_eq!(
        read(&copy, 0, 4),
        [1.0, 2.0, 3.0, 4.0],
        "the caller's copy ran"
    );
}

/// `x`'s projections through `layer` (f64), each head row rotated by its position `0..L`
/// when `rope` is given: `[B, L, heads·d]`.
fn projected(x: &Tensor, layer: &wgpu_mha::Linear, rope: Option<&Rope>, d: usize) -> Vec<f64> {
    let (b, l) = (x.shape()[0], x.shape()[1]);
    let wide: Vec<f64> = x.data().iter().map(|&v| v as f64).collect();
    let mut y = reference::linear(&wide, b * l, layer);
    if let Some(rope) = rope {
        let width = y.len() / (b * l);
        for (row, r) in y.chunks_mut(width).enumerate() {
            for head in r.chunks_mut(d) {
                rope.rotate(head, row % l, l);
            }
        }
    }
    y
}

/// Rows `range` of every sequence of a `[B, L, W]` f64 tensor.
fn rows(x: &[f64], b: usize, l: usize, range: std::ops::Range<usize>) -> Vec<f64> {
    let w = x.len() / (b * l);
    (0..b)
        .flat_map(|bi| x[(bi * l + range.start) * w..(bi * l + range.end) * w].to_vec())
        .collect()
}

/// sdpa of the last `n` queries of `q` (f64 `[B, L, H·dk]`) over each of the cache's key and
/// value views against the f64 core over the same tokens (no mask: each view alone).
fn check_cache_views(
    label: &str,
    mha: &wgpu_mha::MultiHeadAttention,
    cache: &wgpu_mha::KvCache,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    n: usize,
) {
    let c = *mha.config();
    let (b, l) = (cache.batch(), cache.len());
    let (h, dk, dv) = (c.heads, c.qk_head_dim, c.v_head_dim);
    let q_new = rows(q, b, l, l - n..l);
    let q_f32: Vec<f32> = q_new.iter().map(|&x| x as f32).collect();
    let q_buf = buffer(&q_f32, ALL);
    let q_view = DeviceTensor::new(&q_buf, [b, h, n, dk], Layout::Blhd);
    let (keys, values) = (cache.keys(), cache.values());
    assert_eq!(
        keys.len(),
        values.len(),
        "{label}: one value view per key view"
    );
    assert_eq!(
        keys.last().map(|v| v.tokens.end),
        Some(l),
        "{label}: views cover the cache"
    );
    for (kv, vv) in keys.iter().zip(&values) {
        assert_eq!(kv.tokens, vv.tokens, "{label}");
        let out_buf = buffer(&vec![0.0; b * n * h * dv], ALL);
        let out = DeviceTensor::new(&out_buf, [b, h, n, dv], Layout::Blhd);
        wgpu_mha::scaled_dot_product_attention(
            gpu(),
            &q_view,
            &kv.tensor,
            &vv.tensor,
            &out,
            &Default::default(),
        )
        .unwrap_or_else(|e| panic!("{label}: sdpa over the cache: {e}"));
        let lk = kv.tokens.len();
        let want = reference::Core {
            batch: b,
            heads: h,
            kv_heads: c.kv_heads,
            lq: n,
            lk,
            dk,
            dv,
            scale: c.scale() as f64,
            softcap: None,
            alibi_max_bias: None,
            temperature: None,
            sinks: None,
            mask: &Mask::None,
            top_left: false,
        }
        .run(
            &q_new,
            &rows(k, b, l, kv.tokens.clone()),
            &rows(v, b, l, kv.tokens.clone()),
        )
        .0;
        assert_close(
            &format!("{label}: tokens {:?}", kv.tokens),
            &read(&out_buf, 0, b * n * h * dv),
            &want,
        );
    }
}

#[test]
fn a_caches_keys_and_values_feed_sdpa() {
    let config = gqa_rope();
    let (weights, mha) = module(config, 21);
    let rope = config.rope.as_ref();
    let (b, dk) = (2, config.qk_head_dim);
    let x = Tensor::random([b, 5, 16], 22);
    let (x0, x1) = (
        Tensor::new([b, 3, 16], rows_f32(&x, 0..3)).unwrap(),
        Tensor::new([b, 2, 16], rows_f32(&x, 3..5)).unwrap(),
    );
    let mut cache = wgpu_mha::KvCache::new(&mha, b, 8).unwrap();
    assert!(cache.keys().is_empty(), "an empty cache has no views");
    mha.forward_step(&mut cache, &x0).unwrap();
    let step = mha.forward_step(&mut cache, &x1).unwrap();
    let q = projected(&x, &weights.q, rope, dk);
    let k = projected(&x, &weights.k, rope, dk);
    let v = projected(&x, &weights.v, None, dk);
    check_cache_views("one buffer", &mha, &cache, &q, &k, &v, 2);
    // The engine's own decode over the views, W_o on the host: the module's step output.
    let (h, n) = (config.heads, 2);
    let q_f32: Vec<f32> = rows(&q, b, 5, 3..5).iter().map(|&x| x as f32).collect();
    let q_buf = buffer(&q_f32, ALL);
    let out_buf = buffer(&vec![0.0; b * n * h * dk], ALL);
    let options = wgpu_mha::SdpaOptions {
        mask: Mask::Causal,
        ..Default::default()
    };
    wgpu_mha::scaled_dot_product_attention(
        gpu(),
        &DeviceTensor::new(&q_buf, [b, h, n, dk], Layout::Blhd),
        &cache.keys()[0].tensor,
        &cache.values()[0].tensor,
        &DeviceTensor::new(&out_buf, [b, h, n, dk], Layout::Blhd),
        &options,
    )
    .unwrap();
    let combined: Vec<f64> = read(&out_buf, 0, b * n * h * dk)
        .iter()
        .map(|&x| x as f64)
        .collect();
    let engine = reference::linear(&combined, b * n, weights.o.as_ref().unwrap());
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    assert_close(
        "engine decode vs f64",
        step.data(),
        &rows(&want.output, b, 5, 3..5),
    );
    let engine_f32: Vec<f32> = engine.iter().map(|&x| x as f32).collect();
    assert_close(
        "engine decode vs the module's step",
        &engine_f32,
        &step.data().iter().map(|&x| x as f64).collect::<Vec<_>>(),
    );

    // A chunked cache: one view per chunk holding tokens.
    let unit = wgpu_mha::KvCache::chunk_unit(&mha);
    let long = Tensor::random([1, unit + 2, 16], 23);
    let mut chunked = wgpu_mha::KvCache::chunked(&mha, 1, 2 * unit, unit).unwrap();
    mha.forward_step(&mut chunked, &long).unwrap();
    assert_eq!(chunked.keys().len(), 2, "two chunks hold tokens");
    let q = projected(&long, &weights.q, rope, dk);
    let k = projected(&long, &weights.k, rope, dk);
    let v = projected(&long, &weights.v, None, dk);
    check_cache_views("chunked", &mha, &chunked, &q, &k, &v, 1);
}

/// Rows `range` of every sequence of a `[B, L, W]` tensor.
fn rows_f32(x: &Tensor, range: std::ops::Range<usize>) -> Vec<f32> {
    let (b, l) = (x.shape()[0], x.shape()[1]);
    let wide: Vec<f64> = x.data().iter().map(|&v| v as f64).collect();
    rows(&wide, b, l, range).iter().map(|&v| v as f32).collect()
}

/// The sequence rule: a step recorded into an encoder that is dropped makes the next step
/// an `Err` naming the rule, until `truncate` rolls the cache back; so do two steps whose
/// encoders are submitted in the wrong order.
#[test]
fn steps_dropped_or_submitted_out_of_order_are_refused_until_rolled_back() {
    let config = gqa_rope();
    let (weights, mha) = module(config, 31);
    let b = 1;
    let x = Tensor::random([b, 4, 16], 32);
    let x0 = Tensor::new([b, 2, 16], rows_f32(&x, 0..2)).unwrap();
    let x1 = Tensor::new([b, 1, 16], rows_f32(&x, 2..3)).unwrap();
    let x2 = Tensor::new([b, 1, 16], rows_f32(&x, 3..4)).unwrap();
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let gpu_x1 = wgpu_mha::GpuTensor::upload(gpu(), &x1).unwrap();
    let gpu_x2 = wgpu_mha::GpuTensor::upload(gpu(), &x2).unwrap();
    let options = wgpu_mha::StepOptions::default();
    let encoder = || gpu().device().create_command_encoder(&Default::default());
    // A cache holding x0's two tokens.
    let prefilled = || {
        let mut cache = wgpu_mha::KvCache::new(&mha, b, 8).unwrap();
        mha.forward_step(&mut cache, &x0).unwrap();
        cache
    };
    // x1's and x2's steps recorded into encoders of their own: (first, second, x2's output).
    let record_pair = |cache: &mut wgpu_mha::KvCache| {
        let (mut first, mut second) = (encoder(), encoder());
        mha.forward_step_gpu_into(&mut first, cache, &gpu_x1, &options)
            .unwrap();
        let out = mha
            .forward_step_gpu_into(&mut second, cache, &gpu_x2, &options)
            .unwrap();
        (first, second, out)
    };
    let wait = || {
        gpu()
            .device()
            .poll(wgpu::PollType::wait_indefinitely())
            .unwrap()
    };
    // Back to x0's tokens, then x1 and x2 stepped again: x2's row as the reference's.
    let roll_back_and_check = |cache: &mut wgpu_mha::KvCache| {
        cache.truncate(2).unwrap();
        mha.forward_step(cache, &x1).unwrap();
        let last = mha.forward_step(cache, &x2).expect("rolled back");
        assert_close(
            "after the rollback",
            last.data(),
            &rows(&want.output, b, 4, 3..4),
        );
    };

    // Dropped.
    let mut cache = prefilled();
    let mut dropped = encoder();
    mha.forward_step_gpu_into(&mut dropped, &mut cache, &gpu_x1, &options)
        .unwrap();
    drop(dropped);
    let err = mha
        .forward_step(&mut cache, &x2)
        .expect_err("a step after a dropped one")
        .to_string();
    assert!(
        err.contains("sequence rule") && err.contains("dropped") && err.contains("truncate(2)"),
        "{err}"
    );
    let mut later = encoder();
    let err = mha
        .forward_step_gpu_into(&mut later, &mut cache, &gpu_x2, &options)
        .expect_err("recorded too")
        .to_string();
    assert!(err.contains("sequence rule"), "{err}");
    roll_back_and_check(&mut cache);

    // Out of order: the later step's encoder submitted first.
    let mut cache = prefilled();
    let (first, second, _) = record_pair(&mut cache);
    gpu().queue().submit([second.finish()]);
    gpu().queue().submit([first.finish()]);
    wait();
    let err = mha
        .forward_step(&mut cache, &x2)
        .expect_err("after a reordered pair")
        .to_string();
    assert!(
        err.contains("sequence rule")
            && err.contains("ran on the GPU before")
            && err.contains("truncate(2)"),
        "{err}"
    );
    roll_back_and_check(&mut cache);

    // Out of order in one submission: the same.
    cache.truncate(2).unwrap();
    let (first, second, _) = record_pair(&mut cache);
    gpu().queue().submit([second.finish(), first.finish()]);
    wait();
    let err = mha
        .forward_step(&mut cache, &x2)
        .expect_err("reordered in one submit")
        .to_string();
    assert!(err.contains("ran on the GPU before"), "{err}");

    // In order, in one encoder or two: no fault.
    let mut cache = prefilled();
    let (first, second, out) = record_pair(&mut cache);
    gpu().queue().submit([first.finish(), second.finish()]);
    assert_close(
        "in order",
        out.read(gpu()).unwrap().data(),
        &rows(&want.output, b, 4, 3..4),
    );
    assert_eq!(cache.len(), 4);
    cache.truncate(3).unwrap();
    mha.forward_step(&mut cache, &x2)
        .expect("in-order steps leave no fault");
}
