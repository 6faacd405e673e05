//! A Llama-style attention layer (grouped-query attention, RoPE with llama3 scaling) as
//! `transformers` saved it: prefill a prompt, then decode token by token with a `KvCache`
//! that holds only the key/value heads, each step checked against `transformers`.
//!
//! ```text
//! cargo run --release --example hf_llama_decode [-- CASE.safetensors]
//! ```
//! The default is `tests/fixtures/hf/llama_self_layer1_causal_padding_gqa_llama3.safetensors`
//! (made by `tools/gen_hf_cases.py` from a random-init `LlamaModel`: 4 query heads, 2 key/value
//! heads, gapped `position_ids`, a padded sequence): the module's tensors, its `config.json` in
//! the metadata, the inputs and `transformers`' float64 answer `out_f64` for the whole sequence.
//! Exits with status 1 if any step disagrees with it.

use std::path::PathBuf;
use std::process::ExitCode;

use wgpu_mha::io::hf::HfCheckpoint;
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{
    Gpu, KvCache, MaskTensor, MultiHeadAttention, SafetensorsFile, StepOptions, Tensor,
};

fn main() -> Result<ExitCode, wgpu_mha::Error> {
    let path = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/hf/llama_self_layer1_causal_padding_gqa_llama3.safetensors")
        });
    // 1. The module named by the file's `prefix`, with the file's config.json.
    let ckpt = HfCheckpoint::open(&path)?;
    let file = SafetensorsFile::open(&path)?;
    let prefix = file.metadata("prefix").unwrap_or_default().to_string();
    let module = ckpt.attention(&prefix, None)?;
    let c = module.config;
    println!(
        "{prefix}: {} heads, {} key/value heads, RoPE {:?}",
        c.heads, c.kv_heads, c.rope
    );

    // 2. Inputs: hidden states [B, L, E], position_ids [B, L], attention_mask [B, L].
    let hidden = file.tensor_f32("hidden_states")?;
    let (b, l, e) = (hidden.shape()[0], hidden.shape()[1], hidden.shape()[2]);
    let (_, positions) = file.tensor_indices("position_ids")?;
    let padding = file.mask_tensor("attention_mask").ok();
    let (_, want) = file.tensor_f64("out_f64")?;

    // 3. Prefill 3 tokens, then one at a time; each step's mask is causal + the padding of
    //    the positions so far, its RoPE positions the file's.
    let gpu = Gpu::new()?;
    println!("adapter: {}", gpu.describe());
    let mha = MultiHeadAttention::new(&gpu, c, &module.weights)?;
    let mut cache = KvCache::new(&mha, b, l)?;
    let (mut pos, mut worst) = (0, 0.0f32);
    while pos < l {
        let n = if pos == 0 { 3.min(l) } else { 1 };
        let rows = |t: &[f32], w: usize| -> Vec<f32> {
            (0..b)
                .flat_map(|bi| t[(bi * l + pos) * w..(bi * l + pos + n) * w].to_vec())
                .collect()
        };
        let x = Tensor::new([b, n, e], rows(hidden.data(), e))?;
        let step_positions: Vec<usize> = (0..b)
            .flat_map(|bi| positions[bi * l + pos..bi * l + pos + n].to_vec())
            .collect();
        let seen = padding
            .as_ref()
            .map(|m| {
                let keep: Vec<u8> = (0..b)
                    .flat_map(|bi| m.data()[bi * l..bi * l + pos + n].to_vec())
                    .collect();
                MaskTensor::new([b, pos + n], keep)
            })
            .transpose()?;
        let dims = AttnDims {
            batch: b,
            heads: c.heads,
            lq: n,
            lk: pos + n,
        };
        let mask = module.mask(dims, seen.as_ref())?;
        let options = StepOptions {
            mask: Some(&mask),
            positions: Some(&step_positions),
            ..Default::default()
        };
        let out = mha.forward_step_with(&mut cache, &x, &options)?;
        let expected: Vec<f32> = (0..b)
            .flat_map(|bi| {
                want[(bi * l + pos) * e..(bi * l + pos + n) * e]
                    .iter()
                    .map(|&v| v as f32)
            })
            .collect();
        let err = out.max_abs_diff(&expected);
        println!("step at {pos} (+{n}): max |GPU - transformers f64| = {err:.2e}");
        worst = worst.max(err);
        pos += n;
    }
    // A NaN never agrees (NaN <= bound is false).
    let ok = worst <= 1e-5;
    println!("{}", if ok { "AGREE" } else { "DISAGREE" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
