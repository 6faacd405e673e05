//! No module runs as another model: every family takes only the `model_type`s known to compute
//! what the loader computes, config keys that would change the answer are refused by name, and
//! multimodal configs give each tower its own settings. The checkpoints are built here from
//! seeded tensors under each model's saved names; the models that used to run silently wrong
//! (GPT-J under bart's names, RoFormer under bert's, BLOOM and Falcon under gpt_neox's, Qwen3
//! and Gemma3 under llama's) each have a case; GPT-Neo, Gemma2 and Falcon (but its `alibi`,
//! refused here), which did too, now run as themselves (their transformers cases are
//! `tests/fixtures/hf/gpt_neo_*`, `gemma2_*` and `falcon_*`).

mod common;

use std::path::{Path, PathBuf};

use common::{assert_close, cli, gpu};
use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::io::safetensors::write_safetensors;
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{reference, Error, MultiHeadAttention, Result, Tensor};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("wgpu-mha-mt-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// `name.weight [out, in]` (and `name.bias [out]` when `bias`) under `prefix`.
fn linear(
    prefix: &str,
    name: &str,
    out: usize,
    inp: usize,
    bias: bool,
) -> Vec<(String, Vec<usize>)> {
    let mut t = vec![(format!("{prefix}{name}.weight"), vec![out, inp])];
    if bias {
        t.push((format!("{prefix}{name}.bias"), vec![out]));
    }
    t
}

/// Four projections `names` of an E-wide module under `prefix` (k and v with `kv` outputs).
fn projections(
    prefix: &str,
    names: [&str; 4],
    e: usize,
    kv: usize,
    bias: bool,
) -> Vec<(String, Vec<usize>)> {
    let [q, k, v, o] = names;
    [(q, e), (k, kv), (v, kv), (o, e)]
        .into_iter()
        .flat_map(|(n, out)| linear(prefix, n, out, e, bias))
        .collect()
}

/// A model directory: `config.json` and the tensors (seeded) in `model.safetensors`.
fn model_dir(tag: &str, config: &str, specs: &[(String, Vec<usize>)]) -> TempDir {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let tensors: Vec<(String, Tensor)> = specs
        .iter()
        .enumerate()
        .map(|(i, (n, s))| (n.clone(), Tensor::random(s.clone(), 11 + i as u64)))
        .collect();
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    write_safetensors(dir.path().join("model.safetensors"), &refs, None).unwrap();
    dir
}

const E: usize = 16;

/// `(prefix, tensors)` of one layer in each layout, E = 16 with 4 heads of 4.
fn layout(which: &str) -> (&'static str, Vec<(String, Vec<usize>)>) {
    match which {
        "bert" => {
            let p = "encoder.layer.0.attention.";
            let mut t = projections(
                p,
                ["self.query", "self.key", "self.value", "output.dense"],
                E,
                E,
                true,
            );
            t.extend(linear("", "embeddings.word_embeddings", 8, E, false));
            (p, t)
        }
        "bart" => {
            let p = "model.encoder.layers.0.self_attn.";
            (
                p,
                projections(p, ["q_proj", "k_proj", "v_proj", "out_proj"], E, E, true),
            )
        }
        "gptj" => {
            let p = "transformer.h.0.attn.";
            (
                p,
                projections(p, ["q_proj", "k_proj", "v_proj", "out_proj"], E, E, false),
            )
        }
        "gpt_neo" => {
            let p = "transformer.h.0.attn.attention.";
            let mut t = projections(p, ["q_proj", "k_proj", "v_proj", "out_proj"], E, E, false);
            t.push((format!("{p}out_proj.bias"), vec![E]));
            (p, t)
        }
        "roformer" => {
            let p = "roformer.encoder.layer.0.attention.";
            let t = projections(
                p,
                ["self.query", "self.key", "self.value", "output.dense"],
                E,
                E,
                true,
            );
            (p, t)
        }
        "llama" => {
            let p = "model.layers.0.self_attn.";
            (
                p,
                projections(p, ["q_proj", "k_proj", "v_proj", "o_proj"], E, 8, false),
            )
        }
        "gpt_neox" => {
            let p = "gpt_neox.layers.0.attention.";
            let mut t = linear(p, "query_key_value", 3 * E, E, true);
            t.extend(linear(p, "dense", E, E, true));
            (p, t)
        }
        "bloom" => {
            let p = "h.0.self_attention.";
            let mut t = linear(p, "query_key_value", 3 * E, E, true);
            t.extend(linear(p, "dense", E, E, true));
            (p, t)
        }
        "falcon" => {
            // Multi-query: 4 query heads of 4, one key and one value head.
            let p = "transformer.h.0.self_attention.";
            let mut t = linear(p, "query_key_value", E + 8, E, false);
            t.extend(linear(p, "dense", E, E, false));
            (p, t)
        }
        other => panic!("no layout {other}"),
    }
}

/// The module under `prefix` of a model directory of `specs` with `config`.
fn load(
    tag: &str,
    config: &str,
    specs: &[(String, Vec<usize>)],
    prefix: &str,
) -> Result<HfAttention> {
    let dir = model_dir(tag, config, specs);
    HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(prefix, None)
}

/// `layout`'s module loaded under `config`.
fn load_layout(tag: &str, which: &str, config: &str) -> Result<HfAttention> {
    let (prefix, specs) = layout(which);
    load(tag, config, &specs, prefix)
}

/// The load of `layout`'s module under `config`: its error, which must be UnsupportedModule.
fn refusal(tag: &str, which: &str, config: &str) -> String {
    match load_layout(tag, which, config) {
        Err(e @ Error::UnsupportedModule { .. }) => e.to_string(),
        Err(e) => panic!("{tag}: expected UnsupportedModule, got `{e}`"),
        Ok(m) => panic!("{tag}: loaded as {:?} ({})", m.family, m.prefix),
    }
}

#[test]
fn models_that_ran_as_another_family_are_refused_by_model_type() {
    // (model type, the layout its tensors look like, config, what the message must say)
    let cases: [(&str, &str, &str, &[&str]); 6] = [
        (
            "codegen",
            "gptj",
            r#"{"model_type": "codegen", "n_head": 4, "n_embd": 16, "rotary_dim": 4}"#,
            &["\"codegen\"", "qkv_proj"],
        ),
        (
            "big_bird",
            "roformer",
            r#"{"model_type": "big_bird", "num_attention_heads": 4, "hidden_size": 16}"#,
            &["\"big_bird\"", "block-sparse"],
        ),
        (
            "gpt_neox_japanese",
            "bloom",
            r#"{"model_type": "gpt_neox_japanese", "num_attention_heads": 4, "hidden_size": 16}"#,
            &["\"gpt_neox_japanese\"", "rotary"],
        ),
        (
            "falcon",
            "falcon",
            r#"{"model_type": "falcon", "num_attention_heads": 4, "hidden_size": 16,
                "multi_query": true, "alibi": true, "new_decoder_architecture": false}"#,
            &["`alibi` = true", "bfloat16", "√head_dim"],
        ),
        (
            // OLMoE clamps after its q/k norms; the loader's clamp comes before them.
            "olmoe",
            "llama",
            r#"{"model_type": "olmoe", "num_attention_heads": 4, "num_key_value_heads": 2,
                "clip_qkv": 8.0}"#,
            &["`clip_qkv` = 8.0"],
        ),
        (
            "deepseek_v2",
            "llama",
            r#"{"model_type": "deepseek_v2", "num_attention_heads": 4, "num_key_value_heads": 2}"#,
            // MLA runs under its own tensor names, never llama's.
            &["\"deepseek_v2\"", "mla attention tensors, not llama"],
        ),
    ];
    for (tag, which, config, says) in cases {
        let text = refusal(tag, which, config);
        for phrase in says {
            assert!(text.contains(phrase), "{tag}: `{text}` lacks `{phrase}`");
        }
    }
    // A model type of another family's names, and one nobody knows, are refused too.
    let text = refusal(
        "t5asbart",
        "bart",
        r#"{"model_type": "t5", "num_heads": 4}"#,
    );
    assert!(text.contains("t5 attention tensors, not bart"), "{text}");
    let text = refusal(
        "unknown",
        "bart",
        r#"{"model_type": "nosuch", "num_attention_heads": 4}"#,
    );
    assert!(
        text.contains("\"nosuch\"") && text.contains("whisper"),
        "{text}"
    );
}

