//! The loader's rules for issue 38's Llama 4 and gated/clipped families, read from their config
//! classes: which layers are chunked, rotate, normalise q and k or tune the temperature, the
//! defaults of absent keys, and the settings and inputs they refuse by name. transformers' own
//! answers are the case files of `tests/fixtures/hf` (checked by `tests/hf.rs`).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::hf_dirs::{model_dir, tensors};
use serde_json::{json, Value};
use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{Error, Mask, MaskTensor, Result, Tensor};

fn at(layer: usize) -> String {
    format!("model.layers.{layer}.self_attn.")
}

/// Llama-named projections (E = 16, 4 heads of 4) at `prefix`, plus `extra` tensors.
fn llama(prefix: &str, extra: &[(&str, &[usize])]) -> Vec<(String, Tensor)> {
    let names: Vec<(String, Vec<usize>)> = ["q_proj", "k_proj", "v_proj", "o_proj"]
        .iter()
        .map(|n| (format!("{prefix}{n}.weight"), vec![16, 16]))
        .chain(
            extra
                .iter()
                .map(|(n, s)| (format!("{prefix}{n}"), s.to_vec())),
        )
        .collect();
    let specs: Vec<(&str, &[usize])> = names.iter().map(|(n, s)| (n.as_str(), &s[..])).collect();
    tensors(&specs)
}

fn load_at(layer: usize, config: &Value, extra: &[(&str, &[usize])]) -> Result<HfAttention> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let tag = format!("round3-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let dir = model_dir(&tag, &config.to_string(), &llama(&at(layer), extra), false);
    HfCheckpoint::open(dir.path())?.attention(&at(layer), None)
}

fn llama4(patch: Value) -> Value {
    let mut c =
        json!({"model_type": "llama4_text", "num_attention_heads": 4, "num_hidden_layers": 4});
    for (k, v) in patch.as_object().expect("object") {
        c[k] = v.clone();
    }
    c
}

#[test]
fn llama4_layers_follow_its_config_class() {
    // Defaults: every fourth layer NoPE; the others rotate (interleaved, θ 5·10^5), attend in
    // chunks of 8192 and normalise q and k (weightless, after RoPE); the NoPE layer tunes the
    // temperature (8192, 0.1).
    let rope = load_at(0, &llama4(json!({})), &[]).unwrap();
    let r = rope.config.rope.expect("rope");
    assert!(r.interleaved && r.theta == 5e5);
    assert_eq!(rope.chunk, Some(8192));
    let norm = rope.config.qk_norm.expect("norm");
    assert!(norm.after_rope && norm.eps == 1e-5);
    assert_eq!(rope.weights.qk_norm.expect("weights").q, vec![1.0; 4]);
    assert!(rope.config.temperature.is_none());
    let nope = load_at(3, &llama4(json!({})), &[]).unwrap();
    assert!(nope.is_nope_layer() && nope.chunk.is_none() && nope.config.qk_norm.is_none());
    let t = nope.config.temperature.expect("temperature");
    assert_eq!((t.floor_scale, t.attn_scale), (8192.0, 0.1));
    // The config's own lists and switches.
    let set = llama4(json!({
        "no_rope_layers": [0, 1, 1, 1], "use_qk_norm": false, "attn_temperature_tuning": false,
        "attention_chunk_size": null, "rope_parameters": {"rope_type": "default", "rope_theta": 10.0}
    }));
    let m = load_at(0, &set, &[]).unwrap();
    assert!(m.is_nope_layer() && m.config.temperature.is_none());
    let m = load_at(1, &set, &[]).unwrap();
    assert!(m.chunk.is_none() && m.config.qk_norm.is_none());
    assert_eq!(m.config.rope.unwrap().theta, 10.0);
    // layer_types decides the chunks; a chunked layer needs a chunk size.
    let typed = llama4(json!({"attention_chunk_size": 5, "layer_types":
        ["full_attention", "chunked_attention", "chunked_attention", "full_attention"]}));
    assert_eq!(load_at(0, &typed, &[]).unwrap().chunk, None);
    assert_eq!(load_at(1, &typed, &[]).unwrap().chunk, Some(5));
    let no_size = llama4(json!({"attention_chunk_size": null, "layer_types":
        ["chunked_attention", "full_attention", "full_attention", "full_attention"]}));
    let err = load_at(0, &no_size, &[]).unwrap_err().to_string();
    assert!(err.contains("attention_chunk_size"), "{err}");
    let sliding = llama4(json!({"layer_types":
        ["sliding_attention", "full_attention", "full_attention", "full_attention"]}));
    assert!(matches!(
        load_at(0, &sliding, &[]),
        Err(Error::UnsupportedModule { .. })
    ));
    // Its norm has no weights: a q_norm tensor is not Llama 4's.
    let err = load_at(0, &llama4(json!({})), &[("q_norm.weight", &[4])]).unwrap_err();
    assert!(err.to_string().contains("q_norm.weight"), "{err}");
    // A bad floor_scale is named.
    let err = load_at(3, &llama4(json!({"floor_scale": 0})), &[]).unwrap_err();
    assert!(err.to_string().contains("floor_scale"), "{err}");
}

