//! Hugging Face checkpoints as saved, built here from seeded tensors so every loader rule has a
//! case of its own: families found by tensor names, GPT-2's transposed Conv1D, biases some
//! projections lack, heads from `config.json`, sharded checkpoints, and errors that name what
//! is wrong (the tensors under the prefix, the modules found, RoPE, grouped-query attention).
//! `tests/hf.rs` checks the answers against `transformers` itself.

mod common;

use common::hf_dirs::{model_dir, tensors, TempDir};
use common::{assert_close, gpu};
use wgpu_mha::io::hf::families::Family;
use wgpu_mha::io::hf::HfCheckpoint;
use wgpu_mha::io::safetensors::write_safetensors;
use wgpu_mha::{reference, Error, Mask, MultiHeadAttention, Tensor};

const BERT_CONFIG: &str = r#"{"model_type": "bert", "hidden_size": 16, "num_attention_heads": 4}"#;

fn bert_layer(layer: usize) -> Vec<(String, Tensor)> {
    let p = format!("encoder.layer.{layer}.attention.");
    let names: Vec<(String, Vec<usize>)> = [
        ("self.query.weight", vec![16, 16]),
        ("self.query.bias", vec![16]),
        ("self.key.weight", vec![16, 16]),
        ("self.key.bias", vec![16]),
        ("self.value.weight", vec![16, 16]),
        ("self.value.bias", vec![16]),
        ("output.dense.weight", vec![16, 16]),
        ("output.dense.bias", vec![16]),
        ("output.LayerNorm.weight", vec![16]),
    ]
    .into_iter()
    .map(|(n, s)| (format!("{p}{n}"), s))
    .collect();
    let specs: Vec<(&str, &[usize])> = names
        .iter()
        .map(|(n, s)| (n.as_str(), s.as_slice()))
        .collect();
    let mut t = tensors(&specs);
    t.push((
        "embeddings.word_embeddings.weight".into(),
        Tensor::random([8, 16], 99),
    ));
    t
}

#[test]
fn a_bert_layer_loads_as_saved_sharded_or_not_and_runs() {
    let mut all = bert_layer(0);
    all.extend(
        bert_layer(1)
            .into_iter()
            .filter(|(n, _)| n.starts_with("encoder.")),
    );
    // Two tensors of one name cannot be written: an error, not the crate's panic.
    let twice = [("a", &all[0].1), ("a", &all[1].1)];
    assert!(wgpu_mha::io::safetensors::serialize_safetensors(&twice, None).is_err());
    let x = Tensor::random([2, 5, 16], 7);
    for sharded in [false, true] {
        let dir = model_dir(&format!("bert{sharded}"), BERT_CONFIG, &all, sharded);
        let ckpt = HfCheckpoint::open(dir.path()).unwrap();
        let modules = ckpt.modules();
        assert_eq!(modules.len(), 2, "{modules:?}");
        assert_eq!(ckpt.layer_prefix(1).unwrap(), "encoder.layer.1.attention.");
        let m = ckpt.attention("encoder.layer.1.attention.", None).unwrap();
        assert_eq!(
            (m.family, m.config.heads, m.causal, m.cross),
            (Family::Bert, 4, false, false)
        );
        // The weights are the file's, row for row (nn.Linear layout, no transpose).
        let (_, w) = ckpt
            .read("encoder.layer.1.attention.self.key.weight")
            .unwrap();
        assert_eq!(m.weights.k.weight, w);
        let mha = MultiHeadAttention::new(gpu(), m.config, &m.weights).unwrap();
        let got = mha.forward(&x, &x, &x, &Mask::None).unwrap();
        let want = reference::forward(&m.config, &m.weights, &x, &x, &x, &Mask::None).unwrap();
        assert_close("bert layer 1", got.data(), &want.output);
    }
}

