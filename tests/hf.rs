//! Hugging Face attention modules as saved, checked against `transformers` itself: case files
//! and whole tiny models made by `tools/gen_hf_cases.py` (random-init models, float64 answers).
//! bert, distilbert, vit, gpt2, bart (self and cross), whisper, t5 (self with its relative
//! bias, in block 0 and a later block, and cross), and the RoPE families — llama (GQA, llama3
//! scaling, gapped positions, configs in both spellings), mistral (sliding window), qwen2,
//! gemma (MQA, head_dim ≠ E/H), phi3 (packed qkv), gpt_neox (per-head packed, partial
//! rotary), granite (attention_multiplier), starcoder2 (biases, window), gemma2 (soft-capped
//! scores, query_pre_attn_scalar; a windowed and a full layer), falcon (new-architecture GQA
//! and multi-query packings of query_key_value, rotary), mpt (ALiBi over 6 heads, clip_qkv,
//! softmax_scale), codegen (4-block qkv_proj), phi3 with longrope and llama with dynamic RoPE
//! (positions past the switch), deepseek_v2/v3 (multi-head latent attention), clip's text and
//! siglip's vision towers, xglm — and gpt_neo
//! (unscaled; a global and a local layer), all on both paths.

mod common;

use std::path::Path;

use common::hf_cases::{assert_run_matches_case, inspect_and_run};
use common::{cases_pass_on_both_paths, cli, file_name as name, fixtures};
use wgpu_mha::Case;

#[test]
fn hugging_face_modules_match_transformers_on_both_paths() {
    let files = fixtures("hf");
    let families: std::collections::BTreeSet<String> = files
        .iter()
        .map(|p| name(p).split('_').next().unwrap().to_string())
        .collect();
    assert_eq!(
        families.into_iter().collect::<Vec<_>>(),
        [
            "albert",
            "arcee",
            "bart",
            "beit",
            "bert",
            "bitnet",
            "bloom",
            "clip",
            "codegen",
            "cohere",
            "cohere2",
            "data2vec",
            "dbrx",
            "deepseek",
            "distilbert",
            "ernie4",
            "esm",
            "exaone4",
            "falcon",
            "gemma",
            "gemma2",
            "gemma3",
            "glm",
            "glm4",
            "gpt",
            "gpt2",
            "gptj",
            "granite",
            "granitemoe",
            "helium",
            "hunyuan",
            "jamba",
            "layoutlm",
            "llama",
            "llama4",
            "longt5",
            "megatron",
            "ministral",
            "mistral",
            "modernbert",
            "mpt",
            "musicgen",
            "nemotron",
            "nllb",
            "olmo",
            "olmo2",
            "olmo3",
            "olmoe",
            "persimmon",
            "phi",
            "phi3",
            "qwen2",
            "qwen3",
            "roformer",
            "seed",
            "sew",
            "siglip",
            "smollm3",
            "stablelm",
            "starcoder2",
            "t5",
            "umt5",
            "unispeech",
            "vit",
            "wavlm",
            "whisper",
            "xglm",
        ]
    );
    cases_pass_on_both_paths("hf");
}

