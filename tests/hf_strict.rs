//! The loader computes what transformers computes, or refuses naming why: strict config values,
//! per-model-type defaults and biases, shards read by `weight_map`, model directories treated as
//! inputs (regular files within a size bound, never written over), sizes that cannot overflow,
//! errors that name the checkpoint's own tensors, and CLI flags that do not apply to `--hf`.
//! transformers' own answers for the defaults that changed are the case files
//! `tests/fixtures/hf/*default_pct*` and `*short_distance*`, checked by `tests/hf.rs`.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::cli;
use common::hf_dirs::{model_dir, tensors, TempDir};
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::io::safetensors::write_safetensors;
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{Error, Result, Tensor};

const P: &str = "model.layers.0.self_attn.";

/// A directory tag no other test of this binary uses (they run in parallel).
fn tag(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("strict-{what}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Llama-named projections at `P` (E = 16), plus `extra` tensors.
fn llama(shapes: [&[usize]; 4], extra: &[&str]) -> Vec<(String, Tensor)> {
    let names: Vec<String> = ["q_proj", "k_proj", "v_proj", "o_proj"]
        .iter()
        .map(|n| format!("{P}{n}.weight"))
        .chain(extra.iter().map(|e| format!("{P}{e}")))
        .collect();
    let mut specs: Vec<(&str, &[usize])> = names[..4]
        .iter()
        .zip(shapes)
        .map(|(n, s)| (n.as_str(), s))
        .collect();
    // Extras are biases of the projection they name: [out].
    let bias_len: Vec<[usize; 1]> = extra
        .iter()
        .map(|e| {
            let i = ["q_proj", "k_proj", "v_proj", "o_proj"]
                .iter()
                .position(|p| e.starts_with(p))
                .unwrap_or(0);
            [shapes[i][0]]
        })
        .collect();
    specs.extend(
        names[4..]
            .iter()
            .zip(&bias_len)
            .map(|(n, s)| (n.as_str(), &s[..])),
    );
    tensors(&specs)
}

const SQUARE: [&[usize]; 4] = [&[16, 16], &[16, 16], &[16, 16], &[16, 16]];

fn load(config: &Value, t: &[(String, Tensor)]) -> Result<HfAttention> {
    let dir = model_dir(&tag("load"), &config.to_string(), t, false);
    HfCheckpoint::open(dir.path())?.attention(P, None)
}

/// `base` with `patch`'s keys set.
fn patched(base: &Value, patch: Value) -> Value {
    let mut c = base.clone();
    for (k, v) in patch.as_object().expect("object") {
        c[k] = v.clone();
    }
    c
}

#[test]
fn malformed_config_values_are_errors_naming_the_key() {
    let base = json!({"model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2});
    assert!(load(&base, &llama(SQUARE, &[])).is_ok());
    for (patch, key) in [
        (json!({"rope_theta": "500000"}), "rope_theta"),
        (json!({"rope_theta": null}), "rope_theta"),
        (json!({"rope_theta": -5.0}), "rope_theta"),
        (
            json!({"rope_parameters": {"rope_type": 5, "rope_theta": 1e4}}),
            "rope_type",
        ),
        (json!({"rope_parameters": [1, 2]}), "rope_parameters"),
        (json!({"rope_scaling": "linear"}), "rope_scaling"),
        (
            json!({"rope_parameters": {"rope_type": "linear", "factor": "2"}}),
            "factor",
        ),
        (json!({"num_attention_heads": "4"}), "num_attention_heads"),
        (json!({"num_attention_heads": 0}), "num_attention_heads"),
        (json!({"attention_bias": "no"}), "attention_bias"),
        (json!({"model_type": 5}), "model_type"),
    ] {
        let err = load(&patched(&base, patch.clone()), &llama(SQUARE, &[]))
            .expect_err(&patch.to_string());
        assert!(err.to_string().contains(key), "{patch}: {err}");
    }
    // transformers validates layer_types on every config: known kinds, one per layer.
    let qwen2 = json!({"model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2,
        "use_sliding_window": true, "sliding_window": 4});
    let biased = llama(SQUARE, &["q_proj.bias", "k_proj.bias", "v_proj.bias"]);
    load(&qwen2, &biased).unwrap();
    for (types, phrase) in [
        (json!(["full_attention", "bogus"]), "bogus"),
        (json!(["full_attention", 3]), "layer_types"),
        (json!("full_attention"), "layer_types"),
        (json!(["full_attention"]), "num_hidden_layers"),
    ] {
        let err = load(&patched(&qwen2, json!({"layer_types": types})), &biased)
            .expect_err(&types.to_string());
        assert!(err.to_string().contains(phrase), "{types}: {err}");
    }
}

#[test]
fn gpt_neox_without_rotary_pct_rotates_a_quarter_of_each_head() {
    let p = "gpt_neox.layers.0.attention.";
    let t = tensors(&[
        (&format!("{p}query_key_value.weight"), &[96, 32]),
        (&format!("{p}query_key_value.bias"), &[96]),
        (&format!("{p}dense.weight"), &[32, 32]),
        (&format!("{p}dense.bias"), &[32]),
    ]);
    let rotary = |config: Value| {
        let dir = model_dir(&tag("neox"), &config.to_string(), &t, false);
        let m = HfCheckpoint::open(dir.path())
            .unwrap()
            .attention(p, None)
            .unwrap();
        (
            m.config.qk_head_dim,
            m.config.rope.expect("rope").rotary_dims,
        )
    };
    // transformers' GPTNeoXConfig: rotary_pct defaults to 0.25.
    let config = json!({"model_type": "gpt_neox", "num_attention_heads": 2});
    assert_eq!(rotary(config.clone()), (16, 4));
    assert_eq!(
        rotary(patched(&config, json!({"rotary_pct": 0.5}))),
        (16, 8)
    );
    // Without its biases (attention_bias defaults to true there) it is not run.
    let unbiased: Vec<(String, Tensor)> = t
        .iter()
        .filter(|(n, _)| !n.ends_with("bias"))
        .cloned()
        .collect();
    let dir = model_dir(&tag("neox-nobias"), &config.to_string(), &unbiased, false);
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap_err();
    assert!(err.to_string().contains("query_key_value.bias"), "{err}");
}

#[test]
fn biases_follow_each_model_types_rule() {
    let cfg =
        |t: &str, extra: Value| patched(&json!({"model_type": t, "num_attention_heads": 4}), extra);
    let qkv = ["q_proj.bias", "k_proj.bias", "v_proj.bias"];
    let all = ["q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"];
    // (config, biases stored, runs?, the tensor an error names)
    for (config, biases, runs, named) in [
        // llama: attention_bias, default false; a stray bias is never read by transformers.
        (
            cfg("llama", json!({})),
            &["q_proj.bias"][..],
            false,
            "q_proj.bias",
        ),
        (
            cfg("llama", json!({"attention_bias": false})),
            &["q_proj.bias"],
            false,
            "q_proj.bias",
        ),
        (
            cfg("llama", json!({"attention_bias": true})),
            &all,
            true,
            "",
        ),
        (
            cfg("llama", json!({"attention_bias": true})),
            &[],
            false,
            "q_proj.bias",
        ),
        // qwen2: q, k and v biased, never the output.
        (cfg("qwen2", json!({})), &qkv, true, ""),
        (cfg("qwen2", json!({})), &all, false, "o_proj.bias"),
        (cfg("qwen2", json!({})), &[], false, "q_proj.bias"),
        // mistral: none; starcoder2: use_bias, default true.
        (
            cfg("mistral", json!({})),
            &["v_proj.bias"],
            false,
            "v_proj.bias",
        ),
        (cfg("starcoder2", json!({})), &all, true, ""),
        (
            cfg("starcoder2", json!({"use_bias": false})),
            &all,
            false,
            "q_proj.bias",
        ),
    ] {
        let got = load(&config, &llama(SQUARE, biases));
        match (runs, got) {
            (true, Ok(m)) => assert_eq!(m.config.bias, !biases.is_empty()),
            (false, Err(e)) => {
                assert!(
                    matches!(e, Error::UnsupportedModule { .. }),
                    "{config}: {e}"
                );
                assert!(
                    e.to_string().contains(&format!("{P}{named}")),
                    "{config}: {e}"
                );
            }
            (_, got) => panic!("{config} with {biases:?}: {got:?}"),
        }
    }
}

#[test]
fn a_sharded_checkpoint_reads_each_tensor_from_the_shard_its_index_names() {
    let dir = TempDir::new(&tag("shards"));
    let t = llama(SQUARE, &[]);
    let other_v = Tensor::random([16, 16], 777);
    let v_name = format!("{P}v_proj.weight");
    // Shard 1 holds q, k and a stale v; shard 2 the v the index names, and o.
    let shard1: Vec<(&str, &Tensor)> =
        vec![(&t[0].0, &t[0].1), (&t[1].0, &t[1].1), (&v_name, &t[2].1)];
    let shard2: Vec<(&str, &Tensor)> = vec![(&v_name, &other_v), (&t[3].0, &t[3].1)];
    write_safetensors(dir.path().join("a.safetensors"), &shard1, None).unwrap();
    write_safetensors(dir.path().join("b.safetensors"), &shard2, None).unwrap();
    // A file the index does not name is never read.
    std::fs::write(
        dir.path().join("junk.safetensors"),
        b"not a safetensors file",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "llama", "num_attention_heads": 4}"#,
    )
    .unwrap();
    let index = |o_shard: &str| {
        let map = json!({"weight_map": {
            &t[0].0: "a.safetensors", &t[1].0: "a.safetensors", &v_name: "b.safetensors",
            &t[3].0: o_shard}});
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            map.to_string(),
        )
        .unwrap();
    };
    index("b.safetensors");
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.read(&v_name).unwrap().1, other_v.data());
    let m = ckpt.attention(P, None).unwrap();
    assert_eq!(m.weights.v.weight, other_v.data());
    // An index naming a shard that lacks the tensor is an error naming both.
    index("a.safetensors");
    let err = HfCheckpoint::open(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("a.safetensors") && err.contains("o_proj.weight"),
        "{err}"
    );
}

#[test]
fn config_and_index_are_read_only_as_bounded_regular_files() {
    let t = llama(SQUARE, &[]);
    let config = r#"{"model_type": "llama", "num_attention_heads": 4}"#;
    let dir = model_dir(&tag("bounded"), config, &t, false);
    let cfg = dir.path().join("config.json");
    let open_err = || HfCheckpoint::open(dir.path()).unwrap_err().to_string();
    #[cfg(unix)]
    {
        std::fs::remove_file(&cfg).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &cfg).unwrap();
        assert!(open_err().contains("not a regular file"), "{}", open_err());
        std::fs::remove_file(&cfg).unwrap();
        std::os::unix::fs::symlink(dir.path().join("gone.json"), &cfg).unwrap();
        assert!(open_err().contains("does not exist"), "{}", open_err());
        std::fs::remove_file(&cfg).unwrap();
        let fifo = std::process::Command::new("mkfifo").arg(&cfg).status();
        if fifo.is_ok_and(|s| s.success()) {
            // Refused from its metadata: opening a FIFO for reading would block.
            assert!(open_err().contains("not a regular file"), "{}", open_err());
            std::fs::remove_file(&cfg).unwrap();
        }
    }
    // 5 MiB of JSON: over the bound, refused by its size before it is parsed.
    let padded = format!("{}{config}", " ".repeat(5 << 20));
    std::fs::write(&cfg, padded).unwrap();
    assert!(open_err().contains("bytes accepted"), "{}", open_err());
    // The index passes the same check.
    let sharded = model_dir(&tag("bounded-index"), config, &t, true);
    let index = sharded.path().join("model.safetensors.index.json");
    std::fs::remove_file(&index).unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("/dev/zero", &index).unwrap();
        let err = HfCheckpoint::open(sharded.path()).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
}

