//! GPU-resident tensors: upload/read round trips, and forwards chained on the device equal the
//! host path and the f64 reference.

mod common;

use common::{assert_close, assert_within, gpu, module, options, tolerance, BOTH_PATHS};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, Error, ForwardOptions, GpuTensor, Mask, Tensor,
};

#[test]
fn upload_then_read_round_trips() {
    let x = Tensor::random([2, 3, 5], 7);
    let t = GpuTensor::upload(gpu(), &x).unwrap();
    assert_eq!(t.shape(), &[2, 3, 5]);
    assert_eq!(t.read(gpu()).unwrap(), x);
    let again = pollster::block_on(t.read_async(gpu())).unwrap();
    assert_eq!(again, x);
    let empty = GpuTensor::upload(gpu(), &Tensor::zeros([0, 4])).unwrap();
    assert_eq!(
        pollster::block_on(empty.read_async(gpu())).unwrap().shape(),
        &[0, 4]
    );
}

#[test]
fn wrong_buffer_usage_is_an_error() {
    let buffer = gpu().device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 64,
        usage: wgpu::BufferUsages::UNIFORM,
        mapped_at_creation: false,
    });
    assert!(GpuTensor::from_buffer(&[4], buffer).is_err());
}

/// Two layers `y = L2(L1(x))` of `config` (seeded weights), the hidden state never leaving the
/// GPU: attending to itself (`memory` = `None`) or to a fixed `memory`. The device chain must
/// equal the host chain, and the f64 reference chain (fed the f32-rounded hidden state) within
/// twice the tolerance.
fn check_chain(
    config: AttentionConfig,
    seeds: [u64; 2],
    x: &Tensor,
    memory: Option<&Tensor>,
    mask: &Mask,
    options: &ForwardOptions,
) {
    let label = format!("{:?}", options.path);
    let (w1, l1) = module(config, seeds[0]);
    let (w2, l2) = module(config, seeds[1]);
    let kv = |h| memory.unwrap_or(h);

    let h_ref = reference::forward(&config, &w1, x, kv(x), kv(x), mask).unwrap();
    let h_ref = Tensor::new(x.shape().to_vec(), h_ref.output_f32()).unwrap();
    let y_ref = reference::forward(&config, &w2, &h_ref, kv(&h_ref), kv(&h_ref), mask).unwrap();

    let xg = GpuTensor::upload(gpu(), x).unwrap();
    let mg = memory.map(|m| GpuTensor::upload(gpu(), m).unwrap());
    let kvg = |h| mg.as_ref().unwrap_or(h);
    let hg = l1
        .forward_gpu_with(&xg, kvg(&xg), kvg(&xg), mask, options)
        .unwrap();
    let yg = l2
        .forward_gpu_with(&hg.output, kvg(&hg.output), kvg(&hg.output), mask, options)
        .unwrap();
    if options.path != AttentionPath::Auto {
        assert_eq!((hg.path, yg.path), (options.path, options.path), "{label}");
    }
    let y_gpu = yg.output.read(gpu()).unwrap();
    assert_eq!(y_gpu.shape(), y_ref.shape.as_slice(), "{label}");

    let h = l1
        .forward_with(x, kv(x), kv(x), mask, options)
        .unwrap()
        .output;
    let y_host = l2
        .forward_with(&h, kv(&h), kv(&h), mask, options)
        .unwrap()
        .output;
    assert!(
        y_gpu.max_abs_diff(y_host.data()) <= 1e-6,
        "{label}: device chain differs from host chain"
    );
    assert_within(
        &format!("{label}: chain vs reference"),
        y_gpu.data(),
        &y_ref.output,
        2.0 * tolerance(&y_ref.output),
    );
}

/// Two classic layers of self-attention.
#[test]
fn chained_classic_layers_match_host_and_reference() {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let x = Tensor::random([2, 6, 32], 3);
    check_chain(
        config,
        [1, 2],
        &x,
        None,
        &Mask::Causal,
        &ForwardOptions::default(),
    );
}

/// Seed 001's module twice, cross-attention to a fixed memory, on both attention paths.
#[test]
fn chained_per_head_cross_layers_match_host_and_reference() {
    // head · v_size = emb_size, so the output feeds the next layer's x_q.
    let config = AttentionConfig::per_head(24, 8, 6, 4).unwrap();
    let x_q = Tensor::random([2, 5, 24], 6);
    let memory = Tensor::random([2, 7, 24], 7);
    for path in BOTH_PATHS {
        let lengths = Mask::KeyPadding(vec![7, 4]);
        check_chain(
            config,
            [4, 5],
            &x_q,
            Some(&memory),
            &lengths,
            &options(path, false),
        );
    }
}

#[test]
fn forward_gpu_returns_probabilities_on_request() {
    let config = AttentionConfig::per_head(16, 8, 4, 2).unwrap();
    let (weights, mha) = module(config, 8);
    let x = Tensor::random([1, 5, 16], 9);
    let xg = GpuTensor::upload(gpu(), &x).unwrap();
    let out = mha
        .forward_gpu_with(
            &xg,
            &xg,
            &xg,
            &Mask::Causal,
            &options(AttentionPath::Auto, true),
        )
        .unwrap();
    let probs = out.probs.expect("probabilities").read(gpu()).unwrap();
    assert_eq!(probs.shape(), &[1, 2, 5, 5]);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    assert_within("probabilities", probs.data(), &want.probs, 1e-5);
    let output = out.output.read(gpu()).unwrap();
    assert_close("output", output.data(), &want.output);
}

#[test]
fn forward_gpu_checks_shapes_first() {
    let config = AttentionConfig::classic(16, 2).unwrap();
    let (_, mha) = module(config, 0);
    let good = GpuTensor::upload(gpu(), &Tensor::random([1, 3, 16], 1)).unwrap();
    let bad = GpuTensor::upload(gpu(), &Tensor::random([1, 3, 8], 1)).unwrap();
    assert!(matches!(
        mha.forward_gpu(&good, &bad, &good, &Mask::None),
        Err(Error::Shape { .. })
    ));
}
