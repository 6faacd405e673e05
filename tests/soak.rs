//! 10,000 forwards: after warm-up, live GPU buffers and bind groups stay exactly flat and the
//! process RSS grows by less than 16 MiB. Ignored by default (about a minute on lavapipe):
//! `cargo test --release --test soak -- --ignored --nocapture`.

mod common;

#[test]
#[ignore = "long: 10,000 forwards"]
fn ten_thousand_forwards_leak_nothing() {
    let samples = wgpu_mha::soak::run(common::gpu(), 10_000, 1_000).expect("soak run");
    for s in &samples {
        println!("{s:?}");
    }
    let warm = samples.first().expect("samples");
    let last = samples.last().expect("samples");
    assert_eq!(last.gpu_buffers, warm.gpu_buffers, "GPU buffers grew");
    assert_eq!(
        last.gpu_bind_groups, warm.gpu_bind_groups,
        "bind groups grew"
    );
    if let (Some(a), Some(b)) = (warm.rss_kib, last.rss_kib) {
        assert!(b < a + 16 * 1024, "RSS grew from {a} KiB to {b} KiB");
    }
}

#[test]
fn short_soak_is_flat_too() {
    // The same check over 300 forwards, run in CI.
    let samples = wgpu_mha::soak::run(common::gpu(), 300, 100).expect("soak run");
    let (warm, last) = (samples[0], samples[samples.len() - 1]);
    assert!(
        warm.gpu_buffers > 0,
        "wgpu counters must be enabled (feature `counters`)"
    );
    assert_eq!(
        last.gpu_buffers, warm.gpu_buffers,
        "GPU buffers grew: {samples:?}"
    );
    assert_eq!(
        last.gpu_bind_groups, warm.gpu_bind_groups,
        "bind groups grew: {samples:?}"
    );
}
