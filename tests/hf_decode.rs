//! Decoding equals transformers for every decoder family: each causal self-attention case file
//! of `tests/fixtures/hf` is decoded through the module's `HfDecoder` (a `KvCache` whose steps
//! take the module's own mask: causal, its sliding window, T5's relative bias) — a prefill of
//! all but the last two real tokens of each sequence, then one token at a time, with the
//! file's RoPE positions, on the fused and the multi-pass path — and every decoded row is compared
//! with transformers' float64 answer for that token (right padding: a real token sees only
//! real keys), within the case's bound.

mod common;

use common::hf_cases::{assert_every_family_in, case_module, hf_case};
use common::{
    assert_close, assert_steps_match_causal_forward, assert_within, file_name, fixtures, gpu,
    BOTH_PATHS,
};
use wgpu_mha::attention::mla_stage::MlaStage;
use wgpu_mha::{Error, ForwardOptions, KvCache, Mask, MultiHeadAttention, StepOptions, Tensor};

#[test]
fn every_decoder_family_decodes_as_transformers_answers() {
    let mut decoded = Vec::new();
    for path in fixtures("hf") {
        let (file, module) = case_module(&path);
        let self_causal =
            file.metadata("causal") == Some("true") && file.metadata("attention") == Some("self");
        if !self_causal {
            continue;
        }
        let name = file_name(&path);
        if name.contains("_dynamic.") {
            continue; // refused past max_position_embeddings: see the test below
        }
        let x = file.tensor_f32("hidden_states").expect("hidden_states");
        let [b, l, e] = x.shape()[..] else {
            panic!("{name}: hidden_states rank")
        };
        let (_, want) = file.tensor_f64("out_f64").expect("out_f64");
        let lengths: Vec<usize> = match file.contains("attention_mask") {
            true => {
                let m = file.mask_tensor("attention_mask").expect("mask");
                (0..b)
                    .map(|bi| {
                        m.data()[bi * l..(bi + 1) * l]
                            .iter()
                            .filter(|&&v| v != 0)
                            .count()
                    })
                    .collect()
            }
            false => vec![l; b],
        };
        let positions = file
            .contains("position_ids")
            .then(|| file.tensor_indices("position_ids").expect("position_ids").1);
        let bound = file
            .metadata("err_f32_vs_f64")
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(1e-4, |err| (10.0 * err).max(1e-5));
        let out = module.config.output_dim();
        let runs = lengths
            .iter()
            .enumerate()
            .flat_map(|s| BOTH_PATHS.map(move |p| (s, p)));
        for ((bi, &len), path) in runs {
            let mut decoder = module.decoder_on(gpu(), 1, len, path).expect("decoder");
            let mut at = 0;
            for n in [len.saturating_sub(2), 1, 1].into_iter().filter(|&n| n > 0) {
                let rows = x.data()[(bi * l + at) * e..(bi * l + at + n) * e].to_vec();
                let step_x = Tensor::new([1, n, e], rows).expect("rows");
                let pos: Option<Vec<usize>> = positions
                    .as_ref()
                    .map(|p| p[bi * l + at..bi * l + at + n].to_vec());
                let got = decoder
                    .step(&step_x, pos.as_deref())
                    .unwrap_or_else(|err| panic!("{name} ({path:?}): step at {at}: {err}"));
                let expected = &want[(bi * l + at) * out..(bi * l + at + n) * out];
                let label = format!("{name} ({path:?}): sequence {bi}, step at {at} (+{n})");
                assert_within(&label, got.data(), expected, bound);
                at += n;
            }
        }
        decoded.push(name);
    }
    // The decoder families, each at least once.
    assert_every_family_in(
        &decoded,
        &[
            "gpt2",
            "gpt_neo",
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "gemma",
            "gemma2",
            "gemma3",
            "granite",
            "starcoder2",
            "phi3",
            "phi_",
            "gpt_neox",
            "olmo2",
            "cohere",
            "stablelm",
            "gpt_oss",
            "bloom",
            "falcon",
            "mpt",
            "gptj",
            "codegen",
            "gpt_bigcode",
            "t5_decoder_self",
            "deepseek_v2",
            "deepseek_v3",
            "clip_text",
            "xglm",
            "qwen2_moe",
            "qwen3_moe",
            "olmoe",
            "granitemoe",
            "helium",
            "arcee",
            "ministral",
            "seed_oss",
            "ernie4_5",
            "exaone4_self_layer0",
            "exaone4_self_layer1",
            "hunyuan_v1_dense",
            "olmo3_self_layer0",
            "olmo3_self_layer1",
            "cohere2_self_layer0",
            "cohere2_self_layer1",
            "smollm3_self_layer0",
            "smollm3_self_layer1",
            "glm_self",
            "glm4_self",
            "nemotron_self",
            "persimmon_self",
            "musicgen_decoder_self",
            "nllb_moe_decoder_self",
            "umt5_decoder_self",
            "longt5_decoder_self",
            "llama4_text_self_layer0",
            "llama4_text_self_layer1",
            "dbrx",
            "jamba",
            "qwen3_next",
            "bitnet",
        ],
        "decoded",
    );
}

