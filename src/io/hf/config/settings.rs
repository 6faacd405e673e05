//! Config keys that change an attention layer's answer, with their neutral values: a module
//! whose model type does not read one is refused when it is set (see [`SETTINGS`]).

use serde_json::Value;

use super::HfConfig;
use crate::error::{Error, Result};

impl HfConfig {
    /// `Err(UnsupportedModule)` naming the first key of [`SETTINGS`] set to a value that changes
    /// the answer, unless the module's model type reads it (`reads`).
    pub fn check_settings(&self, prefix: &str, reads: &[&str]) -> Result<()> {
        self.check_layer_types()?;
        for s in SETTINGS.iter().filter(|s| !reads.contains(&s.key)) {
            if let Some(v) = self.setting(s.key).filter(|v| !(s.neutral)(v)) {
                return Err(Error::UnsupportedModule {
                    module: format!("attention `{prefix}`"),
                    what: format!("config.json `{}` = {v}", s.key),
                    why: format!(
                        "{}; this model type's attention in the loader does not read it",
                        s.why
                    ),
                });
            }
        }
        Ok(())
    }

    /// `key` at the top level, or inside `rope_parameters` / `rope_scaling`.
    fn setting(&self, key: &str) -> Option<&Value> {
        self.json.get(key).or_else(|| {
            ["rope_parameters", "rope_scaling"]
                .iter()
                .find_map(|o| self.json.get(*o).and_then(|o| o.get(key)))
        })
    }
}

/// A config key that changes the attention's answer: refused when set to anything but its
/// `neutral` values, unless the module's model type reads it ([`ModelType`](crate::io::hf::families::ModelType)).
pub struct Setting {
    /// The key, at the top level or inside `rope_parameters` / `rope_scaling`.
    pub key: &'static str,
    neutral: fn(&Value) -> bool,
    /// What the key does, for the refusal.
    pub why: &'static str,
}

/// Absent from the answer: null or false.
fn off(v: &Value) -> bool {
    v.is_null() || v.as_bool() == Some(false)
}

fn null(v: &Value) -> bool {
    v.is_null()
}

/// Null or 1 (a factor or share that changes nothing).
fn one(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(1.0)
}

fn on(v: &Value) -> bool {
    v.is_null() || v.as_bool() == Some(true)
}

fn absolute(v: &Value) -> bool {
    v.is_null() || v.as_str() == Some("absolute")
}

/// Null, or every layer full attention.
fn all_full(v: &Value) -> bool {
    v.is_null()
        || v.as_array()
            .is_some_and(|a| a.iter().all(|t| t.as_str() == Some("full_attention")))
}

/// Null, or every layer with RoPE (no 0 in `no_rope_layers`).
fn all_rope(v: &Value) -> bool {
    v.is_null()
        || v.as_array()
            .is_some_and(|a| a.iter().all(|t| t.as_f64().is_some_and(|x| x != 0.0)))
}

/// Every config key the loader knows to change an attention layer's answer, with its neutral
/// values. Looked up at the top level and inside `rope_parameters` / `rope_scaling`.
pub const SETTINGS: &[Setting] = &[
    Setting { key: "position_embedding_type", neutral: absolute, why: "relative_key / relative_key_query add distance embeddings to the scores, rotary rotates q and k" },
    Setting { key: "attention_types", neutral: null, why: "GPT-Neo's global/local layers (a local window, unscaled scores)" },
    Setting { key: "attention_layers", neutral: null, why: "GPT-Neo's global/local layers (a local window, unscaled scores)" },
    Setting { key: "rotary_dim", neutral: null, why: "interleaved rotary embeddings on the first rotary_dim dimensions of each head (GPT-J's, CodeGen's) are not this model type's" },
    Setting { key: "use_qk_norm", neutral: off, why: "q and k are normalised before the scores" },
    Setting { key: "qk_layernorm", neutral: off, why: "q and k are LayerNorm-ed per head before the scores" },
    Setting { key: "qk_norm", neutral: off, why: "q and k are normalised before the scores" },
    Setting { key: "attn_logit_softcapping", neutral: null, why: "scores are soft-capped c·tanh(s/c) before the softmax" },
    Setting { key: "clip_qkv", neutral: null, why: "q, k and v are clamped to ±clip_qkv" },
    Setting { key: "attention_multiplier", neutral: null, why: "scores are scaled by attention_multiplier instead of 1/√d" },
    Setting { key: "alibi", neutral: off, why: "ALiBi adds per-head distance biases to the scores" },
    Setting { key: "new_decoder_architecture", neutral: off, why: "Falcon's grouped query_key_value packing" },
    Setting { key: "query_pre_attn_scalar", neutral: null, why: "scores are scaled by 1/√query_pre_attn_scalar" },
    Setting { key: "sliding_window_pattern", neutral: null, why: "every n-th layer is global and the others slide" },
    Setting { key: "sliding_window", neutral: null, why: "keys outside a window are masked" },
    Setting { key: "use_sliding_window", neutral: off, why: "keys outside a window are masked" },
    Setting { key: "max_window_layers", neutral: null, why: "which layers slide" },
    Setting { key: "layer_types", neutral: all_full, why: "some layers are not full attention" },
    Setting { key: "scale_attn_weights", neutral: on, why: "scores are not scaled by 1/√d" },
    Setting { key: "scale_attn_by_inverse_layer_idx", neutral: off, why: "scores are divided by the layer number" },
    Setting { key: "partial_rotary_factor", neutral: one, why: "only part of each head rotates" },
    Setting { key: "rotary_pct", neutral: one, why: "only part of each head rotates" },
    Setting { key: "attention_window", neutral: null, why: "Longformer's local plus global attention" },
    Setting { key: "use_bidirectional_attention", neutral: off, why: "a causal model type attends both ways" },
    Setting { key: "use_relative_position_bias", neutral: off, why: "a relative position bias is added to the scores" },
    Setting { key: "use_shared_relative_position_bias", neutral: off, why: "a relative position bias is added to the scores" },
    Setting { key: "use_logn_attn", neutral: off, why: "scores are scaled by log n" },
    Setting { key: "causal", neutral: off, why: "XLM's causal mode" },
    Setting { key: "rotary_value", neutral: off, why: "RoFormer rotates the values too" },
    Setting { key: "no_rope_layers", neutral: all_rope, why: "the layers it marks 0 run without RoPE" },
    Setting { key: "quantization_config", neutral: null, why: "transformers' forward then quantizes the projections' weights or activations (BitNet's BitLinear rounds each token's activations to 8 bits and the weights to ternary values), which the loader's f32 projections do not compute" },
    Setting { key: "attention_chunk_size", neutral: null, why: "Llama 4's chunked layers see only the keys of their own chunk" },
    Setting { key: "attn_temperature_tuning", neutral: off, why: "Llama 4 scales the queries of its NoPE layers by a factor growing with the position" },
];
