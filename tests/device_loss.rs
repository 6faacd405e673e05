//! A lost device becomes `Err(DeviceLost)` (never a panic), and a new context and module work.

use wgpu_mha::{AttentionConfig, AttentionWeights, Error, Gpu, Mask, MultiHeadAttention, Tensor};

#[test]
fn lost_device_is_an_error_and_a_new_context_recovers() {
    let config = AttentionConfig::classic(16, 2).unwrap();
    let weights = AttentionWeights::random(&config, 1);
    let x = Tensor::random([1, 4, 16], 2);

    let gpu = Gpu::new().expect("GPU tests need an adapter");
    let mha = MultiHeadAttention::new(&gpu, config, &weights).unwrap();
    mha.forward(&x, &x, &x, &Mask::None)
        .expect("works before the loss");
    gpu.device().destroy(); // what a driver reset or unplugged GPU looks like to wgpu
    let _ = gpu.device().poll(wgpu::PollType::wait_indefinitely());
    let err = mha
        .forward(&x, &x, &x, &Mask::None)
        .expect_err("the device is gone");
    assert!(matches!(err, Error::DeviceLost(_)), "{err}");
    let err = MultiHeadAttention::new(&gpu, config, &weights)
        .err()
        .expect("cannot build on a lost device");
    assert!(matches!(err, Error::DeviceLost(_)), "{err}");

    // Rebuild: a fresh context and module give the right answer again.
    let gpu = Gpu::new().unwrap();
    let mha = MultiHeadAttention::new(&gpu, config, &weights).unwrap();
    let got = mha.forward(&x, &x, &x, &Mask::None).unwrap();
    let want = wgpu_mha::reference::forward(&config, &weights, &x, &x, &x, &Mask::None).unwrap();
    let err = got.max_abs_diff(&want.output_f32());
    assert!(err < 1e-5, "error {err}");
}
