//! Seed 001's module (`MultiHeadAttention(emb_size, q_k_size, v_size, head)`) with its demo's
//! sizes, as cross-attention: English tokens (queries) attend to German tokens (keys/values).
//! Sentences become vectors through a token embedding plus sinusoidal positions (deterministic),
//! and the padding of the shorter German sentence is masked with a `Mask::Block` of bools
//! `[B, Lq, Lk]` (true = masked), which is what seed 001's `attn_mask` means.
//!
//! ```text
//! cargo run --release --example per_head_cross_attention
//! ```
//! Exits with status 1 if the GPU and the f64 CPU reference disagree.

use std::process::ExitCode;

use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Gpu, Mask, MultiHeadAttention, Tensor,
};

const EMB: usize = 128;
const PAD: &str = "<pad>";

/// Token embedding (a seeded random table, one row per vocabulary word) plus sinusoidal
/// positions: `pe[pos, 2i] = sin(pos / 10000^(2i/EMB))`, `pe[pos, 2i+1] = cos(..)`.
fn embed(sentences: &[Vec<&str>], vocab: &[&str], table: &Tensor) -> wgpu_mha::Result<Tensor> {
    let len = sentences.iter().map(Vec::len).max().unwrap_or(0);
    let mut data = Vec::with_capacity(sentences.len() * len * EMB);
    for sentence in sentences {
        for pos in 0..len {
            let word = sentence.get(pos).copied().unwrap_or(PAD);
            let id = vocab.iter().position(|w| *w == word).unwrap_or(0);
            for d in 0..EMB {
                let angle = pos as f32 / 10000f32.powf((d / 2 * 2) as f32 / EMB as f32);
                let pe = if d % 2 == 0 { angle.sin() } else { angle.cos() };
                data.push(table.data()[id * EMB + d] + pe);
            }
        }
    }
    Tensor::new([sentences.len(), len, EMB], data)
}

fn main() -> Result<ExitCode, wgpu_mha::Error> {
    let gpu = Gpu::new()?;
    println!("adapter: {}", gpu.describe());

    // Two sentence pairs; the second German sentence is shorter and gets padded.
    let german = [
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche .",
        "Ein Hund rennt .",
    ];
    let english = [
        "Two young White males are outside near many bushes .",
        "A dog runs .",
    ];
    let split = |s: &[&'static str; 2]| {
        s.iter()
            .map(|t| t.split(' ').collect())
            .collect::<Vec<Vec<&str>>>()
    };
    let (de, en) = (split(&german), split(&english));
    let mut vocab: Vec<&str> = de.iter().chain(&en).flatten().copied().collect();
    vocab.push(PAD);
    vocab.sort();
    vocab.dedup();
    let table = Tensor::random([vocab.len(), EMB], 2024);
    let x_q = embed(&en, &vocab, &table)?; // [2, Lq, 128]
    let x_k_v = embed(&de, &vocab, &table)?; // [2, Lk, 128]
    let (b, lq, lk) = (x_q.shape()[0], x_q.shape()[1], x_k_v.shape()[1]);

    // attn_mask [B, Lq, Lk]: true where the key is padding.
    let mut blocked = vec![false; b * lq * lk];
    for (bi, sentence) in de.iter().enumerate() {
        for i in 0..lq {
            for j in sentence.len()..lk {
                blocked[(bi * lq + i) * lk + j] = true;
            }
        }
    }
    let mask = Mask::block([b, lq, lk], &blocked)?;

    // Seed 001's demo sizes: emb 128, q_k 256, v 512, 8 heads (no output projection).
    let config = AttentionConfig::per_head(EMB, 256, 512, 8)?;
    let weights = AttentionWeights::random(&config, 0);
    let mha = MultiHeadAttention::new(&gpu, config, &weights)?;
    let z = mha.forward_cross(&x_q, &x_k_v, &mask)?;
    println!(
        "x_q {:?}, x_k_v {:?} -> z {:?} (= [B, Lq, head * v_size])",
        x_q.shape(),
        x_k_v.shape(),
        z.shape()
    );
    let row = lq * config.output_dim(); // z[1, 0, :]
    println!("z[1, 0, ..4] = {:?}", &z.data()[row..row + 4]);

    let want = reference::forward(&config, &weights, &x_q, &x_k_v, &x_k_v, &mask)?;
    let err = z.max_abs_diff(&want.output_f32());
    let bound = 1e-5 * (1.0 + want.max_abs() as f32);
    let verdict = if err <= bound { "AGREE" } else { "DISAGREE" };
    println!("max |GPU - CPU reference| = {err:.2e} (bound {bound:.1e}): {verdict}");
    Ok(if err <= bound {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