/// Dynamic NTK RoPE: within max_position_embeddings (4 here) the frequencies are the plain
/// ones and decoding equals the full forward; a step past it is refused by name, since
/// transformers then rotates by the longest sequence its rotary module has seen in any call
/// while the cached keys keep their earlier rotation (the full forward past it is checked
/// against transformers in tests/hf.rs).
#[test]
fn dynamic_rope_decodes_within_its_max_and_is_refused_past_it() {
    let (file, module) = case_module(&hf_case("llama_self_layer1_causal_padding_dynamic"));
    let x = file.tensor_f32("hidden_states").expect("hidden_states");
    let e = x.shape()[2];
    let first = Tensor::new([1, 4, e], x.data()[..4 * e].to_vec()).expect("rows");
    assert_steps_match_causal_forward(
        "dynamic within max",
        module.config,
        &module.weights,
        &first,
        &[2, 1, 1],
    );
    let mut decoder = module.decoder(gpu(), 1, 7).expect("decoder");
    decoder
        .step(&first, Some(&[0, 1, 2, 3]))
        .expect("positions 0..3");
    let next = Tensor::new([1, 1, e], x.data()[4 * e..5 * e].to_vec()).expect("row");
    match decoder.step(&next, Some(&[4])) {
        Err(err @ Error::UnsupportedModule { .. }) => {
            let text = err.to_string();
            for phrase in [
                "dynamic",
                "KvCache step at position 4",
                "max_position_embeddings",
            ] {
                assert!(text.contains(phrase), "`{text}` lacks `{phrase}`");
            }
        }
        other => panic!("a dynamic RoPE step past its max: {other:?}"),
    }
}

/// An encoder's self-attention (T5's, with its bidirectional relative bias; BERT's) sees the
/// tokens after each one, so stepping it through a cache would answer each step with rows
/// the module never gives: `decoder()` refuses it, naming the module and why, as it refuses
/// a cross-attention.
#[test]
fn a_decoder_over_an_encoder_or_cross_attention_is_refused() {
    let mut refused = Vec::new();
    for path in fixtures("hf") {
        let (file, module) = case_module(&path);
        if file.metadata("causal") == Some("true") && file.metadata("attention") == Some("self") {
            continue;
        }
        let prefix = module.prefix.clone();
        let name = file_name(&path);
        match module.decoder(gpu(), 1, 8) {
            Err(Error::Misuse(m)) => {
                let why = match module.cross {
                    true => "cross-attention",
                    false => "bidirectional (encoder) self-attention",
                };
                assert!(m.contains(&prefix) && m.contains(why), "{name}: {m}");
            }
            Err(other) => panic!("{name}: a decoder over `{prefix}`: {other}"),
            Ok(_) => panic!("{name}: a decoder over `{prefix}` was made"),
        }
        refused.push(name);
    }
    for case in ["t5_encoder_self", "t5_decoder_cross", "bert"] {
        assert!(
            refused.iter().any(|n| n.starts_with(case)),
            "no refused case {case}: {refused:?}"
        );
    }
}

