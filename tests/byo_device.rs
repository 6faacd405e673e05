//! A caller's own wgpu device, wrapped with `Gpu::from_device`: modules on it match the f64
//! reference, follow the device's features and limits (a missing feature or a too-low limit is
//! an error naming it), leave the caller's callbacks alone, and two `Gpu`s over one device do
//! not disturb each other. Devices are made the way an engine makes its own, through wgpu's
//! helpers (which honour `WGPU_BACKEND` and `WGPU_ADAPTER_NAME`), so CI's GL pass runs these
//! on GL too. Head sizes 16 and 32, which the rest of the suite compiles anyway.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{assert_close, assert_within, options, relative_tolerance, BOTH_PATHS};
use wgpu_mha::{
    reference, AttentionConfig, AttentionPath, AttentionWeights, DeviceOptions, Error, Gpu, Mask,
    MultiHeadAttention, PipelineCacheDir, Precision, Tensor,
};

/// The features an engine might ask for: the ones the crate can use, and one it never does.
const ENGINE_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::TIMESTAMP_QUERY)
    .union(wgpu::Features::PIPELINE_CACHE)
    .union(wgpu::Features::DEPTH_CLIP_CONTROL);

fn adapter() -> wgpu::Adapter {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))
    .unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"))
}

/// A device with those of `features` the adapter has, and `limits`.
fn make_device(
    adapter: &wgpu::Adapter,
    features: wgpu::Features,
    limits: wgpu::Limits,
) -> (wgpu::Device, wgpu::Queue) {
    pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("the engine's device"),
        required_features: adapter.features() & features,
        required_limits: limits,
        ..Default::default()
    }))
    .expect("the engine's device")
}

fn gqa_classic() -> AttentionConfig {
    AttentionConfig::classic(64, 4)
        .unwrap()
        .with_kv_heads(2)
        .unwrap()
}

fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-mha-byo-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `mha.forward(x, x, x, Causal)` against the reference.
fn check_self_attention(label: &str, mha: &MultiHeadAttention, weights: &AttentionWeights) {
    let x = Tensor::random([2, 9, mha.config().model_dim], 2);
    let want = reference::forward(mha.config(), weights, &x, &x, &x, &Mask::Causal).unwrap();
    let got = mha.forward(&x, &x, &x, &Mask::Causal).unwrap();
    assert_close(label, got.data(), &want.output);
}

#[test]
fn a_wrapped_device_runs_classic_and_per_head_modules_like_the_reference() {
    let adapter = adapter();
    let (device, queue) = make_device(&adapter, ENGINE_FEATURES, adapter.limits());
    let gpu = Gpu::from_device(device.clone(), queue).unwrap();
    eprintln!("wrapped {}", gpu.describe());
    assert_eq!(gpu.features(), device.features());
    assert_eq!(gpu.limits(), &device.limits());

    // Classic GQA self-attention, causal, on both paths (probabilities on the multi-pass one).
    let config = gqa_classic();
    let weights = AttentionWeights::random(&config, 1);
    let mha = MultiHeadAttention::new(&gpu, config, &weights).unwrap();
    let x = Tensor::random([2, 9, 64], 2);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    for path in BOTH_PATHS {
        let probs = path == AttentionPath::MultiPass;
        let got = mha
            .forward_with(&x, &x, &x, &Mask::Causal, &options(path, probs))
            .unwrap();
        assert_close(
            &format!("classic {path:?}"),
            got.output.data(),
            &want.output,
        );
        if let Some(p) = got.probs {
            assert_within("classic probabilities", p.data(), &want.probs, 1e-5);
        }
    }
    if gpu.has_f16() {
        let half =
            MultiHeadAttention::with_precision(&gpu, config, &weights, Precision::F16).unwrap();
        let got = half.forward(&x, &x, &x, &Mask::Causal).unwrap();
        let tol = relative_tolerance(2e-2, &want.output);
        assert_within("classic f16", got.data(), &want.output, tol);
    }

    // Per-head multi-query cross-attention, causal with fewer queries than keys.
    let config = AttentionConfig::per_head(32, 16, 32, 4)
        .unwrap()
        .with_kv_heads(1)
        .unwrap();
    let weights = AttentionWeights::random(&config, 3);
    let mha = MultiHeadAttention::new(&gpu, config, &weights).unwrap();
    let (q, kv) = (
        Tensor::random([2, 5, 32], 4),
        Tensor::random([2, 11, 32], 5),
    );
    let want = reference::forward(&config, &weights, &q, &kv, &kv, &Mask::Causal).unwrap();
    let got = mha.forward(&q, &kv, &kv, &Mask::Causal).unwrap();
    assert_close("per-head", got.data(), &want.output);
}

