//! Soak run: many forwards of one small shape, sampling process memory and live GPU objects,
//! so leaks show as growth after warm-up. Used by `wgpu-mha soak` and the ignored soak test.

use wgpu_mha::{AttentionConfig, AttentionWeights, Gpu, Mask, MultiHeadAttention, Result, Tensor};

/// One sample of a soak run.
#[derive(Debug, Clone, Copy)]
pub struct SoakSample {
    pub iteration: usize,
    /// Resident set size in KiB (Linux; `None` elsewhere).
    pub rss_kib: Option<u64>,
    pub gpu_buffers: isize,
    pub gpu_bind_groups: isize,
}

/// Resident set size of this process in KiB, from `/proc/self/statm`.
pub fn rss_kib() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4)
}

/// Runs `iterations` forwards (classic d 64, 4 heads, B 2, L 16, alternating masks and both
/// paths), sampling every `every` iterations (and after the warm-up of `every` iterations).
pub fn run(gpu: &Gpu, iterations: usize, every: usize) -> Result<Vec<SoakSample>> {
    let config = AttentionConfig::classic(64, 4)?;
    let weights = AttentionWeights::random(&config, 1);
    let mha = MultiHeadAttention::new(gpu, config, &weights)?;
    let x = Tensor::random([2, 16, 64], 2);
    let masks = [Mask::None, Mask::Causal, Mask::KeyPadding(vec![16, 9])];
    let every = every.max(1);
    let mut samples = Vec::new();
    for i in 1..=iterations {
        let options = wgpu_mha::ForwardOptions {
            return_probs: i % 2 == 0,
            path: wgpu_mha::AttentionPath::Auto,
            positions: None,
        };
        mha.forward_with(&x, &x, &x, &masks[i % masks.len()], &options)?;
        if i % every == 0 || i == iterations {
            let live = gpu.live_objects();
            samples.push(SoakSample {
                iteration: i,
                rss_kib: rss_kib(),
                gpu_buffers: live.buffers,
                gpu_bind_groups: live.bind_groups,
            });
        }
    }
    Ok(samples)
}
