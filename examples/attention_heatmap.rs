//! Attention probabilities of seed 001's module as a picture: a short sentence (token embedding
//! plus sinusoidal positions, deterministic) goes through the per-head module with a causal mask,
//! the probabilities `[B, H, Lq, Lk]` come back (`ForwardOptions { return_probs: true, .. }`), and
//! one PNG shows them, one panel per head.
//!
//! ```text
//! cargo run --release --example attention_heatmap [-- OUT.png]   (default target/attention_heatmap.png)
//! ```
//!
//! The image: panels in a grid of 4 columns, head 0 top left, head 4 bottom left. In each panel
//! **rows are query positions** (token 0 at the top) and **columns are key positions** (token 0 at
//! the left); each cell is 16×16 px, panels are separated by 8 px of grey. Colour scale: a
//! probability `p` is drawn at `t = sqrt(p)` on a black → red → yellow → white ramp, so
//! `p = 0` is black and `p = 1` white (the square root keeps small weights visible). With the
//! causal mask every cell above the diagonal is exactly 0, so each panel shows a black upper
//! triangle. Exits with status 1 if the probabilities disagree with the CPU reference.

use std::process::ExitCode;

use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, ForwardOptions, Gpu, Mask, MultiHeadAttention,
    Tensor,
};

const EMB: usize = 128;
const CELL: usize = 16;
const GAP: usize = 8;
const COLUMNS: usize = 4;

/// Token embedding (seeded random table) plus sinusoidal positions, `[1, L, EMB]`.
fn embed(words: &[&str], vocab: &[&str], table: &Tensor) -> wgpu_mha::Result<Tensor> {
    let mut data = Vec::with_capacity(words.len() * EMB);
    for (pos, word) in words.iter().enumerate() {
        let id = vocab.iter().position(|w| w == word).unwrap_or(0);
        for d in 0..EMB {
            let angle = pos as f32 / 10000f32.powf((d / 2 * 2) as f32 / EMB as f32);
            let pe = if d % 2 == 0 { angle.sin() } else { angle.cos() };
            data.push(table.data()[id * EMB + d] + pe);
        }
    }
    Tensor::new([1, words.len(), EMB], data)
}

/// Black → red → yellow → white for `t` in [0, 1].
fn colour(t: f32) -> [u8; 3] {
    let ramp = |x: f32| (x.clamp(0.0, 1.0) * 255.0).round() as u8;
    [ramp(3.0 * t), ramp(3.0 * t - 1.0), ramp(3.0 * t - 2.0)]
}

fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let out_path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/attention_heatmap.png".into());
    let gpu = Gpu::new()?;
    println!("adapter: {}", gpu.describe());

    let words: Vec<&str> = "the quick brown fox jumps over the lazy dog ."
        .split(' ')
        .collect();
    let mut vocab = words.clone();
    vocab.sort();
    vocab.dedup();
    let table = Tensor::random([vocab.len(), EMB], 7).scaled(2.0);
    let x = embed(&words, &vocab, &table)?;

    let config = AttentionConfig::per_head(EMB, 32, 32, 8)?;
    let weights = AttentionWeights::random(&config, 3);
    let mha = MultiHeadAttention::new(&gpu, config, &weights)?;
    let options = ForwardOptions {
        return_probs: true,
        ..Default::default()
    };
    let out = mha.forward_with(&x, &x, &x, &Mask::Causal, &options)?;
    let probs = out.probs.ok_or("no probabilities returned")?; // [1, H, L, L]
    let (heads, l) = (probs.shape()[1], probs.shape()[2]);

    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal)?;
    let want_probs: Vec<f32> = want.probs.iter().map(|&p| p as f32).collect();
    // NaN anywhere makes `err` NaN, and `NaN <= 1e-5` is false: a NaN never agrees.
    let err = probs.max_abs_diff(&want_probs);

    // Paint the grid.
    let rows_of_panels = heads.div_ceil(COLUMNS);
    let panel = l * CELL;
    let (width, height) = (
        GAP + COLUMNS * (panel + GAP),
        GAP + rows_of_panels * (panel + GAP),
    );
    let mut rgb = vec![128u8; width * height * 3];
    for h in 0..heads {
        let (x0, y0) = (
            GAP + (h % COLUMNS) * (panel + GAP),
            GAP + (h / COLUMNS) * (panel + GAP),
        );
        for i in 0..l {
            for j in 0..l {
                let c = colour(probs.data()[(h * l + i) * l + j].max(0.0).sqrt());
                for py in y0 + i * CELL..y0 + (i + 1) * CELL {
                    for px in x0 + j * CELL..x0 + (j + 1) * CELL {
                        rgb[(py * width + px) * 3..][..3].copy_from_slice(&c);
                    }
                }
            }
        }
    }
    if let Some(dir) = std::path::Path::new(&out_path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)?;
    }
    let mut encoder = png::Encoder::new(
        std::io::BufWriter::new(std::fs::File::create(&out_path)?),
        width as u32,
        height as u32,
    );
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header()?.write_image_data(&rgb)?;

    println!("sentence: {}", words.join(" "));
    println!(
        "probabilities {:?} = [B, H, Lq, Lk]; head 0, query 2: {:?}",
        probs.shape(),
        &probs.data()[2 * l..2 * l + 3]
    );
    println!("wrote {out_path} ({width}x{height} px): {heads} panels, rows = query position, columns = key position");
    let ok = err <= 1e-5;
    println!(
        "max |GPU - CPU reference| over the probabilities = {err:.1e}: {}",
        if ok { "AGREE" } else { "DISAGREE" }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
