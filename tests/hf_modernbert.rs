//! ModernBERT (issue 38's encoders): the loader takes ModernBertConfig's defaults (layer kinds,
//! the two-sided window, θ per kind, no biases) and refuses what it does not read.
//! transformers' own answers are the `modernbert_*` case files, checked by `tests/hf.rs`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::hf_dirs::{model_dir, tensors};
use serde_json::{json, Value};
use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{Mask, Result, Tensor};

fn prefix(layer: usize) -> String {
    format!("model.layers.{layer}.attn.")
}

/// `Wqkv` `[48, 16]` and `Wo` `[16, 16]` (2 heads of 8) of layers 0 and 1, biased by `bias`.
fn modernbert(bias: bool) -> Vec<(String, Tensor)> {
    let mut specs: Vec<(String, Vec<usize>)> = Vec::new();
    for layer in 0..2 {
        let p = prefix(layer);
        specs.push((format!("{p}Wqkv.weight"), vec![48, 16]));
        specs.push((format!("{p}Wo.weight"), vec![16, 16]));
        if bias {
            specs.push((format!("{p}Wqkv.bias"), vec![48]));
            specs.push((format!("{p}Wo.bias"), vec![16]));
        }
    }
    let refs: Vec<(&str, &[usize])> = specs.iter().map(|(n, s)| (n.as_str(), &s[..])).collect();
    tensors(&refs)
}

fn load(config: &Value, t: &[(String, Tensor)], layer: usize) -> Result<HfAttention> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let tag = format!("modernbert-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let dir = model_dir(&tag, &config.to_string(), t, false);
    HfCheckpoint::open(dir.path())?.attention(&prefix(layer), None)
}

fn base() -> Value {
    json!({"model_type": "modernbert", "num_attention_heads": 2, "num_hidden_layers": 2})
}

#[test]
fn modernbert_takes_its_config_class_defaults() {
    // Layer 0 global (θ 160000, every key), layer 1 local (θ 10000, |i − j| ≤ 128 / 2).
    let global = load(&base(), &modernbert(false), 0).unwrap();
    let local = load(&base(), &modernbert(false), 1).unwrap();
    assert!(!global.causal && !local.causal);
    assert_eq!(global.window, None);
    assert_eq!(local.window, Some(64));
    let theta = |m: &HfAttention| m.config.rope.unwrap().theta;
    assert_eq!((theta(&global), theta(&local)), (160_000.0, 10_000.0));
    assert_eq!(local.config.rope.unwrap().rotary_dims, 8);
    // The local layer's mask: a band two keys wide each way with local_attention 4.
    let mut narrow = base();
    narrow["local_attention"] = json!(4);
    let m = load(&narrow, &modernbert(false), 1).unwrap();
    let dims = AttnDims {
        batch: 1,
        heads: 2,
        lq: 6,
        lk: 6,
    };
    let Mask::Attend(band) = m.mask(dims, None).unwrap() else {
        panic!("a local layer's mask is a band")
    };
    for i in 0..6 {
        for j in 0..6 {
            let seen = band.data()[i * 6 + j] != 0;
            assert_eq!(seen, i.abs_diff(j) <= 2, "({i}, {j})");
        }
    }
    let full = load(&narrow, &modernbert(false), 0).unwrap();
    assert_eq!(full.mask(dims, None).unwrap(), Mask::None);
}

#[test]
fn modernbert_biases_follow_attention_bias_and_unread_keys_are_refused() {
    assert!(load(&base(), &modernbert(true), 1).is_err());
    let mut biased = base();
    biased["attention_bias"] = json!(true);
    assert!(load(&biased, &modernbert(true), 1).is_ok());
    assert!(load(&biased, &modernbert(false), 1).is_err());
    // ModernBertConfig's sliding_window is a derived property, not a key it reads.
    let mut window = base();
    window["sliding_window"] = json!(3);
    let err = load(&window, &modernbert(false), 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sliding_window"), "{err}");
    // layer_types is read: here layer 0 is the local one.
    let mut typed = base();
    typed["layer_types"] = json!(["sliding_attention", "full_attention"]);
    assert_eq!(
        load(&typed, &modernbert(false), 0).unwrap().window,
        Some(64)
    );
    assert_eq!(load(&typed, &modernbert(false), 1).unwrap().window, None);
}
