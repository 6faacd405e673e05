//! Issue 38's encoder long tail (transformers 5.25): `run --hf` on each case file as a one-file
//! checkpoint (its `hf_config` metadata is the config) gives transformers' answer, and
//! `inspect` names what each module is. (tests/hf.rs runs the same files on both paths.)

mod common;

use common::hf_cases::{hf_case, inspect_and_run};
use common::hf_dirs::model_dir;
use serde_json::{json, Value};
use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::model::mask::{AttnDims, MaskTensor};
use wgpu_mha::{Result, SafetensorsFile, Tensor};

#[test]
fn megatron_bert_runs_after_its_input_norm() {
    inspect_and_run(
        "megatron_bert_self_layer1_padding_pre_norm",
        &[
            "model_type megatron-bert",
            "input_norm=encoder.layer.1.attention.ln (not computed",
        ],
    );
}

#[test]
fn bert_copies_run_as_bert() {
    inspect_and_run(
        "data2vec_text_self_layer1_padding",
        &["model_type data2vec-text", "self  E=32 heads=4"],
    );
    inspect_and_run(
        "layoutlm_self_layer1_padding",
        &["model_type layoutlm", "self  E=32 heads=4"],
    );
}

#[test]
fn esm_rotates_after_its_input_norm() {
    inspect_and_run(
        "esm_self_layer1_padding_pre_norm_rotary",
        &[
            "model_type esm",
            "input_norm=encoder.layer.1.attention.LayerNorm (not computed",
            "rope(θ=1000,",
        ],
    );
}

/// The module of case file `case` loaded from a model directory of its tensors with its
/// config patched by `patch` (keys set; null removes).
fn load_patched(case: &str, tag: &str, patch: Value) -> Result<HfAttention> {
    load_without(case, tag, patch, "")
}

/// As `load_patched`, without the tensors whose names end with `drop` (if not empty).
fn load_without(case: &str, tag: &str, patch: Value, drop: &str) -> Result<HfAttention> {
    let file = SafetensorsFile::open(hf_case(case))?;
    let prefix = file.metadata("prefix").expect("prefix").to_string();
    let mut config: Value = serde_json::from_str(file.metadata("hf_config").unwrap()).unwrap();
    let object = config.as_object_mut().unwrap();
    for (k, v) in patch.as_object().expect("object") {
        match v.is_null() {
            true => object.remove(k),
            false => object.insert(k.clone(), v.clone()),
        };
    }
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    // The model's tensors (dotted names: the module's and those beside it), not the inputs.
    let kept = |n: &&str| n.contains('.') && (drop.is_empty() || !n.ends_with(drop));
    for name in file.names().into_iter().filter(kept) {
        tensors.push((name.to_string(), file.tensor_f32(name)?));
    }
    let tag = format!("enc-{tag}-{}", std::process::id());
    let dir = model_dir(&tag, &config.to_string(), &tensors, false);
    HfCheckpoint::open(dir.path())?.attention(&prefix, None)
}

#[test]
fn esm_rotates_only_when_its_config_says_rotary() {
    let esm = "esm_self_layer1_padding_pre_norm_rotary";
    let m = load_patched(esm, "rotary", json!({})).expect("rotary");
    assert!(m.config.rope.is_some());
    for (tag, value) in [("absolute", json!("absolute")), ("none", Value::Null)] {
        let m = load_patched(esm, tag, json!({"position_embedding_type": value}));
        assert!(m.expect(tag).config.rope.is_none(), "{tag}");
    }
    let patch = json!({"position_embedding_type": "relative_key"});
    let e = load_patched(esm, "relative", patch).expect_err("relative_key");
    assert!(e.to_string().contains("relative_key"), "{e}");
}

#[test]
fn an_input_norm_is_taken_only_by_the_model_types_that_have_one() {
    // megatron-bert's `ln` under a bert module is a tensor bert does not have.
    let megatron = "megatron_bert_self_layer1_padding_pre_norm";
    let e = load_patched(megatron, "as-bert", json!({"model_type": "bert"})).expect_err("ln");
    assert!(e.to_string().contains("attention.ln."), "{e}");
    let patch = json!({"model_type": "megatron-bert", "position_embedding_type": null});
    let esm = "esm_self_layer1_padding_pre_norm_rotary";
    let e = load_patched(esm, "as-megatron", patch).expect_err("LayerNorm");
    assert!(e.to_string().contains("attention.LayerNorm."), "{e}");
}

#[test]
fn bart_copies_run_as_bart() {
    for (case, phrases) in [
        ("sew_self_layer1", &["model_type sew", "self  E=32"][..]),
        (
            "unispeech_self_layer1",
            &["model_type unispeech", "self  E=32"],
        ),
        (
            "musicgen_decoder_self_layer1_causal_padding",
            &["model_type musicgen_decoder", "self causal"],
        ),
        (
            "nllb_moe_encoder_self_layer0_padding",
            &["model_type nllb-moe", "self  E=32"],
        ),
        ("nllb_moe_decoder_self_layer1_causal", &["self causal"]),
        (
            "nllb_moe_decoder_cross_layer0_padding",
            &["decoder.layers.0.cross_attention.  cross"],
        ),
    ] {
        inspect_and_run(case, phrases);
    }
}

#[test]
fn umt5_reads_the_relative_bias_of_each_layer() {
    let enc = "umt5_encoder_self_block1_padding";
    inspect_and_run(
        enc,
        &[
            "model_type umt5",
            "scale=1 relative_bias(buckets=8, max_distance=20, bidirectional)",
        ],
    );
    inspect_and_run(
        "umt5_decoder_self_block1_causal_padding",
        &["self causal", "one-way"],
    );
    // Block 1 without its own table is refused, never given another layer's.
    let drop = "relative_attention_bias.weight";
    let e = load_without(enc, "umt5-no-table", json!({}), drop).expect_err("no table");
    assert!(
        e.to_string()
            .contains("block.1.layer.0.SelfAttention.relative_attention_bias"),
        "{e}"
    );
}

