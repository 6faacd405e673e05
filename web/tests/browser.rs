//! The engine in a browser (headless Chromium's WebGPU, SwiftShader in CI), checked against the
//! same answers as natively: every case file `wgpu-mha check` runs (seed modules, masks, GQA,
//! RoPE, the Hugging Face families) against its f64 answer, SDPA against an f64 reference, a
//! decode loop against the f64 reference of the whole sequence, and the refusals.
//! Run by `.ci/run` (`wasm-bindgen-test-runner`; see docs/browser.md).
#![cfg(target_arch = "wasm32")]

use wasm_bindgen_test::*;
use wgpu_mha::{
    AttentionConfig, AttentionWeights, Case, Error, ForwardOptions, Gpu, GpuOptions, GpuTensor,
    KvCache, Mask, MultiHeadAttention, Tensor,
};

wasm_bindgen_test_configure!(run_in_browser);

include!(concat!(env!("OUT_DIR"), "/cases.rs"));

async fn gpu() -> Gpu {
    Gpu::new_async(&GpuOptions::default())
        .await
        .expect("the browser offers a WebGPU adapter")
}

/// Every case file on `gpu` against its f64 answer: the failures, and the refusals by name.
async fn check_every_case(gpu: &Gpu) -> (Vec<String>, Vec<String>) {
    let mut failures = Vec::new();
    let mut refused = Vec::new();
    for (name, bytes) in CASES {
        let case = match Case::from_bytes(*name, bytes.to_vec()) {
            Ok(case) => case,
            Err(e) => {
                failures.push(format!("{name}: unreadable: {e}"));
                continue;
            }
        };
        match case.run_async(gpu, &ForwardOptions::default()).await {
            Ok(result) if result.passed() => {}
            Ok(result) => failures.push(format!(
                "{name}: max |err| {:.3e} > bound {:.3e}",
                result.max_abs_err, result.bound
            )),
            Err(e @ (Error::Unsupported { .. } | Error::TooLarge { .. })) => {
                refused.push(format!("{name}: {e}"))
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(
        CASES.len() >= 200,
        "only {} case files embedded",
        CASES.len()
    );
    (failures, refused)
}

#[wasm_bindgen_test]
async fn every_case_file_matches_its_f64_answer() {
    let (failures, refused) = check_every_case(&gpu().await).await;
    assert!(
        failures.is_empty() && refused.is_empty(),
        "of {} case files, failed:\n{}\nrefused:\n{}",
        CASES.len(),
        failures.join("\n"),
        refused.join("\n")
    );
}

/// A device at WebGPU's default limits (8 storage buffers per stage, 128 MiB bindings, 16 KiB
/// of workgroup memory, 256 invocations) and no optional feature, as a page that asks for
/// nothing gets: every case file still passes or is refused by name, never wrong.
#[wasm_bindgen_test]
async fn every_case_file_runs_or_is_refused_at_webgpus_default_limits() {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = instance
        .request_adapter(&wgpu::RequestAdapterOptions::default())
        .await
        .expect("a WebGPU adapter");
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            required_limits: wgpu::Limits::default(),
            ..Default::default()
        })
        .await
        .expect("a device at the default limits");
    let gpu = Gpu::from_device(device, queue).expect("the default limits fit the engine");
    assert!(!gpu.has_subgroups() && !gpu.has_f16());
    let (failures, refused) = check_every_case(&gpu).await;
    assert!(
        failures.is_empty(),
        "of {} case files, failed:\n{}\n(refused by name:\n{})",
        CASES.len(),
        failures.join("\n"),
        refused.join("\n")
    );
}

/// Every source the crate can build (every kernel in every shape either adapter class picks)
/// compiles with the browser's own WGSL compiler (Tint), which holds WGSL's uniformity rules
/// more strictly than naga. Sources needing a feature the adapter lacks (`shader-f16` on
/// SwiftShader) are left out: the engine refuses them by name before compiling.
#[wasm_bindgen_test]
async fn every_built_shader_compiles_in_the_browser() {
    let gpu = gpu().await;
    let (mut compiled, mut failures) = (0, Vec::new());
    for (name, source) in
        wgpu_mha::kernels::catalog::all_sources().expect("every catalogued shape builds")
    {
        let needs_f16 = source.contains("enable f16;");
        if needs_f16 && !gpu.has_f16() || source.contains("subgroup") && !gpu.has_subgroups() {
            continue;
        }
        let scope = gpu.device().push_error_scope(wgpu::ErrorFilter::Validation);
        let _module = gpu
            .device()
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&name),
                source: wgpu::ShaderSource::Wgsl(gpu.directives(source).into()),
            });
        if let Some(e) = scope.pop().await {
            failures.push(format!("{name}: {e}"));
        }
        compiled += 1;
    }
    assert!(
        failures.is_empty(),
        "{} sources failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(compiled >= 200, "only {compiled} sources compiled");
}