#[test]
fn gpt2_conv1d_weights_are_transposed_and_split() {
    let p = "h.0.attn.";
    let specs: [(&str, &[usize]); 4] = [
        ("h.0.attn.c_attn.weight", &[8, 24]),
        ("h.0.attn.c_attn.bias", &[24]),
        ("h.0.attn.c_proj.weight", &[8, 8]),
        ("h.0.attn.c_proj.bias", &[8]),
    ];
    let t = tensors(&specs);
    let dir = model_dir("gpt2", r#"{"model_type": "gpt2", "n_head": 2}"#, &t, false);
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let m = ckpt.attention(p, None).unwrap();
    assert!(m.causal, "GPT-2 self-attention is causal");
    let c_attn = t[0].1.data(); // [in 8, out 24]
                                // W_v row n (an output), column k (an input) is c_attn[k, 16 + n].
    for (n, k) in [(0, 0), (3, 5), (7, 7)] {
        assert_eq!(m.weights.v.weight[n * 8 + k], c_attn[k * 24 + 16 + n]);
    }
    assert_eq!(m.weights.k.bias.as_deref(), Some(&t[1].1.data()[8..16]));
    // A c_attn that is not [E, 3E] says Conv1D is stored transposed.
    let bad = tensors(&[
        ("h.0.attn.c_attn.weight", &[24, 8]),
        ("h.0.attn.c_proj.weight", &[8, 8]),
    ]);
    let dir = model_dir("gpt2bad", r#"{"n_head": 2}"#, &bad, false);
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap_err();
    assert!(err.to_string().contains("transposed"), "{err}");
}

#[test]
fn a_bias_one_projection_lacks_is_zero_there() {
    // whisper: k_proj has no bias; q, v and out do.
    let specs: [(&str, &[usize]); 7] = [
        ("model.encoder.layers.0.self_attn.q_proj.weight", &[8, 8]),
        ("model.encoder.layers.0.self_attn.q_proj.bias", &[8]),
        ("model.encoder.layers.0.self_attn.k_proj.weight", &[8, 8]),
        ("model.encoder.layers.0.self_attn.v_proj.weight", &[8, 8]),
        ("model.encoder.layers.0.self_attn.v_proj.bias", &[8]),
        ("model.encoder.layers.0.self_attn.out_proj.weight", &[8, 8]),
        ("model.encoder.layers.0.self_attn.out_proj.bias", &[8]),
    ];
    let config =
        r#"{"model_type": "whisper", "encoder_attention_heads": 2, "decoder_attention_heads": 4}"#;
    let dir = model_dir("whisper", config, &tensors(&specs), false);
    let m = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention("model.encoder.layers.0.self_attn.", None)
        .unwrap();
    assert_eq!(m.config.heads, 2, "the encoder's head count");
    assert_eq!(m.weights.k.bias, Some(vec![0.0; 8]));
}

#[test]
fn errors_name_the_tensors_under_the_prefix_and_the_modules_found() {
    let dir = model_dir("errors", BERT_CONFIG, &bert_layer(0), false);
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let text = ckpt
        .attention("encoder.layer.0.", None)
        .unwrap_err()
        .to_string();
    for phrase in [
        "no attention module at prefix \"encoder.layer.0.\"",
        "encoder.layer.0.attention.self.query.weight",
        "\"encoder.layer.0.attention.\" (bert)",
    ] {
        assert!(text.contains(phrase), "`{text}` lacks `{phrase}`");
    }
    // Never the whole file's first tensors: the embeddings are not under the prefix.
    assert!(!text.contains("embeddings"), "{text}");
    let text = ckpt.layer_prefix(3).unwrap_err().to_string();
    assert!(text.contains("no attention module in layer 3"), "{text}");
}

#[test]
fn rope_needs_its_config_and_grouped_queries_run() {
    let p = "model.layers.0.self_attn.";
    let llama: [(&str, &[usize]); 4] = [
        ("model.layers.0.self_attn.q_proj.weight", &[16, 16]),
        ("model.layers.0.self_attn.k_proj.weight", &[8, 16]),
        ("model.layers.0.self_attn.v_proj.weight", &[8, 16]),
        ("model.layers.0.self_attn.o_proj.weight", &[16, 16]),
    ];
    // RoPE settings only config.json gives: without it, an error naming why.
    let dir = TempDir::new("llama-noconfig");
    let t = tensors(&llama);
    let refs: Vec<(&str, &Tensor)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let file = dir.path().join("layer.safetensors");
    write_safetensors(&file, &refs, None).unwrap();
    // Without a config nothing says which model saved these names (Cohere's interleaved RoPE,
    // Granite's multiplier): refused, naming what is missing.
    match HfCheckpoint::open(&file).unwrap().attention(p, Some(4)) {
        Err(Error::UnsupportedModule { what, why, .. }) => {
            assert!(what.contains("model_type"), "{what}");
            assert!(why.contains("llama, mistral"), "{why}");
        }
        other => panic!("expected UnsupportedModule, got {other:?}"),
    }
    // A rope_type the engine does not run is refused by name, never approximated.
    let config = r#"{"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_scaling": {"rope_type": "proportional", "factor": 4.0}}"#;
    let dir = model_dir("llama-proportional", config, &t, false);
    match HfCheckpoint::open(dir.path()).unwrap().attention(p, None) {
        Err(Error::UnsupportedModule { what, .. }) => {
            assert!(what.contains("proportional"), "{what}")
        }
        other => panic!("expected UnsupportedModule, got {other:?}"),
    }
    // num_key_value_heads that the shapes contradict is an error, not a guess.
    let config = r#"{"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 1}"#;
    let dir = model_dir("llama-kv", config, &t, false);
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap_err();
    assert!(err.to_string().contains("num_key_value_heads = 1"), "{err}");
    // Fewer key than query outputs in a family without RoPE: grouped-query attention, run.
    let bart: [(&str, &[usize]); 4] = [
        ("enc.self_attn.q_proj.weight", &[16, 16]),
        ("enc.self_attn.k_proj.weight", &[8, 16]),
        ("enc.self_attn.v_proj.weight", &[8, 16]),
        ("enc.self_attn.out_proj.weight", &[16, 16]),
    ];
    let dir = model_dir(
        "gqa",
        r#"{"model_type": "bart", "num_attention_heads": 4}"#,
        &tensors(&bart),
        false,
    );
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let m = ckpt.attention("enc.self_attn.", None).unwrap();
    assert_eq!(
        (m.config.heads, m.config.kv_heads, m.config.qk_head_dim),
        (4, 2, 4)
    );
    let x = Tensor::random([1, 3, 16], 5);
    let mha = MultiHeadAttention::new(gpu(), m.config, &m.weights).unwrap();
    let got = mha.forward(&x, &x, &x, &Mask::None).unwrap();
    let want = reference::forward(&m.config, &m.weights, &x, &x, &x, &Mask::None).unwrap();
    assert_close("gqa", got.data(), &want.output);
    // Key outputs that make no whole number of key/value heads are an error naming them.
    let odd: [(&str, &[usize]); 4] = [
        ("enc.self_attn.q_proj.weight", &[16, 16]),
        ("enc.self_attn.k_proj.weight", &[6, 16]),
        ("enc.self_attn.v_proj.weight", &[6, 16]),
        ("enc.self_attn.out_proj.weight", &[16, 16]),
    ];
    let dir = model_dir(
        "gqaodd",
        r#"{"model_type": "bart", "num_attention_heads": 4}"#,
        &tensors(&odd),
        false,
    );
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention("enc.self_attn.", None)
        .unwrap_err();
    // The message names the stored tensor and the sizes it disagrees with.
    for phrase in [
        "enc.self_attn.k_proj.weight",
        "6 key outputs",
        "head size 4",
    ] {
        assert!(err.to_string().contains(phrase), "{err} lacks {phrase}");
    }
}

#[test]
fn without_a_config_the_heads_must_be_given() {
    // GPT-2's Conv1D layout is the one no other model saves: taken without a config, given
    // the heads.
    let t = tensors(&[
        ("h.0.attn.c_attn.weight", &[8, 24]),
        ("h.0.attn.c_proj.weight", &[8, 8]),
    ]);
    let dir = TempDir::new("noconfig");
    let refs: Vec<(&str, &Tensor)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let file = dir.path().join("layer.safetensors");
    write_safetensors(&file, &refs, None).unwrap();
    let ckpt = HfCheckpoint::open(&file).unwrap();
    let err = ckpt.attention("h.0.attn.", None).unwrap_err();
    assert!(err.to_string().contains("--heads"), "{err}");
    let m = ckpt.attention("h.0.attn.", Some(2)).unwrap();
    assert_eq!((m.config.heads, m.causal), (2, true));
    // BERT's names without a model_type could be RoFormer's (rotary) or BigBird's: refused.
    let t = bert_layer(0);
    let refs: Vec<(&str, &Tensor)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let file = dir.path().join("bert.safetensors");
    write_safetensors(&file, &refs, None).unwrap();
    let err = HfCheckpoint::open(&file)
        .unwrap()
        .attention("encoder.layer.0.attention.", Some(2))
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedModule { .. }), "{err}");
    assert!(err.to_string().contains("RoFormer"), "{err}");
    // A shard the index places outside the directory is refused.
    let dir = TempDir::new("badindex");
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "../elsewhere.safetensors"}}"#,
    )
    .unwrap();
    let err = HfCheckpoint::open(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("not a file beside the index"),
        "{err}"
    );
}