#[test]
fn beit_adds_its_relative_position_bias_over_the_patch_grid() {
    let beit = "beit_self_layer1_relative_bias";
    inspect_and_run(beit, &["model_type beit", "grid_bias(tokens=5)"]);
    let shared = "data2vec_vision_self_layer1_shared_relative_bias";
    inspect_and_run(
        shared,
        &["model_type data2vec-vision", "grid_bias(tokens=5)"],
    );
    // Another image size makes another table shape: refused naming the table.
    let e = load_patched(beit, "beit-grid", json!({"image_size": 12})).expect_err("grid");
    assert!(
        e.to_string().contains("relative_position_bias_table"),
        "{e}"
    );
    // Switched off: no bias (the stored table is not read).
    let off = json!({"use_relative_position_bias": false});
    let m = load_patched(beit, "beit-off", off).expect("no bias");
    assert!(m.grid_bias.is_none());
    // Inputs of another length than the grid's tokens are refused by the mask.
    let m = load_patched(beit, "beit-len", json!({})).expect("beit");
    let dims = AttnDims {
        batch: 1,
        heads: 4,
        lq: 4,
        lk: 4,
    };
    let e = m.mask(dims, None).expect_err("length");
    assert!(e.to_string().contains("patch grid"), "{e}");
    // A shared table missing from the checkpoint is named.
    let e = load_without(
        shared,
        "d2v-no-table",
        json!({}),
        "relative_position_bias_table",
    )
    .expect_err("no shared table");
    assert!(
        e.to_string().contains("encoder.relative_position_bias"),
        "{e}"
    );
}

#[test]
fn wavlm_gates_layer_0s_relative_bias_by_its_input() {
    let wavlm = "wavlm_self_layer1_padding_gated_bias";
    inspect_and_run(wavlm, &["model_type wavlm", "gated_relative_bias"]);
    // The bias is made from the input: the input-free mask is refused, never wrong.
    let m = load_patched(wavlm, "wavlm-mask", json!({})).expect("wavlm");
    let dims = AttnDims {
        batch: 2,
        heads: 4,
        lq: 9,
        lk: 9,
    };
    assert!(m.mask(dims, None).is_err());
    // Inputs of another width are refused by mask_for.
    let x = Tensor::new([2, 9, 16], vec![0.0; 2 * 9 * 16]).unwrap();
    assert!(m.mask_for(&x, dims, None).is_err());
    // Layer 0's table is required; far buckets whose share would be negative are refused.
    let e = load_without(wavlm, "wavlm-no-table", json!({}), "rel_attn_embed.weight")
        .expect_err("no table");
    assert!(
        e.to_string().contains("layers.0.attention.rel_attn_embed"),
        "{e}"
    );
    let near = json!({"max_bucket_distance": 4});
    let e = load_patched(wavlm, "wavlm-near", near).expect_err("max distance");
    assert!(e.to_string().contains("max_bucket_distance"), "{e}");
}

#[test]
fn longt5_encoder_attends_locally_with_block_0s_bias() {
    let longt5 = "longt5_encoder_self_block1_local";
    inspect_and_run(
        longt5,
        &["model_type longt5", "local(block=3)", "bidirectional"],
    );
    let decoder = "longt5_decoder_self_block0_causal_padding";
    inspect_and_run(decoder, &["self causal", "one-way"]);
    let m = load_patched(longt5, "longt5", json!({})).expect("longt5");
    // Padding masks LongT5's queries too: refused, never answered as a key mask.
    let dims = AttnDims {
        batch: 1,
        heads: 4,
        lq: 8,
        lk: 8,
    };
    let mut keep = vec![1u8; 8];
    keep[7] = 0;
    let pad = MaskTensor::new([1, 8], keep).unwrap();
    let e = m.mask(dims, Some(&pad)).expect_err("padding");
    assert!(e.to_string().contains("padding"), "{e}");
    assert!(m.mask(dims, None).is_ok());
    let tglobal = json!({"encoder_attention_type": "transient-global"});
    let e = load_patched(longt5, "longt5-tglobal", tglobal).expect_err("transient-global");
    assert!(e.to_string().contains("transient-global"), "{e}");
}

/// Wild values of the keys the encoders read: an error naming the problem, never a panic.
#[test]
fn wild_encoder_settings_are_errors_not_panics() {
    let huge = json!(u64::MAX);
    for (case, key) in [
        ("beit_self_layer1_relative_bias", "image_size"),
        ("beit_self_layer1_relative_bias", "patch_size"),
        ("wavlm_self_layer1_padding_gated_bias", "num_buckets"),
        (
            "wavlm_self_layer1_padding_gated_bias",
            "max_bucket_distance",
        ),
        ("longt5_encoder_self_block1_local", "local_radius"),
        (
            "esm_self_layer1_padding_pre_norm_rotary",
            "position_embedding_type",
        ),
    ] {
        let values = [
            json!(0),
            json!(-3),
            json!(1e30),
            json!("x"),
            json!([2, 2, 2]),
            json!([0, 8]),
            huge.clone(),
        ];
        for (n, value) in values.into_iter().enumerate() {
            let tag = format!("wild-{key}-{n}");
            if let Ok(m) = load_patched(case, &tag, json!({ key: value })) {
                // Whatever loads builds its mask for some shape or refuses it.
                let dims = AttnDims {
                    batch: 1,
                    heads: 4,
                    lq: 5,
                    lk: 5,
                };
                let _ = m.mask(dims, None);
            }
        }
    }
}