#[test]
fn without_model_type_only_unambiguous_names_load() {
    // bart's names are GPT-J's and GPT-Neo's too: no model_type, no run.
    for (which, says) in [
        ("bart", "GPT-J"),
        ("gptj", "GPT-J"),
        ("bert", "RoFormer"),
        ("gpt_neox", "BLOOM"),
    ] {
        let text = refusal(
            &format!("bare{which}"),
            which,
            r#"{"num_attention_heads": 4}"#,
        );
        assert!(
            text.contains("without `model_type`") && text.contains(says),
            "{which}: {text}"
        );
    }
}

#[test]
fn keys_that_change_the_answer_are_refused_by_name() {
    // (layout, model type, the setting, the name the error must carry)
    let cases: [(&str, &str, &str, &str); 16] = [
        (
            "bert",
            "bert",
            r#""position_embedding_type": "relative_key""#,
            "position_embedding_type",
        ),
        (
            "bert",
            "roberta",
            r#""position_embedding_type": "rotary""#,
            "position_embedding_type",
        ),
        (
            "bart",
            "bart",
            r#""attention_types": [[["global", "local"], 1]]"#,
            "attention_types",
        ),
        ("llama", "llama", r#""rotary_dim": 4"#, "rotary_dim"),
        ("llama", "llama", r#""use_qk_norm": true"#, "use_qk_norm"),
        (
            "llama",
            "mistral",
            r#""qk_layernorm": true"#,
            "qk_layernorm",
        ),
        (
            "llama",
            "gemma",
            r#""attn_logit_softcapping": 30.0"#,
            "attn_logit_softcapping",
        ),
        ("llama", "llama", r#""clip_qkv": 8.0"#, "clip_qkv"),
        (
            "llama",
            "llama",
            r#""attention_multiplier": 0.1"#,
            "attention_multiplier",
        ),
        ("gpt_neox", "gpt_neox", r#""alibi": true"#, "alibi"),
        (
            "llama",
            "gemma",
            r#""query_pre_attn_scalar": 64"#,
            "query_pre_attn_scalar",
        ),
        (
            "llama",
            "gemma",
            r#""sliding_window_pattern": 6"#,
            "sliding_window_pattern",
        ),
        ("llama", "llama", r#""sliding_window": 4"#, "sliding_window"),
        (
            "llama",
            "llama",
            r#""rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}"#,
            "partial_rotary_factor",
        ),
        (
            "llama",
            "mistral",
            r#""rope_scaling": {"rope_type": "proportional", "factor": 4.0}"#,
            "proportional",
        ),
        (
            "bart",
            "bart",
            r#""scale_attn_weights": false"#,
            "scale_attn_weights",
        ),
    ];
    for (i, (which, model_type, setting, key)) in cases.into_iter().enumerate() {
        let config = format!(
            r#"{{"model_type": "{model_type}", "num_attention_heads": 4, "num_key_value_heads": 2, {setting}}}"#
        );
        let config = match which {
            "llama" => config,
            _ => config.replace(r#""num_key_value_heads": 2, "#, ""),
        };
        let text = refusal(&format!("key{i}"), which, &config);
        assert!(text.contains(key), "{model_type} with {setting}: {text}");
    }
    // The same keys where the model type reads them load.
    let config = r#"{"model_type": "gpt_neox", "num_attention_heads": 4, "rotary_pct": 0.5}"#;
    let m = load_layout("neoxpartial", "gpt_neox", config).unwrap();
    assert_eq!(m.config.rope.map(|r| r.rotary_dims), Some(2));
    // attention_bias that the tensors contradict: transformers would not run these weights.
    let config = r#"{"model_type": "llama", "num_attention_heads": 4, "attention_bias": true}"#;
    let err = load_layout("biasconflict", "llama", config).unwrap_err();
    assert!(err.to_string().contains("attention_bias = true"), "{err}");
}

#[test]
fn gpt_neo_layers_are_unscaled_and_local_ones_windowed() {
    let (prefix, specs) = layout("gpt_neo");
    // (config, the window layer 0 gets): `attention_layers` as saved, else `attention_types`.
    let cases = [
        (
            r#""attention_types": [[["local", "global"], 1]], "window_size": 3"#,
            Some(3),
        ),
        (
            r#""attention_types": [[["global", "local"], 1]], "window_size": 3"#,
            None,
        ),
        (r#""attention_layers": ["local", "global"]"#, Some(256)),
    ];
    for (i, (keys, window)) in cases.into_iter().enumerate() {
        let config = format!(r#"{{"model_type": "gpt_neo", "num_heads": 4, {keys}}}"#);
        let dir = model_dir(&format!("neo{i}"), &config, &specs);
        let ckpt = HfCheckpoint::open(dir.path()).unwrap();
        let m = ckpt.attention(prefix, None).unwrap();
        assert_eq!((m.window, m.causal), (window, true), "{keys}");
        assert_eq!(m.config.scale(), 1.0, "GPT-Neo does not scale its scores");
        if i == 0 {
            runs_as_expected(&ckpt, prefix, 4, true);
        }
    }
    let err = load(
        "neobad",
        r#"{"model_type": "gpt_neo", "num_heads": 4, "attention_layers": ["sparse"]}"#,
        &specs,
        prefix,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("\"sparse\""), "{err}");
}

#[test]
fn a_bert_decoder_is_causal() {
    let (prefix, specs) = layout("bert");
    for (is_decoder, causal) in [("false", false), ("true", true)] {
        let config = format!(
            r#"{{"model_type": "bert", "num_attention_heads": 4, "is_decoder": {is_decoder}}}"#
        );
        let m = load(&format!("bertdec{is_decoder}"), &config, &specs, prefix).unwrap();
        assert_eq!(m.causal, causal, "is_decoder {is_decoder}");
    }
}

/// Loads `prefix`, checks its heads and causality, and runs it against the f64 reference with
/// its own mask.
fn runs_as_expected(ckpt: &HfCheckpoint, prefix: &str, heads: usize, causal: bool) {
    let m = ckpt
        .attention(prefix, None)
        .unwrap_or_else(|e| panic!("{prefix}: {e}"));
    assert_eq!(
        (m.config.heads, m.causal, m.cross),
        (heads, causal, false),
        "{prefix}"
    );
    let e = m.config.model_dim;
    let x = Tensor::random([2, 5, e], 3);
    let dims = AttnDims {
        batch: 2,
        heads,
        lq: 5,
        lk: 5,
    };
    let mask = m.mask(dims, None).unwrap();
    let mha = MultiHeadAttention::new(gpu(), m.config, &m.weights).unwrap();
    let got = mha.forward(&x, &x, &x, &mask).unwrap();
    let want = reference::forward(&m.config, &m.weights, &x, &x, &x, &mask).unwrap();
    assert_close(prefix, got.data(), &want.output);
}

/// A CLIP-like two-tower checkpoint: text E = 16 in `text_heads` heads, vision E = 24 in
/// `vision_heads` heads, each tower's head count only in its sub-config.
fn two_towers(tag: &str, config: &str) -> TempDir {
    let mut specs = projections(
        "text_model.encoder.layers.0.self_attn.",
        ["q_proj", "k_proj", "v_proj", "out_proj"],
        16,
        16,
        true,
    );
    specs.extend(projections(
        "vision_model.encoder.layers.0.self_attn.",
        ["q_proj", "k_proj", "v_proj", "out_proj"],
        24,
        24,
        true,
    ));
    specs.push(("logit_scale".into(), vec![1]));
    model_dir(tag, config, &specs)
}

#[test]
fn clip_and_siglip_read_each_towers_sub_config() {
    // Head counts that only fit their own tower: 3 heads do not split E = 16.
    let clip = two_towers(
        "clip",
        r#"{"model_type": "clip", "projection_dim": 8,
            "text_config": {"model_type": "clip_text_model", "hidden_size": 16, "num_attention_heads": 2},
            "vision_config": {"model_type": "clip_vision_model", "hidden_size": 24, "num_attention_heads": 3}}"#,
    );
    let ckpt = HfCheckpoint::open(clip.path()).unwrap();
    // CLIP's text tower is causal, its vision tower is not.
    runs_as_expected(&ckpt, "text_model.encoder.layers.0.self_attn.", 2, true);
    runs_as_expected(&ckpt, "vision_model.encoder.layers.0.self_attn.", 3, false);
    // SigLIP's text tower is not causal.
    let siglip = two_towers(
        "siglip",
        r#"{"model_type": "siglip",
            "text_config": {"model_type": "siglip_text_model", "hidden_size": 16, "num_attention_heads": 4},
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 24, "num_attention_heads": 2}}"#,
    );
    let ckpt = HfCheckpoint::open(siglip.path()).unwrap();
    runs_as_expected(&ckpt, "text_model.encoder.layers.0.self_attn.", 4, false);
    runs_as_expected(&ckpt, "vision_model.encoder.layers.0.self_attn.", 2, false);
}

#[test]
fn xglm_reads_attention_heads_and_is_causal() {
    let p = "model.layers.0.self_attn.";
    let specs = projections(p, ["q_proj", "k_proj", "v_proj", "out_proj"], E, E, true);
    let dir = model_dir(
        "xglm",
        r#"{"model_type": "xglm", "d_model": 16, "attention_heads": 4, "num_layers": 1}"#,
        &specs,
    );
    runs_as_expected(&HfCheckpoint::open(dir.path()).unwrap(), p, 4, true);
}

#[test]
fn a_multimodal_llms_text_tower_reads_text_config() {
    let text = "model.language_model.layers.0.self_attn.";
    let vision = "model.vision_tower.vision_model.encoder.layers.0.self_attn.";
    let mut specs = projections(text, ["q_proj", "k_proj", "v_proj", "o_proj"], E, 8, false);
    specs.extend(projections(
        vision,
        ["q_proj", "k_proj", "v_proj", "out_proj"],
        24,
        24,
        true,
    ));
    let llava = r#"{"model_type": "llava",
        "text_config": {"model_type": "llama", "hidden_size": 16, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "rope_theta": 500.0},
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 24, "num_attention_heads": 2}}"#;
    let dir = model_dir("llava", llava, &specs);
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let m = ckpt.attention(text, None).unwrap();
    assert_eq!(
        (
            m.model_type.as_deref(),
            m.config.heads,
            m.config.kv_heads,
            m.causal
        ),
        (Some("llama"), 4, 2, true)
    );
    assert_eq!(m.config.rope.map(|r| r.theta), Some(500.0));
    let m = ckpt.attention(vision, None).unwrap();
    assert_eq!((m.config.heads, m.causal), (2, false));
    // A text tower whose sub-config names a refused model type is refused by that name.
    let gemma3 = llava.replace(r#""model_type": "llama""#, r#""model_type": "gemma3_text""#);
    let err = load("gemma3mm", &gemma3, &specs, text).unwrap_err();
    assert!(err.to_string().contains("gemma3_text"), "{err}");
    // A prefix that names no tower of a multimodal config is ambiguous: refused.
    let mut specs = projections(
        "encoder.layers.0.self_attn.",
        ["q_proj", "k_proj", "v_proj", "out_proj"],
        E,
        E,
        true,
    );
    specs.push(("logit_scale".into(), vec![1]));
    let err = load(
        "ambiguous",
        r#"{"model_type": "clip", "text_config": {"num_attention_heads": 4},
            "vision_config": {"num_attention_heads": 2}}"#,
        &specs,
        "encoder.layers.0.self_attn.",
    )
    .unwrap_err();
    assert!(err.to_string().contains("ambiguous"), "{err}");
}

#[test]
fn inspect_prints_the_refusal_instead_of_runs() {
    let (_, specs) = layout("gptj");
    let dir = model_dir(
        "inspectgptj",
        r#"{"model_type": "codegen", "n_head": 4, "rotary_dim": 4}"#,
        &specs,
    );
    let (code, text) = cli(&["inspect", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("transformer.h.0.attn."))
        .unwrap_or_else(|| panic!("no module line:\n{text}"));
    assert!(
        line.contains("NOT RUN") && line.contains("\"codegen\"") && line.contains("qkv_proj"),
        "{line}"
    );
    assert!(!line.contains("runs"), "{line}");
    let clip = two_towers(
        "inspectclip",
        r#"{"model_type": "clip",
            "text_config": {"model_type": "clip_text_model", "num_attention_heads": 2},
            "vision_config": {"model_type": "clip_vision_model", "num_attention_heads": 3}}"#,
    );
    let (code, text) = cli(&["inspect", clip.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    for (prefix, says) in [
        ("text_model.", "self causal  E=16 heads=2"),
        ("vision_model.", "self  E=24 heads=3"),
    ] {
        let line = text
            .lines()
            .find(|l| l.contains(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line:\n{text}"));
        assert!(line.contains(says) && line.ends_with("runs"), "{line}");
    }
}

/// DeepSeek's MLA loads only as transformers would build it: one key/value per query head
/// (transformers' `repeat_kv` fails on anything else), no tensor it does not read, biases as
/// `attention_bias` says, and the config's sizes matching every tensor; its tensors under
/// another model type are not MLA.
#[test]
fn mla_modules_transformers_would_not_build_are_refused() {
    let p = "model.layers.0.self_attn.";
    let specs = |extra: &[(&str, Vec<usize>)]| -> Vec<(String, Vec<usize>)> {
        let mut s: Vec<(String, Vec<usize>)> = [
            ("q_proj.weight", vec![48, 32]),
            ("kv_a_proj_with_mqa.weight", vec![20, 32]),
            ("kv_a_layernorm.weight", vec![16]),
            ("kv_b_proj.weight", vec![64, 16]),
            ("o_proj.weight", vec![32, 32]),
        ]
        .into_iter()
        .chain(extra.iter().map(|(n, s)| (*n, s.clone())))
        .map(|(n, s)| (format!("{p}{n}"), s))
        .collect();
        s.sort();
        s
    };
    let config = |extra: &str| {
        format!(
            r#"{{"model_type": "deepseek_v3", "num_attention_heads": 4, "kv_lora_rank": 16,
                "q_lora_rank": null, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                "v_head_dim": 8{extra}}}"#
        )
    };
    let load =
        |tag: &str, config: &str, specs: &[(String, Vec<usize>)]| load(tag, config, specs, p);
    let module = load("mla-ok", &config(""), &specs(&[])).expect("a plain MLA module loads");
    assert!(module.causal && module.mla.is_some());
    assert_eq!(module.mla.as_ref().unwrap().dims().latent_width(), 20);
    type Specs = Vec<(String, Vec<usize>)>;
    let refused: [(&str, String, Specs, &str); 5] = [
        (
            "mla-kv-heads",
            config(r#", "num_key_value_heads": 2"#),
            specs(&[]),
            "num_key_value_heads = 2",
        ),
        (
            "mla-q-norm",
            config(""),
            specs(&[("q_norm.weight", vec![12])]),
            "q_norm.weight",
        ),
        (
            "mla-bias",
            config(r#", "attention_bias": true"#),
            specs(&[]),
            "kv_a_proj_with_mqa.bias",
        ),
        (
            "mla-rank",
            config(r#", "kv_lora_rank": 12"#),
            specs(&[]),
            "kv_a_proj_with_mqa.weight",
        ),
        (
            "mla-as-llama",
            config("").replace("deepseek_v3", "llama"),
            specs(&[]),
            "llama checkpoint holds llama attention tensors, not mla",
        ),
    ];
    for (tag, config, specs, says) in refused {
        match load(tag, &config, &specs) {
            Err(e) => assert!(e.to_string().contains(says), "{tag}: `{e}` lacks `{says}`"),
            Ok(_) => panic!("{tag}: loaded"),
        }
    }
}