/// `hidden_states` `[1, 3, 16]` for `run --hf`.
fn inputs_file(dir: &Path) -> String {
    let path = dir.join("inputs.safetensors");
    let x = Tensor::random([1, 3, 16], 5);
    write_safetensors(&path, &[("hidden_states", &x)], None).unwrap();
    path.display().to_string()
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn run_never_writes_over_a_file_the_checkpoint_was_read_from() {
    let config = r#"{"model_type": "llama", "num_attention_heads": 4}"#;
    let model = model_dir(&tag("out"), config, &llama(SQUARE, &[]), true);
    let elsewhere = TempDir::new(&tag("out-elsewhere"));
    let inputs = inputs_file(elsewhere.path());
    let shard = model.path().join("model-00002-of-00002.safetensors");
    let mut targets: Vec<std::path::PathBuf> = [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
    ]
    .iter()
    .map(|f| model.path().join(f))
    .collect();
    #[cfg(unix)]
    {
        // A link elsewhere to a shard, and a hard link to the config.
        let link = elsewhere.path().join("link.safetensors");
        std::os::unix::fs::symlink(&shard, &link).unwrap();
        let hard = elsewhere.path().join("hard.json");
        std::fs::hard_link(model.path().join("config.json"), &hard).unwrap();
        targets.extend([link, hard]);
    }
    let before = snapshot(model.path());
    let dir = model.path().display().to_string();
    for target in &targets {
        let out = target.display().to_string();
        let args = [
            "run", "--hf", &dir, "--layer", "0", "--inputs", &inputs, "--out", &out,
        ];
        let (code, text) = cli(&args);
        assert_ne!(code, 0, "{out}: {text}");
        assert!(text.contains("is the input"), "{out}: {text}");
        assert_eq!(snapshot(model.path()), before, "{out} changed the model");
    }
    // The same run with an output elsewhere works: the refusals above are about the path.
    let out = elsewhere
        .path()
        .join("out.safetensors")
        .display()
        .to_string();
    let (code, text) = cli(&[
        "run", "--hf", &dir, "--layer", "0", "--inputs", &inputs, "--out", &out,
    ]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(snapshot(model.path()), before);
}

#[test]
fn flags_without_a_meaning_for_hf_checkpoints_are_refused() {
    let config = r#"{"model_type": "llama", "num_attention_heads": 4}"#;
    let model = model_dir(&tag("flags"), config, &llama(SQUARE, &[]), false);
    let dir = model.path().display().to_string();
    let inputs = inputs_file(model.path());
    let out = model.path().join("out.safetensors").display().to_string();
    for flag in [
        &["--seq-first"][..],
        &["--scale", "0.5"],
        &["--add-zero-attn"],
    ] {
        let mut args = vec![
            "run", "--hf", &dir, "--layer", "0", "--inputs", &inputs, "--out", &out,
        ];
        args.extend_from_slice(flag);
        let (code, text) = cli(&args);
        assert_eq!(code, 2, "{flag:?}: {text}");
        assert!(
            text.contains(flag[0]) && text.contains("--hf"),
            "{flag:?}: {text}"
        );
    }
}

#[test]
fn errors_name_the_checkpoints_own_tensors() {
    let config = json!({"model_type": "llama", "num_attention_heads": 4});
    for (shapes, named, phrase) in [
        // v does not split into the 4 key/value heads k gives.
        (
            [&[16, 16][..], &[16, 16], &[10, 16], &[16, 16]],
            "v_proj.weight",
            "10 value outputs",
        ),
        // o's input is not the heads' concatenated values.
        (
            [&[16, 16][..], &[16, 16], &[16, 16], &[16, 12]],
            "o_proj.weight",
            "[16, 12]",
        ),
        // k reads a hidden size other than q's: the weight is wrong, not the input.
        (
            [&[16, 16][..], &[16, 12], &[16, 16], &[16, 16]],
            "k_proj.weight",
            "input width 12",
        ),
    ] {
        let err = load(&config, &llama(shapes, &[])).unwrap_err().to_string();
        assert!(err.contains(&format!("{P}{named}")), "{err}");
        assert!(err.contains(phrase), "{err}");
        assert!(!err.contains("W_"), "{err}");
    }
    // Layer 1 lacks o_proj: said, rather than "no tensor lies under it".
    let mut t = llama(SQUARE, &[]);
    let layer1 = "model.layers.1.self_attn.";
    t.extend(tensors(&[(&format!("{layer1}q_proj.weight"), &[16, 16])]));
    let dir = model_dir(&tag("nolayer"), &config.to_string(), &t, false);
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .layer_prefix(1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("`{layer1}` has `q_proj.weight` but no")),
        "{err}"
    );
}

/// Values that have broken loaders: wrong JSON types, zero, the edges of i32, u32, f64 and
/// usize, strings of numbers, and the shapes RoPE and layer lists take.
fn wild_values() -> Vec<Value> {
    let mut v = vec![
        Value::Null,
        json!(true),
        json!(false),
        json!(0),
        json!(1),
        json!(2),
        json!(3),
        json!(4),
        json!(-1),
        json!(0.5),
        json!(1e308),
        json!(-1e308),
        json!(1e-300),
        json!("2"),
        json!(""),
        json!("linear"),
        json!([]),
        json!([1, 2]),
        json!({}),
        json!(["full_attention", "sliding_attention"]),
        json!(["sliding_attention", "bogus"]),
        json!([[["global", "local"], 1]]),
        json!([[["local"], 1_000_000_000_000u64]]),
        json!({"rope_type": "linear", "factor": 0}),
        json!({"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
               "original_max_position_embeddings": 0}),
        json!({"rope_type": 5}),
        json!({"rope_theta": "1e4"}),
        json!({"full_attention": {"rope_type": "default"}}),
    ];
    for n in [
        (1u64 << 31) - 1,
        1 << 31,
        (1 << 31) + 1,
        1 << 32,
        1 << 53,
        u64::MAX / 2,
        u64::MAX,
    ] {
        v.push(json!(n));
    }
    v.push(json!(i64::MIN));
    v
}

/// Every key a family in the loader reads, and the ones it refuses.
const KEYS: &[&str] = &[
    "model_type",
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "attention_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "num_key_value_heads",
    "multi_query",
    "head_dim",
    "rope_theta",
    "rotary_emb_base",
    "rope_parameters",
    "rope_scaling",
    "partial_rotary_factor",
    "rotary_pct",
    "original_max_position_embeddings",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "num_hidden_layers",
    "attention_types",
    "attention_layers",
    "window_size",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    "attention_multiplier",
    "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx",
    "relative_attention_num_buckets",
    "relative_attention_max_distance",
    "is_decoder",
    "attention_bias",
    "use_bias",
    "position_embedding_type",
    "rotary_dim",
    "alibi",
    "clip_qkv",
];

/// One module of a family: (model_type, prefix, tensors).
type FamilyModule = (&'static str, String, Vec<(String, Tensor)>);

fn family_modules() -> Vec<FamilyModule> {
    let named = |p: &str, specs: &[(&str, &[usize])]| {
        let full: Vec<(String, Vec<usize>)> = specs
            .iter()
            .map(|(n, s)| (format!("{p}{n}"), s.to_vec()))
            .collect();
        let refs: Vec<(&str, &[usize])> = full
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_slice()))
            .collect();
        (p.to_string(), tensors(&refs))
    };
    let qkvo = |names: [&str; 4], bias: bool| {
        let mut specs: Vec<(String, Vec<usize>)> = Vec::new();
        for n in names {
            specs.push((format!("{n}.weight"), vec![16, 16]));
            if bias {
                specs.push((format!("{n}.bias"), vec![16]));
            }
        }
        specs
    };
    let as_refs = |s: &[(String, Vec<usize>)]| -> Vec<(String, Vec<usize>)> { s.to_vec() };
    let mut out = Vec::new();
    for (t, p, specs) in [
        (
            "llama",
            P,
            as_refs(&qkvo(["q_proj", "k_proj", "v_proj", "o_proj"], false)),
        ),
        (
            "gemma2",
            P,
            qkvo(["q_proj", "k_proj", "v_proj", "o_proj"], false),
        ),
        (
            "bart",
            "model.decoder.layers.0.self_attn.",
            qkvo(["q_proj", "k_proj", "v_proj", "out_proj"], true),
        ),
        (
            "gpt_neo",
            "transformer.h.1.attn.attention.",
            qkvo(["q_proj", "k_proj", "v_proj", "out_proj"], true),
        ),
        (
            "bert",
            "encoder.layer.0.attention.",
            qkvo(
                ["self.query", "self.key", "self.value", "output.dense"],
                true,
            ),
        ),
        ("t5", "encoder.block.0.layer.0.SelfAttention.", {
            let mut s = qkvo(["q", "k", "v", "o"], false);
            s.push(("relative_attention_bias.weight".into(), vec![8, 4]));
            s
        }),
        (
            "gpt2",
            "h.1.attn.",
            vec![
                ("c_attn.weight".into(), vec![16, 48]),
                ("c_attn.bias".into(), vec![48]),
                ("c_proj.weight".into(), vec![16, 16]),
            ],
        ),
        (
            "phi3",
            P,
            vec![
                ("qkv_proj.weight".into(), vec![48, 16]),
                ("o_proj.weight".into(), vec![16, 16]),
            ],
        ),
        (
            "gpt_neox",
            "gpt_neox.layers.0.attention.",
            vec![
                ("query_key_value.weight".into(), vec![48, 16]),
                ("query_key_value.bias".into(), vec![48]),
                ("dense.weight".into(), vec![16, 16]),
                ("dense.bias".into(), vec![16]),
            ],
        ),
    ] {
        let refs: Vec<(&str, &[usize])> = specs
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_slice()))
            .collect();
        let (prefix, t2) = named(p, &refs);
        out.push((t, prefix, t2));
    }
    out
}

