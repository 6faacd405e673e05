//! A mask larger than one storage binding runs: each chunk of queries uploads only the window
//! of the mask it reads, so an `[L, L]` f32 bias past the binding limit gives the reference's
//! answer on both paths instead of a wgpu validation error.

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
