//! Hugging Face case files (DESIGN.md, "Hugging Face case file"): metadata `variant = "hf"`,
//! `hf_config` (the model's config.json text), `prefix`, `attention` (`self`/`cross`) and
//! `causal` (`true`/`false`); the model's tensors under their saved names; inputs
//! `hidden_states [B, Lq, E]`, `key_value_states [B, Lk, E]` (cross), `position_ids [B, Lq]`
//! (RoPE models) and an optional `attention_mask [B, Lk]` (1 = real token); expected `out_f64`.
//! The file's `attention` and `causal` are how the module was called for `out_f64`: they are
//! honoured, and `attention` must agree with the module the prefix names.

use crate::error::{Error, Result};
use crate::io::case::{read_expected, Case, CaseVariant};
use crate::io::safetensors::SafetensorsFile;
use crate::model::mask::AttnDims;

use super::config::HfConfig;
use super::HfCheckpoint;

/// `position_ids [B, Lk]` for a module with RoPE (absent: `0..Lk`); ignored otherwise, where
/// positions do not enter the attention module.
pub fn read_positions(
    file: &SafetensorsFile,
    config: &crate::model::config::AttentionConfig,
    batch: usize,
    lk: usize,
) -> Result<Option<Vec<usize>>> {
    if config.rope.is_none() || !file.contains("position_ids") {
        return Ok(None);
    }
    let (shape, values) = file.tensor_indices("position_ids")?;
    if shape != [batch, lk] {
        return Err(Error::shape(
            "position_ids",
            format!("[{batch}, {lk}]"),
            &shape,
        ));
    }
    Ok(Some(values))
}

/// Reads a Hugging Face case (checked; nothing runs).
pub(crate) fn from_file(file: &SafetensorsFile) -> Result<Case> {
    let bad = |problem: String| Error::file(file.name(), problem);
    let meta = |key: &str| {
        file.metadata(key).ok_or_else(|| {
            bad(format!(
                "metadata `{key}` is missing (a Hugging Face case needs it)"
            ))
        })
    };
    let config = HfConfig::parse(
        meta("hf_config")?,
        format!("{}: metadata hf_config", file.name()),
    )?;
    let prefix = meta("prefix")?;
    let cross = match meta("attention")? {
        "self" => false,
        "cross" => true,
        other => {
            return Err(bad(format!(
                "metadata `attention` = {other:?}; expected \"self\" or \"cross\""
            )))
        }
    };
    let causal = match meta("causal")?.trim().to_ascii_lowercase().as_str() {
        "true" => true,
        "false" => false,
        other => {
            return Err(bad(format!(
                "metadata `causal` = {other:?}; expected \"true\" or \"false\""
            )))
        }
    };
    let ckpt = HfCheckpoint::from_shards(file.name().to_string(), Some(config), vec![file.clone()]);
    let mut module = ckpt.attention(prefix, None)?;
    if module.cross != cross {
        return Err(bad(format!(
            "metadata `attention` is {:?}, but `{prefix}` is a {} module",
            if cross { "cross" } else { "self" },
            if module.cross {
                "cross-attention"
            } else {
                "self-attention"
            }
        )));
    }
    module.causal = causal;

    let hidden = file.tensor_f32("hidden_states")?;
    // MLA's core runs on its pre-stage's query input and latent.
    let (query, self_key) = module.inputs(&hidden)?;
    let key = match (cross, file.contains("key_value_states")) {
        (true, _) => file.tensor_f32("key_value_states")?,
        (false, false) => self_key,
        (false, true) => {
            return Err(bad(
                "holds `key_value_states`, but metadata `attention` is \"self\"".into(),
            ))
        }
    };
    let c = &module.config;
    c.check_inputs(query.shape(), key.shape(), key.shape())?;
    let (batch, lq, lk) = (query.shape()[0], query.shape()[1], key.shape()[1]);
    let padding = match file.contains("attention_mask") {
        true => Some(file.mask_tensor("attention_mask")?),
        false => None,
    };
    let dims = AttnDims {
        batch,
        heads: c.heads,
        lq,
        lk,
    };
    let mask = module
        .mask_for(&hidden, dims, padding.as_ref())
        .map_err(|e| file.tensor_error("attention_mask", e))?;
    let positions = read_positions(file, &module.config, batch, lk)?;
    let out_shape = vec![batch, lq, c.output_dim()];
    let (out_f64, out_f32, err_f32_vs_f64) = read_expected(file, &out_shape)?;
    let mut describe = format!(
        "{} {prefix} ({}{})",
        module.model_type.as_deref().unwrap_or(module.family.name()),
        if cross { "cross" } else { "self" },
        if causal { ", causal" } else { "" }
    );
    if let Some(norm) = &module.input_norm {
        describe.push_str(&format!(" after input norm {norm}"));
    }
    if module.relative_bias.is_some() || module.grid_bias.is_some() {
        describe.push_str(" +relative bias");
    } else if module.gated_bias.is_some() {
        describe.push_str(" +gated relative bias");
    }
    if module.config.rope.is_some() {
        describe.push_str(" +rope");
    } else if module.is_nope_layer() {
        describe.push_str(" nope");
    }
    if let Some(w) = module.window {
        let both = if module.causal { "" } else { "±" };
        describe.push_str(&format!(" window={both}{w}"));
    }
    if let Some(c) = module.chunk {
        describe.push_str(&format!(" chunked={c}"));
    }
    if module.config.output_norm.is_some() {
        describe.push_str(" +sub_norm");
    }
    if module.config.output_gate {
        describe.push_str(" +gate");
    }
    if module.config.temperature.is_some() {
        describe.push_str(" +temperature");
    }
    if module.mla.is_some() {
        describe.push_str(" +mla");
    } else if module.config.kv_heads != module.config.heads {
        describe.push_str(&format!(" kv_heads={}", module.config.kv_heads));
    }
    Ok(Case {
        name: file.name().to_string(),
        module: Some(describe),
        variant: CaseVariant::Hf,
        config: module.config,
        weights: module.weights,
        query,
        key,
        value: None,
        mask,
        positions,
        out_shape,
        out_f64,
        out_f32,
        attn_f64: None,
        err_f32_vs_f64,
    })
}