#[test]
fn what_would_change_the_answer_unseen_is_refused() {
    let p = "model.layers.0.self_attn.";
    let llama: Vec<(String, Vec<usize>)> = ["q_proj", "k_proj", "v_proj", "o_proj"]
        .iter()
        .map(|n| (format!("{p}{n}.weight"), vec![16, 16]))
        .collect();
    let specs = |extra: &[(&str, &[usize])]| -> Vec<(String, Tensor)> {
        let mut all: Vec<(&str, &[usize])> = llama
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_slice()))
            .collect();
        all.extend_from_slice(extra);
        tensors(&all)
    };
    let config = r#"{"model_type": "llama", "num_attention_heads": 4}"#;
    // Loads as it is, with RoPE from the config.
    let dir = model_dir("plain", config, &specs(&[]), false);
    assert!(HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap()
        .config
        .rope
        .is_some());
    // q/k normalisation (qwen3, olmo2): a tensor the loader does not know, named.
    let dir = model_dir(
        "qknorm",
        config,
        &specs(&[("model.layers.0.self_attn.q_norm.weight", &[4])]),
        false,
    );
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap_err();
    assert!(err.to_string().contains("q_norm.weight"), "{err}");
    // The same names under another model_type are not taken for Llama's attention.
    let dir = model_dir(
        "qwen3",
        r#"{"model_type": "qwen3", "num_attention_heads": 4}"#,
        &specs(&[]),
        false,
    );
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap_err();
    assert!(err.to_string().contains("qwen3"), "{err}");
    // Soft-capped scores (gemma2) are refused by name.
    let capped =
        r#"{"model_type": "gemma", "num_attention_heads": 4, "attn_logit_softcapping": 50.0}"#;
    let dir = model_dir("softcap", capped, &specs(&[]), false);
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap_err();
    assert!(err.to_string().contains("attn_logit_softcapping"), "{err}");
}

