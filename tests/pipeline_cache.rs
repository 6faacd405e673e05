//! The on-disk pipeline cache (adapters with `PIPELINE_CACHE`, i.e. Vulkan): a device writes
//! its compiled pipelines to one file per adapter and driver; a later device on the same
//! directory reads it; a damaged or foreign file is ignored and replaced, and results stay
//! those of the f64 reference throughout. Elsewhere (GL) there is no file at all.

mod common;

use std::path::PathBuf;

use wgpu_mha::{
    reference, AttentionConfig, AttentionWeights, Gpu, GpuOptions, Mask, MultiHeadAttention,
    PipelineCacheDir, Tensor,
};

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-mha-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn gpu_with_cache(dir: &std::path::Path) -> Gpu {
    Gpu::with_options(&GpuOptions {
        pipeline_cache: PipelineCacheDir::At(dir.to_path_buf()),
        ..GpuOptions::default()
    })
    .expect("an adapter")
}

/// A small forward on `gpu`, checked against the f64 reference.
fn forward_matches_reference(gpu: &Gpu) {
    let config = AttentionConfig::classic(16, 2).unwrap();
    let weights = AttentionWeights::random(&config, 5);
    let mha = MultiHeadAttention::new(gpu, config, &weights).unwrap();
    let x = Tensor::random([2, 5, 16], 6);
    let got = mha.forward(&x, &x, &x, &Mask::Causal).unwrap();
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    common::assert_within(
        "forward",
        got.data(),
        &want.output,
        common::tolerance(&want.output),
    );
}

#[test]
fn pipelines_are_kept_on_disk_and_damaged_files_are_replaced() {
    let dir = fresh_dir("pipeline-cache");
    let gpu = gpu_with_cache(&dir);
    let has_cache = gpu.features().contains(wgpu::Features::PIPELINE_CACHE);
    forward_matches_reference(&gpu);
    let Some(file) = gpu.pipeline_cache_file().map(|p| p.to_path_buf()) else {
        assert!(
            !has_cache,
            "an adapter with PIPELINE_CACHE but no cache file"
        );
        assert!(!dir.exists() || std::fs::read_dir(&dir).unwrap().next().is_none());
        return;
    };
    assert!(file.starts_with(&dir), "{}", file.display());
    let written = std::fs::read(&file).expect("the cache file after compiling");
    assert!(written.starts_with(b"WGPUMHA1"), "our header first");

    // A second device on the same directory reads it and computes the same.
    let again = gpu_with_cache(&dir);
    assert_eq!(again.pipeline_cache_file(), Some(file.as_path()));
    forward_matches_reference(&again);

    // Damage: a flipped byte in wgpu's data, then a file that is not ours, then a directory
    // where the file should be. Each is ignored; the first two are replaced by a whole file.
    for damage in ["flip", "foreign"] {
        let mut bytes = std::fs::read(&file).unwrap();
        match damage {
            "flip" => {
                let last = bytes.len() - 1;
                bytes[last] ^= 0x55;
            }
            _ => bytes = b"not a cache at all".to_vec(),
        }
        std::fs::write(&file, &bytes).unwrap();
        let damaged = gpu_with_cache(&dir);
        forward_matches_reference(&damaged);
        let rewritten = std::fs::read(&file).unwrap();
        assert!(rewritten.starts_with(b"WGPUMHA1"), "{damage}: not replaced");
        assert_ne!(rewritten, bytes, "{damage}: not replaced");
    }
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    forward_matches_reference(&gpu_with_cache(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn off_means_no_file() {
    let gpu = Gpu::with_options(&GpuOptions {
        pipeline_cache: PipelineCacheDir::Off,
        ..GpuOptions::default()
    })
    .expect("an adapter");
    assert_eq!(gpu.pipeline_cache_file(), None);
    forward_matches_reference(&gpu);
}