#[test]
fn case_files_say_what_each_module_needs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf");
    for (file, phrases) in [
        (
            "llama_self_layer1_causal_padding_gqa_llama3",
            &["+rope", "kv_heads=2", "causal"][..],
        ),
        (
            "mistral_self_layer1_causal_padding_window3",
            &["+rope", "window=3"],
        ),
        (
            "gemma_self_layer1_causal_mqa",
            &["kv_heads=1", "head_dim=12"],
        ),
        (
            "gpt_neo_self_layer1_causal_padding_local",
            &["hf gpt_neo", "window=3", "scale=1 "],
        ),
        (
            "gpt_neo_self_layer0_causal_padding_global",
            &["hf gpt_neo", "scale=1 "],
        ),
        (
            "gemma2_self_layer0_causal_padding_window3_softcap",
            &["window=3", "softcap=1", "scale=0.408"],
        ),
        (
            "gemma2_self_layer1_causal_padding_softcap",
            &["softcap=1", "scale=0.408"],
        ),
        (
            "granite_self_layer1_causal_padding_multiplier",
            &["+rope", "scale=0.3"],
        ),
        (
            "starcoder2_self_layer1_causal_padding_window3",
            &["+rope", "window=3", "kv_heads=2"],
        ),
        (
            "qwen3_self_layer1_causal_padding_qknorm",
            &["+rope", "kv_heads=2", "qk_norm"],
        ),
        (
            "olmo2_self_layer1_causal_padding_qknorm_whole",
            &["+rope", "qk_norm=Rms/Whole"],
        ),
        (
            "cohere_self_layer1_causal_padding_interleaved_qknorm",
            &["+rope", "qk_norm=Layer/PerHead"],
        ),
        (
            "gemma3_self_layer0_causal_padding_window3_qknorm",
            &["+rope", "window=3", "qk_norm=Rms/PerHead", "scale=0.408"],
        ),
        (
            "gemma3_self_layer1_causal_padding_full_qknorm",
            &["+rope", "qk_norm=Rms/PerHead", "scale=0.408"],
        ),
        (
            "gpt_oss_self_layer0_causal_padding_window3_sinks_yarn",
            &["+rope", "window=3", "+sinks", "kv_heads=2"],
        ),
        (
            "gpt_oss_self_layer1_causal_padding_full_sinks_yarn",
            &["+rope", "+sinks"],
        ),
        (
            "gptj_self_layer1_causal_padding_interleaved_partial",
            &["+rope", "causal"],
        ),
        ("roformer_self_layer1_padding_interleaved", &["+rope"]),
        (
            "codegen_self_layer1_causal_padding_interleaved_partial",
            &["hf codegen", "+rope", "causal"],
        ),
        (
            "phi3_self_layer1_causal_padding_longrope",
            &["+rope", "kv_heads=2", "causal"],
        ),
        (
            "llama_self_layer1_causal_padding_dynamic",
            &["+rope", "kv_heads=2", "causal"],
        ),
        (
            "olmo_self_layer1_causal_padding_clip_qkv",
            &["+rope", "clip_qkv=0.5"],
        ),
        (
            "phi_self_layer1_causal_padding_partial",
            &["+rope", "kv_heads=2", "causal"],
        ),
        ("albert_self_layer0_padding_shared", &["hf albert"]),
        (
            "gpt_bigcode_self_layer1_causal_padding_mqa",
            &["kv_heads=1", "causal"],
        ),
        ("gpt_bigcode_self_layer1_causal_padding_mha", &["causal"]),
        (
            "bloom_self_layer1_causal_padding_alibi",
            &["+alibi", "causal"],
        ),
        (
            "falcon_self_layer1_causal_padding_gqa_newarch",
            &["hf falcon", "+rope", "kv_heads=2", "causal"],
        ),
        (
            "falcon_self_layer1_causal_padding_mqa",
            &["+rope", "kv_heads=1", "causal"],
        ),
        (
            "mpt_self_layer1_causal_padding_alibi6_clip_scale",
            &["heads=6", "scale=0.5", "clip_qkv=0.8", "+alibi", "causal"],
        ),
        (
            "stablelm_self_layer1_causal_padding_partial_qknorm",
            &["+rope", "qk_norm=Layer/PerHead"],
        ),
        (
            "t5_encoder_self_block1_padding",
            &["+relative bias", "scale=1"],
        ),
    ] {
        let case = Case::from_file(root.join(format!("{file}.safetensors"))).expect("case");
        let text = case.describe();
        for phrase in phrases {
            assert!(text.contains(phrase), "{file}: `{text}` lacks `{phrase}`");
        }
    }
    // Gapped positions are the file's, not 0..L.
    let llama =
        Case::from_file(root.join("llama_self_layer1_causal_padding_gqa_llama3.safetensors"))
            .expect("case");
    let positions = llama.positions.as_ref().expect("position_ids");
    assert!(
        positions.windows(2).any(|w| w[1] > w[0] + 1),
        "{positions:?}"
    );
}

