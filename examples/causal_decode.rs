//! Incremental causal decoding with a KV cache: a prompt is prefilled in one step, then tokens
//! are fed one at a time. Keys and values of past tokens stay on the GPU; each step projects only
//! the new token and attends to everything cached. Every step is checked against one causal
//! forward of the whole sequence on the CPU reference.
//!
//! ```text
//! cargo run --release --example causal_decode
//! ```
//! Exits with status 1 if any step disagrees with the CPU reference.

use std::process::ExitCode;

use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Gpu, KvCache, Mask, MultiHeadAttention, Tensor,
};

/// Rows `start..start + n` of a `[1, L, W]` tensor.
fn tokens(x: &Tensor, start: usize, n: usize) -> wgpu_mha::Result<Tensor> {
    let w = x.shape()[2];
    Tensor::new([1, n, w], x.data()[start * w..(start + n) * w].to_vec())
}

fn main() -> Result<ExitCode, wgpu_mha::Error> {
    let gpu = Gpu::new()?;
    println!("adapter: {}", gpu.describe());
    let config = AttentionConfig::classic(64, 4)?;
    let weights = AttentionWeights::random(&config, 0);
    let mha = MultiHeadAttention::new(&gpu, config, &weights)?;

    // The whole sequence (10 token vectors of width 64), known here only to check the answers.
    let (prompt, total) = (4, 10);
    let x = Tensor::random([1, total, 64], 1);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal)?;
    let want_f32 = want.output_f32();
    let bound = 1e-5 * (1.0 + want.max_abs() as f32);

    // A cache for batch 1 and up to `total` tokens.
    let mut cache = KvCache::new(&mha, 1, total)?;
    let mut all_ok = true;
    let mut pos = 0;
    while pos < total {
        let n = if pos == 0 { prompt } else { 1 }; // prefill, then one token per step
        let y = mha.forward_step(&mut cache, &tokens(&x, pos, n)?)?; // [1, n, 64]
                                                                     // NaN anywhere makes `err` NaN, and `NaN <= bound` is false: a NaN never agrees.
        let err = y.max_abs_diff(&want_f32[pos * 64..(pos + n) * 64]);
        all_ok &= err <= bound;
        println!(
            "step: tokens {pos}..{} -> cache len {:2}, y[last, ..3] = {:?}, max |GPU - reference| = {err:.1e}",
            pos + n,
            cache.len(),
            &y.data()[(n - 1) * 64..(n - 1) * 64 + 3],
        );
        pos += n;
    }
    // What it holds on the device, to budget a longer cache by.
    let bytes = cache.bytes();
    println!(
        "cache bytes: {} of keys and values, {} of step buffers (sized for the longest step so far)",
        bytes.keys_values, bytes.step
    );
    // The cache is full now: one more token is a clear error, and the cache is unchanged.
    if let Err(e) = mha.forward_step(&mut cache, &tokens(&x, 0, 1)?) {
        println!("one more token: {e}");
    }
    println!(
        "{} ({:?} path, bound {bound:.1e})",
        if all_ok {
            "all steps AGREE with the full causal forward"
        } else {
            "DISAGREE"
        },
        cache.path()
    );
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