/// DeepSeek's multi-head latent attention decodes through a latent cache: per token it holds
/// the shared RoPE key and the normalised latent (`qk_rope_head_dim + kv_lora_rank` f32, no
/// separate values), far less than the per-head keys and values transformers expands them to,
/// and decoding token by token, on the fused and the multi-pass path, equals the module's
/// causal forward over the whole sequences (both sequences of each case, padding included:
/// right padding comes after every real token).
#[test]
fn mla_caches_only_the_latent_and_decodes_as_its_causal_forward() {
    let mut seen = Vec::new();
    for path in fixtures("hf") {
        let name = file_name(&path);
        if !name.starts_with("deepseek") {
            continue;
        }
        let (file, module) = case_module(&path);
        let dims = *module.mla.as_ref().expect("an MLA module").dims();
        let x = file.tensor_f32("hidden_states").expect("hidden_states");
        let [b, l, e] = x.shape()[..] else {
            panic!("{name}: hidden_states rank")
        };
        let positions = file.tensor_indices("position_ids").expect("position_ids").1;
        let (q, kv) = module.inputs(&x).expect("MLA inputs");
        // The device's pre-stage (the decoder's) gives the host's inputs.
        let stage = MlaStage::new(gpu(), module.mla.as_ref().unwrap());
        let (q_gpu, kv_gpu) = stage.of(&x).expect("MLA pre-stage");
        for (what, gpu_t, host) in [("query", &q_gpu, &q), ("latent", &kv_gpu, &kv)] {
            assert_eq!(gpu_t.shape(), host.shape(), "{name}: {what}");
            let want: Vec<f64> = host.data().iter().map(|v| *v as f64).collect();
            assert_close(
                &format!("{name}: {what} on the device"),
                gpu_t.data(),
                &want,
            );
        }
        let mha = MultiHeadAttention::new(gpu(), module.config, &module.weights).expect("module");
        let options = ForwardOptions {
            positions: Some(positions.clone()),
            ..Default::default()
        };
        let full = mha
            .forward_with(&q, &kv, &kv, &Mask::Causal, &options)
            .expect("forward")
            .output;
        let out = module.config.output_dim();
        assert_eq!(out, e, "{name}: the output is hidden_size wide");
        for p in BOTH_PATHS {
            let mut decoder = module.decoder_on(gpu(), b, l, p).expect("decoder");
            let mut at = 0;
            for n in [3, 1, 1, 1, 1] {
                let take = |data: &[f32], w: usize| -> Vec<f32> {
                    (0..b)
                        .flat_map(|bi| data[(bi * l + at) * w..(bi * l + at + n) * w].to_vec())
                        .collect()
                };
                let step_x = Tensor::new([b, n, e], take(x.data(), e)).expect("rows");
                let pos: Vec<usize> = (0..b)
                    .flat_map(|bi| positions[bi * l + at..bi * l + at + n].to_vec())
                    .collect();
                let got = decoder
                    .step(&step_x, Some(&pos))
                    .unwrap_or_else(|err| panic!("{name} {p:?}: step at {at}: {err}"));
                let want: Vec<f64> = take(full.data(), out).iter().map(|v| *v as f64).collect();
                assert_close(&format!("{name} {p:?}: step at {at}"), got.data(), &want);
                at += n;
            }
            let bytes = decoder.bytes();
            let latent = 4 * (dims.kv_lora_rank + dims.qk_rope_head_dim) as u64;
            let mha_bytes = 4 * (dims.heads * (dims.qk_head_dim() + dims.v_head_dim)) as u64;
            assert_eq!(bytes.cache.per_token, latent, "{name} {p:?}: {bytes:?}");
            assert_eq!(
                bytes.cache.keys_values,
                latent * (b * l) as u64,
                "{name} {p:?}"
            );
            assert_eq!(bytes.mha_per_token, mha_bytes, "{name} {p:?}");
            assert!(
                bytes.cache.per_token < bytes.mha_per_token,
                "{name}: {bytes:?}"
            );
        }
        // A chunked latent cache (what a cache past one storage binding becomes): its value
        // chunks are its key chunks.
        let mut cache = KvCache::chunked(&mha, b, l, 1).expect("chunked cache");
        let mut at = 0;
        for n in [3, 1, 1, 1, 1] {
            let take = |t: &Tensor| -> Tensor {
                let w = t.shape()[2];
                let rows = (0..b)
                    .flat_map(|bi| t.data()[(bi * l + at) * w..(bi * l + at + n) * w].to_vec())
                    .collect();
                Tensor::new([b, n, w], rows).expect("rows")
            };
            let pos: Vec<usize> = (0..b)
                .flat_map(|bi| positions[bi * l + at..bi * l + at + n].to_vec())
                .collect();
            let step_kv = take(&kv);
            let options = StepOptions {
                x_k_v: Some(&step_kv),
                positions: Some(&pos),
                ..Default::default()
            };
            let got = mha
                .forward_step_with(&mut cache, &take(&q), &options)
                .unwrap_or_else(|err| panic!("{name} chunked: step at {at}: {err}"));
            let want: Vec<f64> = take(&full).data().iter().map(|v| *v as f64).collect();
            assert_close(&format!("{name} chunked: step at {at}"), got.data(), &want);
            at += n;
        }
        let latent = 4 * (dims.kv_lora_rank + dims.qk_rope_head_dim) as u64;
        assert_eq!(cache.bytes().per_token, latent, "{name} chunked");
        seen.push(name);
    }
    assert!(
        seen.iter().any(|n| n.starts_with("deepseek_v2")),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|n| n.starts_with("deepseek_v3")),
        "{seen:?}"
    );
}