/// Falcon's `query_key_value` in the packing no case file has (`multi_query: false`: per head
/// `[q, k, v]`, as BLOOM's), a transformers 4.x config that gives new_decoder_architecture's
/// groups by `num_kv_heads` alone, and MPT's `attn_config` keys that transformers ignores.
#[test]
fn falcon_packings_follow_the_config_and_mpt_refuses_what_it_ignores() {
    let p = "transformer.h.0.self_attention.";
    let qkv = format!("{p}query_key_value.weight");
    let dense = format!("{p}dense.weight");
    let (qkv, dense) = (qkv.as_str(), dense.as_str());
    let per_head = tensors(&[(qkv, &[48, 16]), (dense, &[16, 16])]);
    let config = r#"{"model_type": "falcon", "num_attention_heads": 4, "multi_query": false}"#;
    let dir = model_dir("falconmha", config, &per_head, false);
    let m = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap();
    assert_eq!((m.config.kv_heads, m.causal), (4, true));
    let w = per_head[0].1.data();
    // Head 2's key (d = 4) is packed row (3·2 + 1)·4 + r.
    for (r, c) in [(0, 0), (3, 15)] {
        assert_eq!(
            m.weights.k.weight[(2 * 4 + r) * 16 + c],
            w[(7 * 4 + r) * 16 + c]
        );
    }
    // Groups of [2 queries, k, v]: num_kv_heads 2 with new_decoder_architecture, no
    // num_key_value_heads (transformers recomputes it from these keys anyway).
    let grouped = tensors(&[(qkv, &[32, 16]), (dense, &[16, 16])]);
    let config = r#"{"model_type": "falcon", "n_head": 4, "num_kv_heads": 2,
        "num_key_value_heads": 1, "new_decoder_architecture": true}"#;
    let dir = model_dir("falcongqa", config, &grouped, false);
    let m = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap();
    assert_eq!(m.config.kv_heads, 2);
    let w = grouped[0].1.data();
    // Query head 3 is group 1's second: row (1·4 + 1)·4; group 1's value: row (1·4 + 3)·4.
    assert_eq!(m.weights.q.weight[3 * 4 * 16], w[5 * 4 * 16]);
    assert_eq!(m.weights.v.weight[4 * 16], w[7 * 4 * 16]);
    // Rows that do not hold the packing the config says are named.
    let config = r#"{"model_type": "falcon", "num_attention_heads": 4}"#;
    let dir = model_dir("falconbad", config, &grouped, false);
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap_err();
    assert!(
        err.to_string().contains(qkv) && err.to_string().contains("1 key/value"),
        "{err}"
    );
    // MPT: an attn_config key transformers ignores is refused by name.
    let p = "transformer.blocks.0.attn.";
    let (wqkv, out) = (format!("{p}Wqkv.weight"), format!("{p}out_proj.weight"));
    let mpt = tensors(&[(wqkv.as_str(), &[48, 16]), (out.as_str(), &[16, 16])]);
    let config = r#"{"model_type": "mpt", "n_heads": 4, "attn_config": {"qk_ln": true}}"#;
    let dir = model_dir("mptqkln", config, &mpt, false);
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(p, None)
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedModule { .. }), "{err}");
    assert!(err.to_string().contains("attn_config.qk_ln"), "{err}");
}