/// Loads the module with `config` (and `--heads`), building its mask when it loads: the step
/// where windows and T5's buckets are computed. A panic fails the calling test.
fn load_any(dir: &Path, prefix: &str, config: &Value, heads: Option<usize>) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let loaded = HfCheckpoint::open(dir).and_then(|c| c.attention(prefix, heads));
    if let Ok(m) = loaded {
        let dims = AttnDims {
            batch: 1,
            heads: m.config.heads,
            lq: 5,
            lk: 5,
        };
        let _ = m.mask(dims, None);
    }
}

/// Every extreme value for every key each family reads, one key at a time, then random
/// combinations of them with random `--heads`: the loader answers `Ok` or `Err`, never a panic.
/// The answers themselves are checked against transformers by the case files.
#[test]
fn no_config_value_panics_the_loader() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let modules = family_modules();
    let dirs: Vec<(TempDir, &str, &str)> = modules
        .iter()
        .map(|(t, p, tensors)| {
            let dir = model_dir(&tag(t), "{}", tensors, false);
            (dir, *t, p.as_str())
        })
        .collect();
    let values = wild_values();
    let base = |model_type: &str| json!({"model_type": model_type, "num_attention_heads": 4, "num_hidden_layers": 2});
    for (dir, model_type, prefix) in &dirs {
        for key in KEYS {
            for value in &values {
                let config = patched(&base(model_type), json!({ *key: value }));
                load_any(dir.path(), prefix, &config, None);
            }
        }
    }
    let heads = [
        None,
        Some(0),
        Some(1),
        Some(4),
        Some(1usize << 40),
        Some(usize::MAX),
    ];
    let strategy = (
        0..dirs.len(),
        proptest::collection::vec(
            (
                proptest::sample::select(KEYS),
                proptest::sample::select(values),
            ),
            0..6,
        ),
        proptest::sample::select(heads.to_vec()),
    );
    let mut runner = TestRunner::new(Config {
        cases: cases * dirs.len() as u32,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(which, patch, heads)| {
            let (dir, model_type, prefix) = &dirs[which];
            let mut config = base(model_type);
            for (k, v) in &patch {
                config[*k] = v.clone();
            }
            load_any(dir.path(), prefix, &config, heads);
            Ok(())
        })
        .unwrap();
}