#[test]
fn llama4_settings_are_refused_by_other_model_types() {
    let llama = |patch: Value| {
        let mut c = json!({"model_type": "llama", "num_attention_heads": 4});
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        load_at(0, &c, &[])
    };
    assert!(llama(json!({"attention_chunk_size": null, "attn_temperature_tuning": false})).is_ok());
    for patch in [
        json!({"attention_chunk_size": 8192}),
        json!({"attn_temperature_tuning": true}),
    ] {
        let err = llama(patch.clone()).unwrap_err();
        let key = patch.as_object().unwrap().keys().next().unwrap().clone();
        assert!(
            matches!(&err, Error::UnsupportedModule { what, .. } if what.contains(&key)),
            "{err}"
        );
    }
}

#[test]
fn a_chunked_layer_refuses_left_padding() {
    let m = load_at(0, &llama4(json!({"attention_chunk_size": 2})), &[]).unwrap();
    let dims = AttnDims {
        batch: 2,
        heads: 4,
        lq: 3,
        lk: 3,
    };
    let right = MaskTensor::new([2, 3], vec![1, 1, 1, 1, 1, 0]).unwrap();
    assert!(matches!(
        m.mask(dims, Some(&right)).unwrap(),
        Mask::Chunked {
            chunk: 2,
            keep: Some(_)
        }
    ));
    let left = MaskTensor::new([2, 3], vec![1, 1, 1, 0, 1, 1]).unwrap();
    let err = m.mask(dims, Some(&left)).unwrap_err();
    assert!(
        matches!(&err, Error::Mask(s) if s.contains("left padding")),
        "{err}"
    );
}

/// DBRX's `Wqkv` `[(H + 2·H_kv)·d, E]` and `out_proj` at layer 0 (E = 16, 4 heads of 4).
fn load_dbrx(config: Value, kv_heads: usize) -> Result<HfAttention> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let tag = format!("round3-dbrx-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let p = "transformer.blocks.0.norm_attn_norm.attn.";
    let (wqkv, out) = (format!("{p}Wqkv.weight"), format!("{p}out_proj.weight"));
    let t = tensors(&[(&wqkv, &[16 + 8 * kv_heads, 16]), (&out, &[16, 16])]);
    let dir = model_dir(&tag, &config.to_string(), &t, false);
    HfCheckpoint::open(dir.path())?.attention(p, None)
}

