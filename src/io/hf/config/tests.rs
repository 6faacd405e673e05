//! Unit tests of the config reader (declared `#[cfg(test)] mod tests;` in `config.rs`).

use super::*;
use crate::model::rope::RopeScaling;

/// `json` parsed as a config.json named "t".
fn config(json: &str) -> HfConfig {
    HfConfig::parse(json, "t").unwrap()
}

#[test]
fn heads_follow_the_family_key_and_the_stack() {
    let bart = config(
        r#"{"model_type": "bart", "encoder_attention_heads": 4, "decoder_attention_heads": 2}"#,
    );
    assert_eq!(bart.heads("model.encoder.layers.0.self_attn.").unwrap(), 4);
    assert_eq!(
        bart.heads("model.decoder.layers.0.encoder_attn.").unwrap(),
        2
    );
    let gpt2 = config(r#"{"n_head": 3}"#);
    assert_eq!(gpt2.heads("h.0.attn.").unwrap(), 3);
    assert!(config(r#"{"n_head": 0}"#).heads("").is_err());
    assert!(HfConfig::parse("[1]", "t").is_err());
}

#[test]
fn scale_rules_and_refused_settings() {
    let c = |text: &str| config(text);
    let gpt2 = &["scale_attn_weights", "scale_attn_by_inverse_layer_idx"][..];
    assert_eq!(c("{}").scale("h.0.attn.", 16, gpt2).unwrap(), None);
    let unscaled = c(r#"{"scale_attn_weights": false}"#);
    assert_eq!(unscaled.scale("h.0.", 16, gpt2).unwrap(), Some(1.0));
    // Read only where the model type reads it; refused by name elsewhere.
    assert!(unscaled.check_settings("h.0.", gpt2).is_ok());
    let err = unscaled
        .check_settings("h.0.", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("scale_attn_weights"), "{err}");
    let by_layer = c(r#"{"scale_attn_by_inverse_layer_idx": true}"#);
    assert_eq!(by_layer.scale("h.3.attn.", 16, gpt2).unwrap(), Some(0.0625));
    assert!(by_layer.scale("attn.", 16, gpt2).is_err());
    for refused in [
        r#"{"attn_logit_softcapping": 50.0}"#,
        r#"{"query_pre_attn_scalar": 64}"#,
        r#"{"position_embedding_type": "relative_key"}"#,
        r#"{"rotary_dim": 4}"#,
        r#"{"attention_types": [[["global", "local"], 1]]}"#,
        r#"{"rope_parameters": {"partial_rotary_factor": 0.5}}"#,
        r#"{"layer_types": ["full_attention", "chunked_attention"]}"#,
    ] {
        let key = refused.split('"').nth(1).unwrap();
        let key = if key == "rope_parameters" {
            "partial_rotary_factor"
        } else {
            key
        };
        match c(refused).check_settings("x.", &[]) {
            Err(Error::UnsupportedModule { what, .. }) => {
                assert!(what.contains(key), "{refused}: {what}")
            }
            other => panic!("{refused}: expected UnsupportedModule, got {other:?}"),
        }
    }
    for neutral in [
        r#"{"attn_logit_softcapping": null}"#,
        r#"{"position_embedding_type": "absolute"}"#,
        r#"{"scale_attn_weights": true, "alibi": false, "partial_rotary_factor": 1.0}"#,
        r#"{"layer_types": ["full_attention", "full_attention"]}"#,
    ] {
        assert!(c(neutral).check_settings("x.", &[]).is_ok(), "{neutral}");
    }
    let qwen2 = &[
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
    ][..];
    let typed = c(r#"{"sliding_window": 4, "use_sliding_window": true,
        "layer_types": ["full_attention", "sliding_attention", "chunked_attention"]}"#);
    assert_eq!(
        typed.sliding_window("layers.0.self_attn.", qwen2).unwrap(),
        None
    );
    assert_eq!(
        typed.sliding_window("layers.1.self_attn.", qwen2).unwrap(),
        Some(4)
    );
    assert!(matches!(
        typed.sliding_window("layers.2.self_attn.", qwen2),
        Err(Error::UnsupportedModule { .. })
    ));
    assert!(typed.sliding_window("layers.7.self_attn.", qwen2).is_err());
    // qwen2 without layer_types: layers from max_window_layers on slide, if switched on.
    let by_count =
        c(r#"{"sliding_window": 4, "use_sliding_window": true, "max_window_layers": 2}"#);
    assert_eq!(by_count.sliding_window("layers.1.x.", qwen2).unwrap(), None);
    assert_eq!(
        by_count.sliding_window("layers.2.x.", qwen2).unwrap(),
        Some(4)
    );
    let off = c(r#"{"sliding_window": 4, "use_sliding_window": false}"#);
    assert_eq!(off.sliding_window("layers.3.x.", qwen2).unwrap(), None);
    // mistral reads only sliding_window: every layer slides.
    assert_eq!(
        off.sliding_window("layers.0.x.", &["sliding_window"])
            .unwrap(),
        Some(4)
    );
    assert_eq!(layer_index("model.decoder.layers.12.self_attn."), Some(12));
}

#[test]
fn a_module_reads_its_towers_sub_config() {
    let clip = config(
        r#"{"model_type": "clip", "text_config": {"model_type": "clip_text_model",
            "num_attention_heads": 2}, "vision_config": {"num_attention_heads": 4}}"#,
    );
    let text = clip
        .for_module("text_model.encoder.layers.0.self_attn.")
        .unwrap();
    assert_eq!(
        (text.model_type(), text.heads("").unwrap()),
        (Some("clip_text_model"), 2)
    );
    let vision = clip
        .for_module("vision_model.encoder.layers.0.self_attn.")
        .unwrap();
    // Without its own model_type, the sub-config takes the parent's.
    assert_eq!(
        (vision.model_type(), vision.heads("").unwrap()),
        (Some("clip"), 4)
    );
    for ambiguous in [
        "encoder.layers.0.self_attn.",
        "text_model.vision_model.0.attn.",
    ] {
        assert!(
            matches!(
                clip.for_module(ambiguous),
                Err(Error::UnsupportedModule { .. })
            ),
            "{ambiguous}"
        );
    }
    let xglm = config(r#"{"model_type": "xglm", "attention_heads": 3}"#);
    assert_eq!(
        xglm.for_module("model.layers.0.self_attn.")
            .unwrap()
            .heads("")
            .unwrap(),
        3
    );
}

#[test]
fn rope_reads_both_spellings() {
    let llama3 = r#""rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64"#;
    let v4 = config(&format!(
        r#"{{"rope_theta": 500000.0, "rope_scaling": {{{llama3}}}}}"#
    ));
    let v5 = config(&format!(
        r#"{{"rope_parameters": {{"rope_theta": 500000.0, {llama3}}}}}"#
    ));
    assert_eq!(
        v4.rope(8, 1.0, None).unwrap(),
        v5.rope(8, 1.0, None).unwrap()
    );
    assert!(
        matches!(v4.rope(8, 1.0, None).unwrap().scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0)
    );
    let neox = config(r#"{"rotary_pct": 0.25, "rotary_emb_base": 1000}"#);
    assert_eq!(
        (
            neox.rope(16, 1.0, None).unwrap().rotary_dims,
            neox.rope(16, 1.0, None).unwrap().theta
        ),
        (4, 1000.0)
    );
    let proportional = config(r#"{"rope_scaling": {"rope_type": "proportional", "factor": 4.0}}"#);
    assert!(matches!(
        proportional.rope(8, 1.0, None),
        Err(Error::UnsupportedModule { .. })
    ));
    // dynamic: the threshold is max_position_embeddings, which it needs.
    let dynamic = |extra: &str| {
        config(&format!(
            r#"{{"rope_scaling": {{"rope_type": "dynamic", "factor": 4.0}}{extra}}}"#
        ))
        .rope(8, 1.0, None)
    };
    assert!(
        matches!(dynamic(""), Err(Error::File { problem, .. }) if problem.contains("max_position_embeddings"))
    );
    assert_eq!(
        dynamic(r#", "max_position_embeddings": 4"#)
            .unwrap()
            .scaling,
        RopeScaling::Dynamic {
            factor: 4.0,
            max_positions: 4.0
        }
    );
    let yarn = config(
        r#"{"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
            "original_max_position_embeddings": 16, "truncate": false, "beta_fast": 0}}"#,
    );
    match yarn.rope(8, 1.0, None).unwrap().scaling {
        RopeScaling::Yarn {
            beta_fast,
            beta_slow,
            truncate,
            attention_factor,
            ..
        } => {
            // beta_fast 0 is transformers' `or 32`; attention_factor 0.1·ln 4 + 1.
            assert_eq!((beta_fast, beta_slow, truncate), (32.0, 1.0, false));
            assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
        }
        other => panic!("{other:?}"),
    }
    let no_original = config(r#"{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#);
    assert!(no_original.rope(8, 1.0, None).is_err());
    let missing = config(r#"{"rope_scaling": {"rope_type": "linear"}}"#);
    assert!(missing.rope(8, 1.0, None).is_err());
}

#[test]
fn layer_kinds_follow_layer_types_or_the_model_types_pattern() {
    let c = |text: &str| config(text);
    let reads = &["sliding_window", "layer_types", "sliding_window_pattern"][..];
    let kind = |cfg: &HfConfig, layer: usize| {
        cfg.layer_kind(&format!("model.layers.{layer}.self_attn."), reads)
            .unwrap()
    };
    // Gemma 3 without layer_types: every sliding_window_pattern-th layer (default 6) is full.
    let gemma3 = c(r#"{"model_type": "gemma3_text"}"#);
    assert_eq!(kind(&gemma3, 4), LayerKind::Sliding);
    assert_eq!(kind(&gemma3, 5), LayerKind::Full);
    let every_other = c(r#"{"model_type": "gemma3_text", "sliding_window_pattern": 2}"#);
    assert_eq!(kind(&every_other, 0), LayerKind::Sliding);
    assert_eq!(kind(&every_other, 1), LayerKind::Full);
    // Gemma 2: the even layers.
    let gemma2 = c(r#"{"model_type": "gemma2"}"#);
    assert_eq!(kind(&gemma2, 2), LayerKind::Sliding);
    assert_eq!(kind(&gemma2, 3), LayerKind::Full);
    // layer_types wins.
    let typed = c(r#"{"model_type": "gemma3_text",
        "layer_types": ["full_attention", "sliding_attention"]}"#);
    assert_eq!(kind(&typed, 0), LayerKind::Full);
    // A RoPE per layer kind: the layer's own.
    let nested = c(r#"{"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}"#);
    let theta = |k| nested.rope(8, 1.0, Some(k)).unwrap().theta;
    assert_eq!(theta(LayerKind::Sliding), 1e4);
    assert_eq!(theta(LayerKind::Full), 1e6);
    assert!(nested.rope(8, 1.0, None).is_err());
}

#[test]
fn longrope_reads_both_spellings_and_phi3s_names() {
    let factors = r#""short_factor": [1.0, 2.0], "long_factor": [4.0, 8.0]"#;
    let v5 = config(&format!(
        r#"{{"max_position_embeddings": 16, "rope_parameters": {{"rope_type": "longrope",
            "rope_theta": 1e4, "original_max_position_embeddings": 4, {factors}}}}}"#
    ));
    let v4 = config(&format!(
        r#"{{"model_type": "phi3", "max_position_embeddings": 16, "rope_theta": 1e4,
            "original_max_position_embeddings": 4, "rope_scaling": {{"type": "su", {factors}}}}}"#
    ));
    let rope = v5.rope(4, 1.0, None).unwrap();
    assert_eq!(rope, v4.rope(4, 1.0, None).unwrap());
    let RopeScaling::LongRope {
        factors,
        original_max_positions,
        attention_factor,
    } = rope.scaling
    else {
        panic!("{rope:?}")
    };
    assert_eq!(
        (factors.short(), factors.long()),
        (&[1.0, 2.0][..], &[4.0, 8.0][..])
    );
    assert_eq!(original_max_positions, 4.0);
    // factor 16 / 4: √(1 + ln 4 / ln 4).
    assert!((attention_factor - 2f64.sqrt()).abs() < 1e-15);
    // Phi3Config raises for other types; a factor list of the wrong length is an error.
    let linear =
        config(r#"{"model_type": "phi3", "rope_scaling": {"type": "linear", "factor": 2.0}}"#);
    assert!(
        matches!(linear.rope(4, 1.0, None), Err(Error::UnsupportedModule { what, .. }) if what.contains("linear"))
    );
    assert!(v5.rope(8, 1.0, None).is_err());
}

#[test]
fn round2_layer_patterns_and_rope_rules_follow_their_config_classes() {
    let c = |text: &str| config(text);
    let at = |layer: usize| format!("model.layers.{layer}.self_attn.");
    let kind =
        |cfg: &HfConfig, layer: usize, reads: &[&str]| cfg.layer_kind(&at(layer), reads).unwrap();
    let patterned = &["sliding_window", "layer_types", "sliding_window_pattern"][..];
    // Cohere2Config and Exaone4Config: every sliding_window_pattern-th layer full (default 4).
    for t in ["cohere2", "exaone4"] {
        let cfg = c(&format!(r#"{{"model_type": "{t}"}}"#));
        assert_eq!(kind(&cfg, 2, patterned), LayerKind::Sliding, "{t}");
        assert_eq!(kind(&cfg, 3, patterned), LayerKind::Full, "{t}");
        let two = c(&format!(
            r#"{{"model_type": "{t}", "sliding_window_pattern": 2}}"#
        ));
        assert_eq!(kind(&two, 1, patterned), LayerKind::Full, "{t}");
    }
    // EXAONE 4's string pattern ("LLLG") only works with layer_types: an error naming it.
    let lllg = c(r#"{"model_type": "exaone4", "sliding_window_pattern": "LLLG"}"#);
    let err = lllg.layer_kind(&at(0), patterned).unwrap_err().to_string();
    assert!(err.contains("sliding_window_pattern"), "{err}");
    // Olmo3Config: every fourth layer full, whatever else the config says.
    let olmo3 = c(r#"{"model_type": "olmo3"}"#);
    let reads = &["sliding_window", "layer_types"][..];
    assert_eq!(kind(&olmo3, 2, reads), LayerKind::Sliding);
    assert_eq!(kind(&olmo3, 7, reads), LayerKind::Full);
    // Qwen2MoeConfig: the even layers below max_window_layers (default 28) slide.
    let qwen2_moe = &[
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
    ][..];
    let moe = c(
        r#"{"model_type": "qwen2_moe", "use_sliding_window": true, "sliding_window": 5,
        "max_window_layers": 4}"#,
    );
    let window = |cfg: &HfConfig, layer| cfg.sliding_window(&at(layer), qwen2_moe).unwrap();
    assert_eq!(window(&moe, 2), Some(5));
    assert_eq!(window(&moe, 3), None);
    assert_eq!(window(&moe, 4), None);
    // Without use_sliding_window no layer slides (its config saves sliding_window = 0)...
    let off = c(r#"{"model_type": "qwen2_moe", "use_sliding_window": false, "sliding_window": 0}"#);
    assert_eq!(window(&off, 0), None);
    // ... and a layer_types entry that slides anyway has no window transformers could use.
    let typed = c(
        r#"{"model_type": "qwen2_moe", "use_sliding_window": false, "sliding_window": 0,
        "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}"#,
    );
    assert!(matches!(
        typed.sliding_window(&at(0), qwen2_moe),
        Err(Error::UnsupportedModule { .. })
    ));
    assert_eq!(window(&typed, 1), None);

    // Hunyuan's "dynamic" with alpha: a fixed θ·α^(d/(d−2)); without alpha, dynamic NTK.
    let alpha = c(
        r#"{"model_type": "hunyuan_v1_dense", "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0,
        "factor": 1.0}}"#,
    );
    let rope = alpha.rope(8, 1.0, None).unwrap();
    assert_eq!(rope.scaling, RopeScaling::None);
    assert!((rope.theta - 1e4 * 1000f64.powf(8.0 / 6.0)).abs() < 1e-6 * rope.theta);
    let llama = c(r#"{"model_type": "llama", "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0,
        "factor": 2.0}}"#);
    assert!(matches!(
        llama.rope(8, 1.0, None).unwrap().scaling,
        RopeScaling::Dynamic { .. }
    ));

    // Olmo3Config: the 4.x rope_scaling is the full layers' only; a flat rope_parameters is
    // not what it reads.
    let olmo3_4x = c(r#"{"model_type": "olmo3", "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}}"#);
    let full = olmo3_4x.rope(8, 1.0, Some(LayerKind::Full)).unwrap();
    let sliding = olmo3_4x.rope(8, 1.0, Some(LayerKind::Sliding)).unwrap();
    assert_eq!(full.scaling, RopeScaling::Linear { factor: 2.0 });
    assert_eq!(sliding.scaling, RopeScaling::None);
    assert_eq!((full.theta, sliding.theta), (5e5, 5e5));
    let flat = c(r#"{"model_type": "olmo3",
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}}"#);
    assert!(matches!(
        flat.rope(8, 1.0, Some(LayerKind::Full)),
        Err(Error::UnsupportedModule { .. })
    ));
}

#[test]
fn smollm3_rotates_by_no_rope_layers_and_slides_its_nope_layers() {
    let c = |text: &str| config(text);
    let at = |layer: usize| format!("model.layers.{layer}.self_attn.");
    // No list: every no_rope_layer_interval-th layer (default 4) has no RoPE.
    let default = c(r#"{"model_type": "smollm3"}"#);
    assert!(default.rope_layer(&at(2)).unwrap());
    assert!(!default.rope_layer(&at(3)).unwrap());
    let listed = c(r#"{"model_type": "smollm3", "no_rope_layers": [1, 0]}"#);
    assert!(listed.rope_layer(&at(0)).unwrap());
    assert!(!listed.rope_layer(&at(1)).unwrap());
    assert!(listed.rope_layer(&at(2)).is_err());
    // Without layer_types, the NoPE layers slide when use_sliding_window and a window are set.
    let reads = &["sliding_window", "use_sliding_window", "layer_types"][..];
    let sliding = c(r#"{"model_type": "smollm3", "no_rope_layers": [1, 0],
        "use_sliding_window": true, "sliding_window": 3}"#);
    assert_eq!(sliding.sliding_window(&at(0), reads).unwrap(), None);
    assert_eq!(sliding.sliding_window(&at(1), reads).unwrap(), Some(3));
    // SmolLM3's masks follow layer_types even without use_sliding_window.
    let typed = c(
        r#"{"model_type": "smollm3", "use_sliding_window": false, "sliding_window": 3,
        "num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"]}"#,
    );
    assert_eq!(typed.sliding_window(&at(1), reads).unwrap(), Some(3));
    // Another model type refuses a no_rope_layers with a 0 in it.
    assert!(c(r#"{"no_rope_layers": [1, 0]}"#)
        .check_settings("x.", &[])
        .is_err());
    assert!(c(r#"{"no_rope_layers": [1, 1]}"#)
        .check_settings("x.", &[])
        .is_ok());
}

#[test]
fn modernbert_layers_alternate_with_a_two_sided_window_and_a_theta_per_kind() {
    let c = |text: &str| config(text);
    let at = |layer: usize| format!("layers.{layer}.attn.");
    let reads = &["layer_types"][..];
    // 4.x spelling: every global_attn_every_n_layers-th layer (default 3) global from layer
    // 0; the others see |i − j| ≤ local_attention / 2 (default 128 / 2); θ per kind.
    let old = c(r#"{"model_type": "modernbert", "local_attention": 6,
        "global_rope_theta": 20000.0}"#);
    assert_eq!(old.sliding_window(&at(0), reads).unwrap(), None);
    assert_eq!(old.sliding_window(&at(1), reads).unwrap(), Some(3));
    assert_eq!(old.sliding_window(&at(3), reads).unwrap(), None);
    let full = old.rope(8, 1.0, Some(LayerKind::Full)).unwrap();
    let local = old.rope(8, 1.0, Some(LayerKind::Sliding)).unwrap();
    assert_eq!((full.theta, local.theta), (20000.0, 10000.0));
    assert_eq!(
        c(r#"{"model_type": "modernbert"}"#)
            .sliding_window(&at(2), reads)
            .unwrap(),
        Some(64)
    );
    // transformers 5: layer_types and one RoPE object per kind.
    let new = c(
        r#"{"model_type": "modernbert", "layer_types": ["sliding_attention",
        "full_attention"], "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}}"#,
    );
    assert_eq!(new.sliding_window(&at(0), reads).unwrap(), Some(64));
    assert_eq!(new.sliding_window(&at(1), reads).unwrap(), None);
    let local = new.rope(8, 1.0, Some(LayerKind::Sliding)).unwrap();
    assert_eq!(local.theta, 50.0);
    // A flat RoPE object or a top-level rope_theta is not what ModernBertConfig reads.
    for text in [
        r#"{"model_type": "modernbert", "rope_parameters": {"rope_theta": 5.0}}"#,
        r#"{"model_type": "modernbert", "rope_theta": 5.0}"#,
    ] {
        assert!(matches!(
            c(text).rope(8, 1.0, Some(LayerKind::Full)),
            Err(Error::UnsupportedModule { .. })
        ));
    }
}

#[test]
fn esm_rotates_by_its_position_embedding_type() {
    let c = |text: &str| config(text).rotary_position_type();
    assert!(!c("{}").unwrap());
    assert!(!c(r#"{"position_embedding_type": null}"#).unwrap());
    assert!(!c(r#"{"position_embedding_type": "absolute"}"#).unwrap());
    assert!(c(r#"{"position_embedding_type": "rotary"}"#).unwrap());
    for bad in [r#""relative_key""#, "3", "true"] {
        let e = c(&format!(r#"{{"position_embedding_type": {bad}}}"#)).unwrap_err();
        assert!(e.to_string().contains("position_embedding_type"), "{e}");
    }
}

#[test]
fn llama4_chunks_its_rope_layers_and_tunes_its_nope_layers() {
    let c = |text: &str| config(text);
    let at = |layer: usize| format!("model.layers.{layer}.self_attn.");
    // No layer_types: the RoPE layers are chunked when attention_chunk_size is set; an empty
    // no_rope_layers is Llama4TextConfig's default (every 4th layer NoPE).
    let d = c(
        r#"{"model_type": "llama4_text", "no_rope_layers": [], "attention_chunk_size": 3,
        "attn_temperature_tuning": true, "floor_scale": 4, "attn_scale": 0.25}"#,
    );
    assert_eq!(d.attention_chunk(&at(2)).unwrap(), Some(3));
    assert_eq!(d.attention_chunk(&at(3)).unwrap(), None);
    assert!(d.temperature_tuning(&at(2)).unwrap().is_none());
    let t = d.temperature_tuning(&at(3)).unwrap().unwrap();
    assert_eq!((t.floor_scale, t.attn_scale), (4.0, 0.25));
    // transformers' factor: positions 0..2 → 1, 3 → 1 + ln 2 · 0.25.
    assert_eq!(t.factor(2), 1.0);
    assert!((t.factor(3) - (1.0 + 2f32.ln() * 0.25)).abs() < 1e-7);
    let unset = c(r#"{"model_type": "llama4_text", "attention_chunk_size": null}"#);
    assert_eq!(unset.attention_chunk(&at(0)).unwrap(), None);
    // Tuning without its numbers is an error naming them.
    let bare = c(r#"{"model_type": "llama4_text", "attn_temperature_tuning": true}"#);
    assert!(bare.temperature_tuning(&at(3)).is_err());
}