/// `softmax(scale·q·kᵀ + bias)·v` in f64, `[B, H, L, D]` row-major, `H_kv` dividing `H`;
/// `bias(b, h, i, j)` is added to the scaled score (−∞ leaves the key out), and a query with
/// no key left is zeros, as torch gives.
fn sdpa_f64(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: impl Fn(usize, usize, usize, usize) -> f64,
) -> Vec<f64> {
    let [b, h, lq, d] = <[usize; 4]>::try_from(q.shape()).unwrap();
    let [_, hkv, lk, dv] = <[usize; 4]>::try_from(v.shape()).unwrap();
    let (q, k, v) = (q.data(), k.data(), v.data());
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; b * h * lq * dv];
    for bi in 0..b {
        for hi in 0..h {
            let kv = bi * hkv + hi / (h / hkv);
            for i in 0..lq {
                let row = &q[((bi * h + hi) * lq + i) * d..][..d];
                let scores: Vec<f64> = (0..lk)
                    .map(|j| {
                        let key = &k[(kv * lk + j) * d..][..d];
                        let dot: f64 = row
                            .iter()
                            .zip(key)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        scale * dot + bias(bi, hi, i, j)
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (j, w) in weights.iter().enumerate() {
                    for c in 0..dv {
                        out[((bi * h + hi) * lq + i) * dv + c] +=
                            w / total * v[(kv * lk + j) * dv + c] as f64;
                    }
                }
            }
        }
    }
    out
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(0.0, f64::max)
}

#[wasm_bindgen_test]
async fn sdpa_with_grouped_query_heads_matches_the_f64_reference() {
    let gpu = gpu().await;
    for (lq, lk, causal) in [(5, 9, true), (7, 7, false), (1, 12, false)] {
        let q = Tensor::random([2, 4, lq, 16], 1);
        let k = Tensor::random([2, 2, lk, 16], 2);
        let v = Tensor::random([2, 2, lk, 8], 3);
        // torch's is_causal: top-left, query i sees keys j <= i.
        let causal_bias = |_, _, i: usize, j: usize| {
            if causal && j > i {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        };
        let want = sdpa_f64(&q, &k, &v, causal_bias);
        let inputs = [&q, &k, &v].map(|t| (t.data().to_vec(), t.shape().to_vec()));
        let got = wgpu_mha_web::sdpa(&gpu, inputs, None, causal, None)
            .await
            .unwrap();
        assert_eq!(got.shape(), &[2, 4, lq, 8]);
        let err = max_err(got.data(), &want);
        assert!(
            err < 1e-5,
            "Lq={lq} Lk={lk} causal={causal}: max |err| {err:.3e}"
        );
    }
}

/// torch's mask polarities: a bool mask `[Lq, Lk]` (nonzero = attend) broadcast over batch and
/// heads, with one query left no key (zeros, as torch gives), and a float mask `[B, 1, Lq, Lk]`
/// added to the scores, −∞ included.
#[wasm_bindgen_test]
async fn sdpa_masks_have_torchs_polarities() {
    use wgpu_mha::MaskTensor;
    use wgpu_mha_web::SdpaMask;
    let gpu = gpu().await;
    let (lq, lk) = (4, 6);
    let q = Tensor::random([2, 2, lq, 8], 4);
    let k = Tensor::random([2, 2, lk, 8], 5);
    let v = Tensor::random([2, 2, lk, 8], 6);
    let inputs = || [&q, &k, &v].map(|t| (t.data().to_vec(), t.shape().to_vec()));
    // Query 2 sees nothing; the others every key but one or two.
    let attend = |i: usize, j: usize| i != 2 && !(i + j).is_multiple_of(5);
    let bools: Vec<u8> = (0..lq * lk).map(|n| attend(n / lk, n % lk) as u8).collect();
    let mask = SdpaMask::Bool(MaskTensor::new([1, 1, lq, lk], bools).unwrap());
    let masked = |i, j| if attend(i, j) { 0.0 } else { f64::NEG_INFINITY };
    let want = sdpa_f64(&q, &k, &v, |_, _, i, j| masked(i, j));
    let got = wgpu_mha_web::sdpa(&gpu, inputs(), Some(mask), false, None)
        .await
        .unwrap();
    let err = max_err(got.data(), &want);
    assert!(err < 1e-5, "bool mask: max |err| {err:.3e}");
    assert!(
        got.data()[2 * 8..3 * 8].iter().all(|x| *x == 0.0),
        "a query with no key is zeros"
    );

    let bias = |b: usize, i: usize, j: usize| match (b + i + j) % 4 {
        0 => f32::NEG_INFINITY,
        r => r as f32 * 0.7 - 1.0,
    };
    let floats: Vec<f32> = (0..2 * lq * lk)
        .map(|n| bias(n / (lq * lk), n / lk % lq, n % lk))
        .collect();
    let mask = SdpaMask::Float(Tensor::new([2, 1, lq, lk], floats).unwrap());
    let want = sdpa_f64(&q, &k, &v, |b, _, i, j| bias(b, i, j) as f64);
    let got = wgpu_mha_web::sdpa(&gpu, inputs(), Some(mask), false, None)
        .await
        .unwrap();
    let err = max_err(got.data(), &want);
    assert!(err < 1e-5, "float mask: max |err| {err:.3e}");
}

#[wasm_bindgen_test]
async fn a_decode_loop_matches_the_reference_of_the_whole_sequence() {
    let gpu = gpu().await;
    let config = AttentionConfig::classic(32, 4).unwrap();
    let weights = AttentionWeights::random(&config, 7);
    let mha = MultiHeadAttention::new(&gpu, config, &weights).unwrap();
    let (b, steps) = (2, 6);
    let x = Tensor::random([b, steps, 32], 11);
    let want = wgpu_mha::reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let mut cache = KvCache::new(&mha, b, steps).unwrap();
    for t in 0..steps {
        let token: Vec<f32> = (0..b)
            .flat_map(|bi| x.data()[(bi * steps + t) * 32..][..32].to_vec())
            .collect();
        let token = GpuTensor::upload(&gpu, &Tensor::new([b, 1, 32], token).unwrap()).unwrap();
        let out = mha.forward_step_gpu(&mut cache, &token).unwrap();
        let out = out.read_async(&gpu).await.unwrap();
        for bi in 0..b {
            let got = &out.data()[bi * 32..][..32];
            let row = &want.output[(bi * steps + t) * 32..][..32];
            let err = max_err(got, row);
            assert!(err < 1e-5, "step {t}, batch {bi}: max |err| {err:.3e}");
        }
    }
}

#[wasm_bindgen_test]
async fn what_cannot_run_in_a_browser_is_refused_by_name() {
    let gpu = gpu().await;
    let t = GpuTensor::upload(&gpu, &Tensor::random([2, 3], 0)).unwrap();
    // A blocking read would hang the page: refused, naming the async form.
    let e = t.read(&gpu).unwrap_err();
    assert!(e.to_string().contains("read_async"), "{e}");
    // Bad input is an error before anything runs, as natively.
    let bad = [
        (vec![0.0; 6], vec![1, 2, 3]),
        (vec![0.0; 4], vec![1, 1, 2, 2]),
        (vec![0.0; 4], vec![1, 1, 2, 2]),
    ];
    let e = wgpu_mha_web::sdpa(&gpu, bad, None, false, None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("[B, H, L, D]"), "{e}");
    // The device still works after both.
    let back = t.read_async(&gpu).await.unwrap();
    assert_eq!(back.data(), Tensor::random([2, 3], 0).data());
    // An empty tensor's read resolves too, once the kept error scopes have answered.
    let empty = GpuTensor::upload(&gpu, &Tensor::zeros([0, 4])).unwrap();
    assert_eq!(empty.read_async(&gpu).await.unwrap().shape(), &[0, 4]);
}

/// The JS API's Hugging Face layer (`Engine.load_hf_layer`, `HfLayer.forward`) on case files
/// transformers made: the checkpoint from the file's bytes and its `hf_config`, the layer by
/// number, its own mask rule, against the file's f64 answer and bound.
#[wasm_bindgen_test]
async fn the_js_hugging_face_layer_matches_transformers() {
    use wasm_bindgen::JsCast;
    let engine = wgpu_mha_web::Engine::create().await.unwrap();
    for file in [
        "hf/gemma_self_layer1_causal_mqa.safetensors",
        "hf/beit_self_layer1_relative_bias.safetensors",
        "hf/bart_decoder_self_layer1_causal.safetensors",
    ] {
        let (_, bytes) = CASES.iter().find(|(name, _)| *name == file).unwrap();
        let case = Case::from_bytes(file, bytes.to_vec()).unwrap();
        let layer = engine.load_hf_layer(bytes.to_vec(), None, 1).unwrap();
        let hidden = wgpu_mha::SafetensorsFile::from_bytes(file, bytes.to_vec())
            .unwrap()
            .tensor_f32("hidden_states")
            .unwrap();
        let x = js_sys::Float32Array::from(hidden.data());
        let promise = layer.forward(x, hidden.shape().to_vec(), false);
        let report = wasm_bindgen_futures::JsFuture::from(promise).await.unwrap();
        let output = js_sys::Reflect::get(&report, &"output".into()).unwrap();
        let output = output.dyn_into::<js_sys::Float32Array>().unwrap().to_vec();
        let err = case.max_abs_err(&output);
        assert!(
            err <= case.bound(),
            "{file}: max |err| {err:.3e} > {:.3e}",
            case.bound()
        );
    }
}