#[test]
fn dbrx_reads_its_attn_config() {
    let dbrx = |attn: Value| json!({"model_type": "dbrx", "n_heads": 4, "d_model": 16, "attn_config": attn});
    // kv_n_heads defaults to 1; RoPE θ 10000 by default; no clip unless attn_config says.
    let m = load_dbrx(dbrx(json!({})), 1).unwrap();
    assert_eq!(m.config.kv_heads, 1);
    assert_eq!(m.config.rope.expect("rope").theta, 10000.0);
    assert!(m.config.clip_qkv.is_none() && m.config.alibi.is_none() && m.causal);
    let m = load_dbrx(
        dbrx(json!({"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 10000.0})),
        2,
    );
    let m = m.unwrap();
    assert_eq!((m.config.kv_heads, m.config.clip_qkv), (2, Some(8.0)));
    // attn_config's kv_n_heads wins over a top-level num_key_value_heads, as DbrxConfig sets it.
    let mut both = dbrx(json!({"kv_n_heads": 2}));
    both["num_key_value_heads"] = json!(4);
    assert_eq!(load_dbrx(both, 2).unwrap().config.kv_heads, 2);
    // transformers rotates by rope_parameters' θ and ignores attn_config's: a mismatch is refused.
    let err = load_dbrx(dbrx(json!({"rope_theta": 500000})), 1).unwrap_err();
    assert!(
        matches!(&err, Error::UnsupportedModule { what, .. } if what.contains("attn_config.rope_theta")),
        "{err}"
    );
    let mut agreed = dbrx(json!({"rope_theta": 500000}));
    agreed["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 500000});
    assert_eq!(
        load_dbrx(agreed, 1).unwrap().config.rope.unwrap().theta,
        5e5
    );
    // Wqkv rows that are not (H + 2·H_kv) heads are named.
    let err = load_dbrx(dbrx(json!({"kv_n_heads": 3})), 1).unwrap_err();
    assert!(err.to_string().contains("Wqkv.weight"), "{err}");
}

#[test]
fn jamba_attends_without_positions_and_its_mamba_layers_are_not_attention() {
    let jamba = json!({"model_type": "jamba", "num_attention_heads": 4, "rope_theta": 10000});
    let m = load_at(1, &jamba, &[]).unwrap();
    assert!(m.config.rope.is_none() && m.is_nope_layer() && m.causal);
    // JambaAttention builds no biases.
    let err = load_at(1, &jamba, &[("q_proj.bias", &[16])]).unwrap_err();
    assert!(err.to_string().contains("q_proj.bias"), "{err}");
    // A Mamba layer's prefix holds no attention module: named, with the modules there are.
    let mut t = llama(&at(1), &[]);
    t.extend(tensors(&[(
        "model.layers.0.mamba.in_proj.weight",
        &[64, 16],
    )]));
    let dir = model_dir("round3-jamba-mamba", &jamba.to_string(), &t, false);
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let err = ckpt
        .attention("model.layers.0.mamba.", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no attention module") && err.contains("model.layers.1.self_attn."),
        "{err}"
    );
}

#[test]
fn qwen3_next_splits_its_gate_from_q_proj_and_names_its_linear_layers() {
    let next = json!({"model_type": "qwen3_next", "num_attention_heads": 4, "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"], "partial_rotary_factor": 0.5});
    // q_proj [H·2d, E] = [32, 16] with d = 4: per head 4 query rows, then 4 gate rows.
    let mut t = tensors(&[
        ("model.layers.1.self_attn.q_proj.weight", &[32, 16]),
        ("model.layers.1.self_attn.k_proj.weight", &[16, 16]),
        ("model.layers.1.self_attn.v_proj.weight", &[16, 16]),
        ("model.layers.1.self_attn.o_proj.weight", &[16, 16]),
        ("model.layers.1.self_attn.q_norm.weight", &[4]),
        ("model.layers.1.self_attn.k_norm.weight", &[4]),
        ("model.layers.0.linear_attn.in_proj_qkvz.weight", &[48, 16]),
    ]);
    let dir = model_dir("round3-qwen3-next", &next.to_string(), &t, false);
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let m = ckpt.attention(&at(1), None).unwrap();
    assert!(m.config.output_gate && m.config.qk_head_dim == 4);
    let norm = m.config.qk_norm.expect("norm");
    assert_eq!(norm.weight_offset, 1.0);
    assert_eq!(m.config.rope.expect("rope").rotary_dims, 2);
    // Head 1's gate rows are q_proj's rows 12..16.
    let (_, q) = &t[0];
    let gate = m.weights.gate.as_ref().expect("gate");
    assert_eq!(&gate.weight[4 * 16..8 * 16], &q.data()[12 * 16..16 * 16]);
    assert_eq!(
        &m.weights.q.weight[4 * 16..8 * 16],
        &q.data()[8 * 16..12 * 16]
    );
    // The Gated DeltaNet layer is named as what it is.
    let err = ckpt
        .attention("model.layers.0.linear_attn.", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("linear_attention"), "{err}");
    // A q_proj that is not whole query and gate heads is named.
    t[0] = tensors(&[("model.layers.1.self_attn.q_proj.weight", &[36, 16])]).remove(0);
    let dir = model_dir("round3-qwen3-next-odd", &next.to_string(), &t, false);
    let err = HfCheckpoint::open(dir.path())
        .unwrap()
        .attention(&at(1), None)
        .unwrap_err();
    assert!(err.to_string().contains("q_proj.weight"), "{err}");
}

#[test]
fn bitnet_normalises_its_output_and_refuses_quantized_checkpoints() {
    let bitnet = json!({"model_type": "bitnet", "num_attention_heads": 4});
    let m = load_at(0, &bitnet, &[("attn_sub_norm.weight", &[16])]).unwrap();
    assert_eq!(m.config.output_norm, Some(1e-5));
    assert_eq!(m.weights.output_norm.as_ref().map(Vec::len), Some(16));
    assert_eq!(m.config.rope.unwrap().theta, 5e5);
    let err = load_at(0, &bitnet, &[]).unwrap_err().to_string();
    assert!(
        err.contains("attn_sub_norm.weight") && err.contains("missing"),
        "{err}"
    );
    let err = load_at(0, &bitnet, &[("attn_sub_norm.weight", &[8])]).unwrap_err();
    assert!(err.to_string().contains("attn_sub_norm.weight"), "{err}");
    // BitLinear quantizes in transformers' forward: refused, here and for any model type.
    for model_type in ["bitnet", "llama"] {
        let mut quantized = bitnet.clone();
        quantized["model_type"] = json!(model_type);
        quantized["quantization_config"] =
            json!({"quant_method": "bitnet", "linear_class": "autobitlinear"});
        let err = load_at(0, &quantized, &[("attn_sub_norm.weight", &[16])]).unwrap_err();
        assert!(
            matches!(&err, Error::UnsupportedModule { what, .. } if what.contains("quantization_config")),
            "{model_type}: {err}"
        );
    }
}
