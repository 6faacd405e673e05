//! Seed 000's module (`MultiHeadAttention(d_model, num_heads)`) as self-attention with a causal
//! mask, on the GPU, checked against the CPU reference.
//!
//! ```text
//! cargo run --release --example classic_self_attention
//! ```
//! Exits with status 1 if the GPU and the f64 CPU reference disagree.

use std::process::ExitCode;

use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Gpu, Mask, MultiHeadAttention, Tensor,
};

fn main() -> Result<ExitCode, wgpu_mha::Error> {
    // 1. A GPU: the best adapter found (WGPU_BACKEND=vulkan|metal|dx12|gl picks a backend).
    let gpu = Gpu::new()?;
    println!("adapter: {}", gpu.describe());

    // 2. The module: d_model 64, 4 heads (d_k = 16), seeded random weights. To use trained
    //    weights, build an `AttentionWeights` from your tensors instead.
    let config = AttentionConfig::classic(64, 4)?;
    let weights = AttentionWeights::random(&config, 0);
    let mha = MultiHeadAttention::new(&gpu, config, &weights)?;

    // 3. Input: batch 2, 10 tokens of width 64. Self-attention passes the same tensor as
    //    Q, K and V (one fused QKV projection runs).
    let x = Tensor::random([2, 10, 64], 1);
    let y = mha.forward(&x, &x, &x, &Mask::Causal)?;
    println!("input {:?} -> output {:?}", x.shape(), y.shape());
    println!("output[0, 0, ..4] = {:?}", &y.data()[..4]);

    // 4. The same math on the CPU in f64.
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal)?;
    let err = y.max_abs_diff(&want.output_f32());
    let bound = 1e-5 * (1.0 + want.max_abs() as f32);
    if err <= bound {
        println!("max |GPU - CPU reference| = {err:.2e} (bound {bound:.1e}): AGREE");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("max |GPU - CPU reference| = {err:.2e} (bound {bound:.1e}): DISAGREE");
        Ok(ExitCode::FAILURE)
    }
}