#[test]
fn q_k_norms_load_only_where_the_config_switches_them_on() {
    let cohere = json!({"model_type": "cohere", "num_attention_heads": 4});
    let on = patched(&cohere, json!({"use_qk_norm": true}));
    let mut t = llama(SQUARE, &[]);
    t.extend(tensors(&[
        (&format!("{P}q_norm.weight"), &[4, 4]),
        (&format!("{P}k_norm.weight"), &[4, 4]),
    ]));
    let m = load(&on, &t).unwrap();
    let rope = m.config.rope.expect("rope");
    assert!(rope.interleaved, "cohere rotates interleaved pairs");
    assert_eq!(m.weights.qk_norm.expect("norm").q.len(), 16);
    // Switched off, transformers builds no norm: tensors it would ignore are refused.
    let err = load(&cohere, &t).unwrap_err();
    assert!(matches!(err, Error::UnsupportedModule { .. }), "{err}");
    assert!(err.to_string().contains("_norm.weight"), "{err}");
    // Switched on without its weights: named.
    let err = load(&on, &llama(SQUARE, &[])).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{P}q_norm.weight")) && err.contains("missing"),
        "{err}"
    );
    // StableLM keeps one LayerNorm per head.
    let stablelm = json!({"model_type": "stablelm", "num_attention_heads": 4,
        "qk_layernorm": true});
    let mut t = llama(SQUARE, &[]);
    for h in 0..3 {
        t.extend(tensors(&[(
            &format!("{P}q_layernorm.norms.{h}.weight"),
            &[4],
        )]));
    }
    let err = load(&stablelm, &t).unwrap_err().to_string();
    assert!(err.contains("q_layernorm.norms.3.weight"), "{err}");
}