#[test]
fn a_device_without_optional_features_runs_and_names_the_one_missing() {
    let adapter = adapter();
    let (device, queue) = make_device(&adapter, wgpu::Features::empty(), adapter.limits());
    let dir = fresh_dir("bare");
    let options = DeviceOptions {
        pipeline_cache: PipelineCacheDir::At(dir.clone()),
        ..DeviceOptions::default()
    };
    let gpu = Gpu::from_device_with(device, queue, &options).unwrap();
    assert!(!gpu.has_f16() && !gpu.has_subgroups() && !gpu.has_timestamps());
    assert!(gpu.pipeline_cache_file().is_none(), "no PIPELINE_CACHE");

    let config = gqa_classic();
    let weights = AttentionWeights::random(&config, 6);
    let err = MultiHeadAttention::with_precision(&gpu, config, &weights, Precision::F16)
        .err()
        .expect("f16 without SHADER_F16");
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("SHADER_F16"), "{err}");

    // Only what needs a feature is refused: f32 (and PreferF16, which falls back) runs, on
    // kernels without subgroups, and with no timestamps a profiled forward has no timings.
    let mha =
        MultiHeadAttention::with_precision(&gpu, config, &weights, Precision::PreferF16).unwrap();
    assert_eq!(mha.precision(), Precision::F32);
    check_self_attention("no optional features", &mha, &weights);
    let x = Tensor::random([1, 3, 64], 7);
    let profiled = mha
        .forward_profiled(&x, &x, &x, &Mask::None, &Default::default())
        .unwrap();
    assert!(profiled.pass_ms.is_empty());
    assert!(
        !dir.exists(),
        "a device without PIPELINE_CACHE writes no cache"
    );
}

