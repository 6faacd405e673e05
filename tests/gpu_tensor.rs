//! GPU-resident tensors: upload/read round trips, and forwards chained on the device equal the
//! host path and the f64 reference.

mod common;

use common::{gpu, max_err, tolerance};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, Error, ForwardOptions, GpuTensor,
    Mask, MultiHeadAttention, Tensor,
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

/// Two classic layers of self-attention, `y = L2(L1(x))`, with the hidden state never leaving
/// the GPU.
#[test]
fn chained_classic_layers_match_host_and_reference() {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let (w1, w2) = (
        AttentionWeights::random(&config, 1),
        AttentionWeights::random(&config, 2),
    );
    let l1 = MultiHeadAttention::new(gpu(), config, &w1).unwrap();
    let l2 = MultiHeadAttention::new(gpu(), config, &w2).unwrap();
    let x = Tensor::random([2, 6, 32], 3);

    let xg = GpuTensor::upload(gpu(), &x).unwrap();
    let hg = l1.forward_gpu(&xg, &xg, &xg, &Mask::Causal).unwrap();
    let yg = l2.forward_gpu(&hg, &hg, &hg, &Mask::Causal).unwrap();
    assert_eq!(yg.shape(), &[2, 6, 32]);
    let y_gpu = yg.read(gpu()).unwrap();

    let h = l1.forward(&x, &x, &x, &Mask::Causal).unwrap();
    let y_host = l2.forward(&h, &h, &h, &Mask::Causal).unwrap();
    assert!(
        y_gpu.max_abs_diff(y_host.data()) <= 1e-6,
        "device chain differs from host chain"
    );

    let h_ref = reference::forward(&config, &w1, &x, &x, &x, &Mask::Causal).unwrap();
    let h_ref = Tensor::new([2, 6, 32], h_ref.output_f32()).unwrap();
    let y_ref = reference::forward(&config, &w2, &h_ref, &h_ref, &h_ref, &Mask::Causal).unwrap();
    let err = max_err(y_gpu.data(), &y_ref.output);
    assert!(
        err <= 2.0 * tolerance(&y_ref.output),
        "chain vs reference: {err:.3e}"
    );
}

/// Seed 001's module twice, cross-attention to a fixed memory, on both attention paths.
#[test]
fn chained_per_head_cross_layers_match_host_and_reference() {
    // head · v_size = emb_size, so the output feeds the next layer's x_q.
    let config = AttentionConfig::per_head(24, 8, 6, 4).unwrap();
    let (w1, w2) = (
        AttentionWeights::random(&config, 4),
        AttentionWeights::random(&config, 5),
    );
    let l1 = MultiHeadAttention::new(gpu(), config, &w1).unwrap();
    let l2 = MultiHeadAttention::new(gpu(), config, &w2).unwrap();
    let x_q = Tensor::random([2, 5, 24], 6);
    let memory = Tensor::random([2, 7, 24], 7);
    let lengths = Mask::KeyPadding(vec![7, 4]);

    let h_ref = reference::forward(&config, &w1, &x_q, &memory, &memory, &lengths).unwrap();
    let h_ref = Tensor::new([2, 5, 24], h_ref.output_f32()).unwrap();
    let y_ref = reference::forward(&config, &w2, &h_ref, &memory, &memory, &lengths).unwrap();

    for path in [AttentionPath::MultiPass, AttentionPath::Fused] {
        let options = ForwardOptions {
            path,
            ..Default::default()
        };
        let (qg, mg) = (
            GpuTensor::upload(gpu(), &x_q).unwrap(),
            GpuTensor::upload(gpu(), &memory).unwrap(),
        );
        let hg = l1
            .forward_gpu_with(&qg, &mg, &mg, &lengths, &options)
            .unwrap();
        assert_eq!(hg.path, path);
        let yg = l2
            .forward_gpu_with(&hg.output, &mg, &mg, &lengths, &options)
            .unwrap();
        let y_gpu = yg.output.read(gpu()).unwrap();

        let h = l1
            .forward_with(&x_q, &memory, &memory, &lengths, &options)
            .unwrap()
            .output;
        let y_host = l2
            .forward_with(&h, &memory, &memory, &lengths, &options)
            .unwrap()
            .output;
        assert!(
            y_gpu.max_abs_diff(y_host.data()) <= 1e-6,
            "{path:?}: device chain differs from host chain"
        );
        let err = max_err(y_gpu.data(), &y_ref.output);
        assert!(
            err <= 2.0 * tolerance(&y_ref.output),
            "{path:?}: chain vs reference {err:.3e}"
        );
    }
}

#[test]
fn forward_gpu_returns_probabilities_on_request() {
    let config = AttentionConfig::per_head(16, 8, 4, 2).unwrap();
    let weights = AttentionWeights::random(&config, 8);
    let mha = MultiHeadAttention::new(gpu(), config, &weights).unwrap();
    let x = Tensor::random([1, 5, 16], 9);
    let xg = GpuTensor::upload(gpu(), &x).unwrap();
    let options = ForwardOptions {
        return_probs: true,
        ..Default::default()
    };
    let out = mha
        .forward_gpu_with(&xg, &xg, &xg, &Mask::Causal, &options)
        .unwrap();
    let probs = out.probs.expect("probabilities").read(gpu()).unwrap();
    assert_eq!(probs.shape(), &[1, 2, 5, 5]);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    assert!(max_err(probs.data(), &want.probs) <= 1e-5);
    assert!(
        max_err(out.output.read(gpu()).unwrap().data(), &want.output) <= tolerance(&want.output)
    );
}

#[test]
fn forward_gpu_checks_shapes_first() {
    let config = AttentionConfig::classic(16, 2).unwrap();
    let mha =
        MultiHeadAttention::new(gpu(), config, &AttentionWeights::random(&config, 0)).unwrap();
    let good = GpuTensor::upload(gpu(), &Tensor::random([1, 3, 16], 1)).unwrap();
    let bad = GpuTensor::upload(gpu(), &Tensor::random([1, 3, 8], 1)).unwrap();
    assert!(matches!(
        mha.forward_gpu(&good, &bad, &good, &Mask::None),
        Err(Error::Shape { .. })
    ));
}