#[test]
fn absent_keys_take_the_defaults_of_the_model_types_config_class() {
    let m = |config: Value| load(&config, &llama(SQUARE, &[])).unwrap();
    let base = |t: &str| json!({"model_type": t, "num_attention_heads": 4});
    // MistralConfig: sliding_window 4096; MixtralConfig: rope_theta 1e6; CohereConfig: 5e5.
    assert_eq!(m(base("mistral")).window, Some(4096));
    assert_eq!(m(base("mixtral")).config.rope.unwrap().theta, 1e6);
    assert_eq!(m(base("cohere")).config.rope.unwrap().theta, 5e5);
    // Gemma2Config: query_pre_attn_scalar 256, attn_logit_softcapping 50, layer 0 slides 4096.
    let gemma2 = m(base("gemma2"));
    assert_eq!(gemma2.config.scale, Some(1.0 / 16.0));
    assert_eq!(gemma2.config.softcap, Some(50.0));
    assert_eq!(gemma2.window, Some(4096));
    // null is not absent: no cap.
    let uncapped = m(patched(
        &base("gemma2"),
        json!({"attn_logit_softcapping": null}),
    ));
    assert_eq!(uncapped.config.softcap, None);
    // GraniteConfig: attention_multiplier 1.0 (not 1/√d).
    assert_eq!(m(base("granite")).config.scale, Some(1.0));
    // Qwen2Config: max_window_layers 28, so layer 0 of a windowed model is full.
    let qwen2 = patched(
        &base("qwen2"),
        json!({"use_sliding_window": true, "sliding_window": 4}),
    );
    let biased = llama(SQUARE, &["q_proj.bias", "k_proj.bias", "v_proj.bias"]);
    assert_eq!(load(&qwen2, &biased).unwrap().window, None);
}