#[test]
fn two_gpus_over_one_device_interleave_and_outlive_each_other() {
    let adapter = adapter();
    let (device, queue) = make_device(&adapter, ENGINE_FEATURES, adapter.limits());
    let dir = fresh_dir("shared");
    let options = DeviceOptions {
        pipeline_cache: PipelineCacheDir::At(dir.clone()),
        ..DeviceOptions::default()
    };
    let a = Gpu::from_device_with(device.clone(), queue.clone(), &options).unwrap();
    let b = Gpu::from_device_with(device, queue, &options).unwrap();
    // Each has its own pipelines (and its own wgpu cache object, on this device), over one file.
    assert_eq!(a.pipeline_cache_file(), b.pipeline_cache_file());

    let config = gqa_classic();
    let weights = AttentionWeights::random(&config, 8);
    let on_a = MultiHeadAttention::new(&a, config, &weights).unwrap();
    let inputs: Vec<Tensor> = (0..3u64)
        .map(|i| Tensor::random([2, 9, 64], 10 + i))
        .collect();
    // What one Gpu alone gives, before the second compiles anything.
    let alone: Vec<Vec<f32>> = inputs
        .iter()
        .map(|x| {
            on_a.forward(x, x, x, &Mask::Causal)
                .unwrap()
                .data()
                .to_vec()
        })
        .collect();
    let on_b = MultiHeadAttention::new(&b, config, &weights).unwrap();
    for round in 0..2 {
        for (x, want) in inputs.iter().zip(&alone) {
            let from_b = on_b.forward(x, x, x, &Mask::Causal).unwrap();
            let from_a = on_a.forward(x, x, x, &Mask::Causal).unwrap();
            assert_eq!(from_a.data(), &want[..], "round {round}: a changed");
            assert_eq!(from_b.data(), &want[..], "round {round}: b differs from a");
        }
    }
    let x = &inputs[0];
    let reference = reference::forward(&config, &weights, x, x, x, &Mask::Causal).unwrap();
    assert_close("shared device", &alone[0], &reference.output);

    // Dropping one (its modules, pipelines and cache) leaves the other working.
    drop(on_a);
    drop(a);
    let again = on_b.forward(x, x, x, &Mask::Causal).unwrap();
    assert_eq!(again.data(), &alone[0][..]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lowered_limits_are_followed_or_named() {
    let adapter = adapter();
    let mut limits = adapter.limits();
    limits.max_compute_workgroup_storage_size =
        limits.max_compute_workgroup_storage_size.min(16384);
    limits.max_storage_buffer_binding_size = 64 << 10;
    let (device, queue) = make_device(&adapter, ENGINE_FEATURES, limits);
    let gpu = Gpu::from_device(device, queue).unwrap();
    assert_eq!(gpu.binding_limit(), 64 << 10);

    // [1, 4, 80, 80] f32 probabilities are 100 KiB: the multi-pass path splits the queries.
    let config = gqa_classic();
    let weights = AttentionWeights::random(&config, 12);
    let mha = MultiHeadAttention::new(&gpu, config, &weights).unwrap();
    let x = Tensor::random([1, 80, 64], 13);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    for path in BOTH_PATHS {
        let probs = path == AttentionPath::MultiPass;
        let got = mha
            .forward_with(&x, &x, &x, &Mask::Causal, &options(path, probs))
            .unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert_close(
            &format!("64 KiB bindings {path:?}"),
            got.output.data(),
            &want.output,
        );
        if let Some(p) = got.probs {
            assert_within("64 KiB bindings probabilities", p.data(), &want.probs, 1e-5);
        }
    }
    // 300 keys of 64 floats are 75 KiB, and keys cannot be split: an error with the figures.
    let kv = Tensor::random([1, 300, 64], 14);
    match mha.forward(&x, &kv, &kv, &Mask::None) {
        Err(Error::TooLarge { needed, limit, .. }) => {
            assert_eq!(limit, 64 << 10);
            assert!(needed > limit);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }

    // A limit no forward can live with is refused when the device is wrapped, by name.
    let mut limits = adapter.limits();
    limits.max_storage_buffers_per_shader_stage = 4;
    let (device, queue) = make_device(&adapter, wgpu::Features::empty(), limits);
    let err = Gpu::from_device(device, queue).expect_err("too few storage buffers");
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("max_storage_buffers_per_shader_stage"),
        "{err}"
    );
}

#[test]
fn the_callers_callbacks_stay_and_a_forwarded_loss_fails_fast() {
    let adapter = adapter();
    let (device, queue) = make_device(&adapter, ENGINE_FEATURES, adapter.limits());
    // The engine's own handlers, set before it wraps the device.
    let errors = Arc::new(AtomicUsize::new(0));
    let seen = errors.clone();
    device.on_uncaptured_error(Arc::new(move |_: wgpu::Error| {
        seen.fetch_add(1, Ordering::SeqCst);
    }));
    type Forward = Box<dyn Fn(wgpu::DeviceLostReason, String) + Send>;
    let forward_to: Arc<Mutex<Option<Forward>>> = Arc::new(Mutex::new(None));
    let losses = Arc::new(AtomicUsize::new(0));
    let (slot, seen) = (forward_to.clone(), losses.clone());
    device.set_device_lost_callback(move |reason, message| {
        seen.fetch_add(1, Ordering::SeqCst);
        if let Some(forward) = slot.lock().unwrap().as_ref() {
            forward(reason, message);
        }
    });

    let gpu = Gpu::from_device(device.clone(), queue).unwrap();
    *forward_to.lock().unwrap() = Some(Box::new(gpu.device_lost_handler()));
    let config = gqa_classic();
    let weights = AttentionWeights::random(&config, 15);
    let mha = MultiHeadAttention::new(&gpu, config, &weights).unwrap();
    check_self_attention("before", &mha, &weights);

    // The engine's own mistake goes to the engine's handler, and is not blamed on a forward.
    let _bad = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("the engine's mistake"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    assert_eq!(errors.load(Ordering::SeqCst), 1);
    check_self_attention("after the engine's error", &mha, &weights);

    device.destroy();
    let _ = device.poll(wgpu::PollType::wait_indefinitely());
    assert_eq!(
        losses.load(Ordering::SeqCst),
        1,
        "the engine's callback ran"
    );
    let x = Tensor::random([1, 3, 64], 16);
    let err = mha.forward(&x, &x, &x, &Mask::None).expect_err("lost");
    assert!(matches!(err, Error::DeviceLost(_)), "{err}");
}
