//! Issue 38's group 3 (glm, glm4, nemotron, persimmon): each model type's config-class
//! defaults (the rotating share, θ, biases) and what it refuses. transformers' own answers are
//! the case files of `tools/gen_hf_cases.py --only glm`, checked by `tests/hf.rs`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::hf_dirs::{model_dir, tensors};
use serde_json::{json, Value};
use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::{Result, Tensor};

const P: &str = "model.layers.0.self_attn.";

fn tag(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("partial-{what}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Llama-named projections at `P`: E = 16, 2 heads of 8; `biases` names the projections
/// with a bias.
fn llama(biases: &[&str]) -> Vec<(String, Tensor)> {
    let mut specs: Vec<(String, Vec<usize>)> = ["q_proj", "k_proj", "v_proj", "o_proj"]
        .iter()
        .map(|n| (format!("{P}{n}.weight"), vec![16, 16]))
        .collect();
    specs.extend(biases.iter().map(|b| (format!("{P}{b}.bias"), vec![16])));
    let refs: Vec<(&str, &[usize])> = specs.iter().map(|(n, s)| (n.as_str(), &s[..])).collect();
    tensors(&refs)
}

fn load(config: &Value, t: &[(String, Tensor)]) -> Result<HfAttention> {
    let dir = model_dir(&tag("load"), &config.to_string(), t, false);
    HfCheckpoint::open(dir.path())?.attention(P, None)
}

fn base(model_type: &str) -> Value {
    json!({"model_type": model_type, "num_attention_heads": 2})
}

fn with(mut c: Value, patch: Value) -> Value {
    for (k, v) in patch.as_object().expect("object") {
        c[k] = v.clone();
    }
    c
}

const QKV: [&str; 3] = ["q_proj", "k_proj", "v_proj"];
const ALL: [&str; 4] = ["q_proj", "k_proj", "v_proj", "o_proj"];

#[test]
fn glm_and_glm4_rotate_interleaved_half_heads_with_qkv_biases() {
    for t in ["glm", "glm4"] {
        // GlmConfig: partial_rotary_factor 0.5, θ 10000, attention_bias true (q, k, v only).
        let m = load(&base(t), &llama(&QKV)).unwrap();
        let rope = m.config.rope.unwrap();
        assert_eq!((rope.rotary_dims, rope.theta), (4, 10_000.0), "{t}");
        assert!(rope.interleaved && m.causal, "{t}");
        let err = load(&base(t), &llama(&ALL)).unwrap_err().to_string();
        assert!(err.contains("o_proj.bias"), "{t}: {err}");
        let unbiased = with(base(t), json!({"attention_bias": false}));
        assert!(load(&unbiased, &llama(&[])).is_ok(), "{t}");
        assert!(load(&unbiased, &llama(&QKV)).is_err(), "{t}");
        // transformers 5's spelling inside rope_parameters, and 4.x's at the top level.
        let quarter = with(
            base(t),
            json!({"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                   "partial_rotary_factor": 0.25}}),
        );
        let rope = load(&quarter, &llama(&QKV)).unwrap().config.rope.unwrap();
        assert_eq!((rope.rotary_dims, rope.theta), (2, 500.0), "{t}");
        let whole = with(base(t), json!({"partial_rotary_factor": 1.0}));
        let rope = load(&whole, &llama(&QKV)).unwrap().config.rope.unwrap();
        assert_eq!(rope.rotary_dims, 8, "{t}");
        // Keys GlmConfig has not are refused by name.
        let err = load(&with(base(t), json!({"sliding_window": 4})), &llama(&QKV))
            .unwrap_err()
            .to_string();
        assert!(err.contains("sliding_window"), "{t}: {err}");
    }
}

#[test]
fn nemotron_rotates_half_split_half_heads_with_biases_by_attention_bias() {
    let m = load(&base("nemotron"), &llama(&[])).unwrap();
    let rope = m.config.rope.unwrap();
    assert_eq!((rope.rotary_dims, rope.theta), (4, 10_000.0));
    assert!(!rope.interleaved);
    assert!(load(&base("nemotron"), &llama(&QKV)).is_err());
    let biased = with(base("nemotron"), json!({"attention_bias": true}));
    assert!(load(&biased, &llama(&ALL)).is_ok());
    let quarter = with(base("nemotron"), json!({"partial_rotary_factor": 0.25}));
    let rope = load(&quarter, &llama(&[])).unwrap().config.rope.unwrap();
    assert_eq!(rope.rotary_dims, 2);
}

/// Persimmon's layout at `P`: `query_key_value` `[3E, E]` (E = 16, 2 heads of 8) and
/// `dense`, both biased, plus `norms` (names under `P` with their shapes).
fn persimmon(norms: &[(&str, usize)]) -> Vec<(String, Tensor)> {
    let mut specs: Vec<(String, Vec<usize>)> = vec![
        (format!("{P}query_key_value.weight"), vec![48, 16]),
        (format!("{P}query_key_value.bias"), vec![48]),
        (format!("{P}dense.weight"), vec![16, 16]),
        (format!("{P}dense.bias"), vec![16]),
    ];
    specs.extend(norms.iter().map(|(n, len)| (format!("{P}{n}"), vec![*len])));
    let refs: Vec<(&str, &[usize])> = specs.iter().map(|(n, s)| (n.as_str(), &s[..])).collect();
    tensors(&refs)
}

const NORMS: [(&str, usize); 4] = [
    ("q_layernorm.weight", 8),
    ("q_layernorm.bias", 8),
    ("k_layernorm.weight", 8),
    ("k_layernorm.bias", 8),
];

#[test]
fn persimmon_normalises_q_and_k_with_biased_layer_norms_before_partial_rope() {
    // PersimmonConfig: qk_layernorm true, layer_norm_eps 1e-5, partial_rotary_factor 0.5.
    let m = load(&base("persimmon"), &persimmon(&NORMS)).unwrap();
    let norm = m.config.qk_norm.unwrap();
    assert_eq!(norm.eps, 1e-5);
    let w = m.weights.qk_norm.as_ref().unwrap();
    assert_eq!((w.q_bias.len(), w.k_bias.len()), (8, 8));
    let rope = m.config.rope.unwrap();
    assert_eq!((rope.rotary_dims, rope.theta), (4, 10_000.0));
    assert!(!rope.interleaved && m.causal);
    // Each norm tensor is needed, named when missing.
    for skip in 0..4 {
        let mut some = NORMS.to_vec();
        let (gone, _) = some.remove(skip);
        let err = load(&base("persimmon"), &persimmon(&some))
            .unwrap_err()
            .to_string();
        assert!(err.contains(gone) && err.contains("missing"), "{err}");
    }
    // A bias as long as no weight is refused.
    let mut short = NORMS.to_vec();
    short[3].1 = 7;
    assert!(load(&base("persimmon"), &persimmon(&short)).is_err());
    // qk_layernorm false: no norm, and norm tensors transformers would not build are refused.
    let off = with(base("persimmon"), json!({"qk_layernorm": false}));
    assert!(load(&off, &persimmon(&[]))
        .unwrap()
        .config
        .qk_norm
        .is_none());
    assert!(load(&off, &persimmon(&NORMS)).is_err());
    // Its projections are always biased.
    let mut t = persimmon(&NORMS);
    t.retain(|(n, _)| !n.ends_with("dense.bias"));
    assert!(load(&base("persimmon"), &t).is_err());
}