/// transformers 5.25's llama-like families (issue 38): each builds its biases by its own keys,
/// takes its config class's defaults, and ignores what its config class never reads.
#[test]
fn round2_families_read_their_config_classes_rules() {
    let base = |t: &str| json!({"model_type": t, "num_attention_heads": 4});
    let qkv = ["q_proj.bias", "k_proj.bias", "v_proj.bias"];
    let all = ["q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"];
    let runs = |config: &Value, biases: &[&str]| load(config, &llama(SQUARE, biases));
    // seed_oss: q/k/v by attention_bias (default true), the output by attention_out_bias
    // (default false).
    assert!(runs(&base("seed_oss"), &qkv).is_ok());
    let err = runs(&base("seed_oss"), &all).unwrap_err().to_string();
    assert!(
        err.contains("o_proj.bias") && err.contains("attention_out_bias"),
        "{err}"
    );
    let out = patched(&base("seed_oss"), json!({"attention_out_bias": true}));
    assert!(runs(&out, &all).is_ok());
    // helium: q/k/v by attention_bias (default false), never the output.
    assert!(runs(&base("helium"), &[]).is_ok());
    let helium = patched(&base("helium"), json!({"attention_bias": true}));
    assert!(runs(&helium, &qkv).is_ok());
    assert!(runs(&helium, &all).is_err());
    // qwen2_moe: qkv_bias, default true; ernie4_5: use_bias on all four, default false.
    assert!(runs(&base("qwen2_moe"), &qkv).is_ok());
    assert!(runs(
        &patched(&base("qwen2_moe"), json!({"qkv_bias": false})),
        &qkv
    )
    .is_err());
    assert!(runs(&base("ernie4_5"), &[]).is_ok());
    assert!(runs(&patched(&base("ernie4_5"), json!({"use_bias": true})), &all).is_ok());
    // ministral and exaone4: none.
    assert!(runs(&base("ministral"), &qkv).is_err());

    // Defaults: θ 10^5 (helium), 5·10^5 (ernie4_5); windows 4096 (ministral, qwen3_moe with
    // use_sliding_window); attention_multiplier 1 (granitemoe).
    let m = |config: Value| runs(&config, &[]).unwrap();
    assert_eq!(m(base("helium")).config.rope.unwrap().theta, 1e5);
    assert!(m(base("helium")).config.rope.unwrap().interleaved);
    assert_eq!(m(base("ernie4_5")).config.rope.unwrap().theta, 5e5);
    assert_eq!(m(base("ministral")).window, Some(4096));
    assert_eq!(m(base("granitemoe")).config.scale, Some(1.0));
    let norms = ["q_norm.weight", "k_norm.weight"];
    let with_norms = |config: &Value, len: usize| {
        let mut t = llama(SQUARE, &[]);
        t.extend(norms.map(|n| (format!("{P}{n}"), Tensor::random([len], 5))));
        load(config, &t)
    };
    let qwen3_moe = patched(&base("qwen3_moe"), json!({"use_sliding_window": true}));
    assert_eq!(with_norms(&qwen3_moe, 4).unwrap().window, Some(4096));
    // Qwen3MoeConfig has neither max_window_layers nor layer_types: a config that carries them
    // (Qwen3-MoE checkpoints do) loads, and every layer still slides.
    let carried = patched(
        &qwen3_moe,
        json!({"max_window_layers": 48, "num_hidden_layers": 2,
               "layer_types": ["full_attention", "full_attention"]}),
    );
    assert_eq!(with_norms(&carried, 4).unwrap().window, Some(4096));
    // ... which a qwen3 (dense) config still reads.
    let qwen3 = patched(&carried, json!({"model_type": "qwen3"}));
    assert_eq!(with_norms(&qwen3, 4).unwrap().window, None);
    // Cohere 2 configs of transformers 4.x say "rope_gptj", its interleaved RoPE; layer 0 of
    // the default pattern slides (θ 10000, window 4096, RoPE), and carries no q/k norm.
    let cohere2 = patched(
        &base("cohere2"),
        json!({"position_embedding_type": "rope_gptj", "sliding_window_pattern": 4}),
    );
    let layer0 = m(cohere2.clone());
    assert_eq!(layer0.window, Some(4096));
    assert!(layer0.config.rope.unwrap().interleaved);
    assert!(with_norms(&cohere2, 4).is_err());
    // Olmo 3 and EXAONE 4 normalise q and k (whole projection; per head), olmoe too.
    for (t, len) in [("olmo3", 16), ("olmoe", 16), ("exaone4", 4)] {
        let got = with_norms(&base(t), len).unwrap();
        assert!(got.config.qk_norm.is_some(), "{t}");
        assert!(
            load(&base(t), &llama(SQUARE, &[])).is_err(),
            "{t} without its norms"
        );
    }
    // Hunyuan's norms are `query_layernorm` and `key_layernorm`, after RoPE.
    let mut t = llama(SQUARE, &[]);
    for n in ["query_layernorm.weight", "key_layernorm.weight"] {
        t.push((format!("{P}{n}"), Tensor::random([4], 6)));
    }
    let hunyuan = load(&base("hunyuan_v1_dense"), &t).unwrap();
    assert!(hunyuan.config.qk_norm.unwrap().after_rope);
    assert!(with_norms(&base("hunyuan_v1_dense"), 4).is_err());
}