/// `run --hf DIR --layer N` (or `--prefix`) on a whole saved model, with a case's inputs: the
/// case files were cut from these same models, so their `out_f64` is the answer.
#[test]
fn run_hf_on_saved_models_matches_transformers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = std::env::temp_dir().join(format!("wgpu-mha-hf-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (model, select, case) in [
        ("bert", ["--layer", "1"], "bert_self_layer1_padding"),
        ("gpt2", ["--layer", "1"], "gpt2_self_layer1_causal_padding"),
        (
            "t5",
            ["--prefix", "encoder.block.1.layer.0.SelfAttention."],
            "t5_encoder_self_block1_padding",
        ),
        (
            "t5",
            ["--prefix", "decoder.block.1.layer.1.EncDecAttention."],
            "t5_decoder_cross_block1_padding",
        ),
    ] {
        let case_path = root.join("hf").join(format!("{case}.safetensors"));
        let out = dir.join(format!("{case}.out.safetensors"));
        let model_dir = root.join("hf_models").join(model);
        let mut args = vec![
            "run",
            "--hf",
            model_dir.to_str().unwrap(),
            "--inputs",
            case_path.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(select);
        let (code, text) = cli(&args);
        assert_eq!(code, 0, "{case}: {text}");
        assert_run_matches_case(&out, &case_path);
    }
    // A layer with several modules (t5 block 1: self and cross) needs --prefix, and says which.
    let t5 = root.join("hf_models/t5");
    let inputs = root.join("hf/t5_encoder_self_block1_padding.safetensors");
    let out = dir.join("never.safetensors");
    let (code, text) = cli(&[
        "run",
        "--hf",
        t5.to_str().unwrap(),
        "--layer",
        "1",
        "--inputs",
        inputs.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("--prefix") && text.contains("EncDecAttention"),
        "{text}"
    );
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn inspect_lists_every_module_with_what_it_needs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let (code, text) = cli(&["inspect", root.join("hf_models/t5").to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    for phrase in [
        "model_type t5",
        "encoder.block.0.layer.0.SelfAttention.  self  E=32 heads=4 head_dim=6 scale=1 \
         relative_bias(buckets=8, max_distance=20, bidirectional)  runs",
        "decoder.block.1.layer.0.SelfAttention.  self causal",
        "one-way",
        "decoder.block.1.layer.1.EncDecAttention.  cross",
    ] {
        assert!(
            text.contains(phrase),
            "inspect output lacks `{phrase}`:\n{text}"
        );
    }
    // 2 encoder self, 2 decoder self, 2 decoder cross.
    assert_eq!(text.matches("  runs").count(), 6, "{text}");
    let llama = root.join("hf/llama_self_layer1_causal_padding_gqa_llama3.safetensors");
    let (code, text) = cli(&["inspect", llama.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    for phrase in ["llama3×8", "kv_heads=2", "rotary_dims=8", "runs"] {
        assert!(
            text.contains(phrase),
            "inspect output lacks `{phrase}`:\n{text}"
        );
    }
}

/// transformers 5.25's llama-like families (issue 38): `run --hf` on each case file as a
/// one-file checkpoint (its `hf_config` metadata is the config) gives transformers' answer,
/// and `inspect` names what each layer is — its window, its RoPE (or none: NoPE), its norms.
#[test]
fn run_hf_and_inspect_read_the_round2_families() {
    for (case, phrases) in [
        (
            "qwen2_moe_self_layer0_causal_padding_window3_bias",
            &["model_type qwen2_moe", "window=3", "kv_heads=2"][..],
        ),
        (
            "qwen3_moe_self_layer1_causal_padding_window3_qknorm",
            &["window=3", "qk_norm(Rms PerHead"],
        ),
        (
            "olmoe_self_layer1_causal_padding_qknorm_whole",
            &["qk_norm(Rms Whole"],
        ),
        (
            "granitemoe_self_layer1_causal_padding_multiplier_bias",
            &["scale=0.3"],
        ),
        (
            "helium_self_layer1_causal_padding_interleaved_bias",
            &["θ=100000", "interleaved"],
        ),
        (
            "arcee_self_layer1_causal_padding",
            &["model_type arcee", "rope(θ=10000"],
        ),
        (
            "ministral_self_layer0_causal_padding_window3",
            &["window=3"],
        ),
        (
            "seed_oss_self_layer1_causal_padding_qkv_bias",
            &["model_type seed_oss", "rope("],
        ),
        (
            "ernie4_5_self_layer1_causal_padding_interleaved_bias",
            &["θ=500000", "interleaved"],
        ),
        (
            "exaone4_self_layer0_causal_padding_window3_qknorm",
            &["window=3", "rope(", "qk_norm(Rms PerHead"],
        ),
        (
            "exaone4_self_layer1_causal_padding_nope_qknorm",
            &[" nope", "qk_norm(Rms PerHead"],
        ),
        (
            "hunyuan_v1_dense_self_layer1_causal_padding_qknorm_after_rope",
            &["after rope"],
        ),
        (
            "olmo3_self_layer0_causal_padding_window3_qknorm_whole",
            &["window=3", "θ=10000,", "qk_norm(Rms Whole"],
        ),
        (
            "olmo3_self_layer1_causal_padding_full_qknorm_whole",
            &["θ=1000,"],
        ),
        (
            "cohere2_self_layer0_causal_padding_window3_interleaved",
            &["window=3", "interleaved"],
        ),
        ("cohere2_self_layer1_causal_padding_nope", &[" nope"]),
        (
            "smollm3_self_layer0_causal_padding_rope",
            &["model_type smollm3", "rope(θ=2000000"],
        ),
        (
            "smollm3_self_layer1_causal_padding_nope_window3",
            &[" nope", "window=3"],
        ),
        (
            "glm_self_layer1_causal_padding_interleaved_partial_bias",
            &["model_type glm", "rotary_dims=4", "interleaved"],
        ),
        (
            "glm4_self_layer1_causal_padding_interleaved_partial_bias",
            &["model_type glm4", "rotary_dims=4", "interleaved"],
        ),
        (
            "nemotron_self_layer1_causal_padding_partial_bias",
            &["model_type nemotron", "rotary_dims=4"],
        ),
        (
            "modernbert_self_layer0_padding_global",
            &["model_type modernbert", "θ=20000,"],
        ),
        (
            "modernbert_self_layer1_padding_local2_4x",
            &["θ=500,", "window=±2"],
        ),
        (
            "persimmon_self_layer1_causal_padding_qk_layernorm_bias",
            &[
                "model_type persimmon",
                "qk_norm(Layer PerHead",
                "bias",
                "rotary_dims=4",
            ],
        ),
        (
            "llama4_text_self_layer0_causal_padding_chunked4_qknorm",
            &[
                "model_type llama4_text",
                "chunked=4",
                "interleaved",
                "qk_norm(Rms PerHead, eps=0.00001, after rope)",
            ],
        ),
        (
            "llama4_text_self_layer1_causal_padding_nope_temperature",
            &[" nope", "temperature(floor_scale=2, attn_scale=0.5)"],
        ),
        (
            "dbrx_self_layer1_causal_padding_clip_gqa",
            &[
                "model_type dbrx",
                "clip_qkv=0.3",
                "kv_heads=2",
                "rope(θ=10000",
            ],
        ),
        (
            "jamba_self_layer1_causal_padding_nope",
            &["model_type jamba", " nope", "kv_heads=2"],
        ),
        (
            "qwen3_next_self_layer1_causal_padding_gated",
            &[
                "model_type qwen3_next",
                "output_gate(sigmoid)",
                "rotary_dims=4",
            ],
        ),
        (
            "bitnet_self_layer1_causal_padding_sub_norm",
            &[
                "model_type bitnet",
                "output_norm(Rms, eps=0.00001)",
                "θ=500000",
            ],
        ),
    ] {
        inspect_and_run(case, phrases);
    }
}
