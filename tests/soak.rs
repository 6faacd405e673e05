//! Soak: many forwards through `wgpu-mha soak` (a CLI feature); after warm-up, live GPU buffers
//! and bind groups stay exactly flat and the process RSS grows by less than 16 MiB. The long run
//! is ignored by default (about a minute on lavapipe):
//! `cargo test --release --test soak -- --ignored --nocapture`.

use std::process::Command;

/// One sample row printed by `wgpu-mha soak`: forwards, RSS KiB (or `-`), buffers, bind groups.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rss_kib: Option<u64>,
    buffers: i64,
    bind_groups: i64,
}

fn soak(iters: usize, every: usize) -> Vec<Sample> {
    let out = Command::new(env!("CARGO_BIN_EXE_wgpu-mha"))
        .args([
            "soak",
            "--iters",
            &iters.to_string(),
            "--every",
            &every.to_string(),
        ])
        .output()
        .expect("run wgpu-mha soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "soak failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<Sample> = stdout
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() != 4 || f[0].parse::<usize>().is_err() {
                return None;
            }
            Some(Sample {
                rss_kib: f[1].parse().ok(),
                buffers: f[2].parse().ok()?,
                bind_groups: f[3].parse().ok()?,
            })
        })
        .collect();
    assert!(samples.len() >= 2, "too few samples in: {stdout}");
    samples
}

fn assert_flat(samples: &[Sample]) {
    let (warm, last) = (samples[0], samples[samples.len() - 1]);
    assert!(
        warm.buffers > 0,
        "wgpu counters must be enabled (feature `counters`)"
    );
    assert_eq!(last.buffers, warm.buffers, "GPU buffers grew: {samples:?}");
    assert_eq!(
        last.bind_groups, warm.bind_groups,
        "bind groups grew: {samples:?}"
    );
}

#[test]
#[ignore = "long: 10,000 forwards"]
fn ten_thousand_forwards_leak_nothing() {
    let samples = soak(10_000, 1_000);
    assert_flat(&samples);
    let (warm, last) = (samples[0], samples[samples.len() - 1]);
    if let (Some(a), Some(b)) = (warm.rss_kib, last.rss_kib) {
        assert!(b < a + 16 * 1024, "RSS grew from {a} KiB to {b} KiB");
    }
}

#[test]
fn short_soak_is_flat_too() {
    // The same check over 300 forwards, run in CI.
    assert_flat(&soak(300, 100));
}
