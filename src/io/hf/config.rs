//! A Hugging Face `config.json`, read for what an attention layer needs: heads (by each
//! family's key), key/value heads, head size, the score scale rule, RoPE settings in either
//! spelling (transformers 4.x `rope_theta`/`rope_scaling`/`partial_rotary_factor`/`rotary_pct`,
//! transformers 5 `rope_parameters`), a sliding window and T5's relative-bias settings. A key
//! that changes the answer and that the module's model type does not read is refused by name
//! ([`SETTINGS`]), never ignored. Multimodal configs keep each tower's settings in
//! `text_config` / `vision_config` / `audio_config`: [`HfConfig::for_module`] picks the one a
//! prefix lies in.

use serde_json::Value;

use super::model_types::ConfigDefault;

use crate::error::{Error, Result};

mod falcon_mpt;
mod layers;
mod llama4;
mod rope;
mod settings;
pub use layers::LayerKind;
pub use settings::{Setting, SETTINGS};

/// The parsed `config.json` of one model.
#[derive(Debug, Clone)]
pub struct HfConfig {
    json: Value,
    /// Where the text came from, for messages (`DIR/config.json`, or a case file's `hf_config`).
    source: String,
}

/// T5's bucketed relative position bias settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct T5BiasSettings {
    /// `relative_attention_num_buckets`: buckets of the bias table.
    pub buckets: usize,
    /// `relative_attention_max_distance`: the distance the logarithmic buckets span (keys
    /// farther away share the last bucket).
    pub max_distance: usize,
}

impl HfConfig {
    /// Parses `text`; `source` names it in messages.
    pub fn parse(text: &str, source: impl Into<String>) -> Result<Self> {
        let source = source.into();
        let json: Value = serde_json::from_str(text)
            .map_err(|e| Error::file(&source, format!("config.json is not valid JSON ({e})")))?;
        if !json.is_object() {
            return Err(Error::file(&source, "config.json is not a JSON object"));
        }
        if let Some(t) = json.get("model_type").filter(|t| !t.is_string()) {
            return Err(Error::file(
                &source,
                format!("config.json `model_type` = {t} is not a string"),
            ));
        }
        Ok(HfConfig { json, source })
    }

    /// Where the text came from (`DIR/config.json`, or a case file's `hf_config`).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `model_type`, when the config names it.
    pub fn model_type(&self) -> Option<&str> {
        self.json.get("model_type").and_then(Value::as_str)
    }

    /// The config of the module at `prefix`: the top-level one, or for a multimodal config
    /// (one holding `text_config`, `vision_config` or `audio_config`) the sub-config of the tower
    /// the prefix names (`text_model.` / `language_model.`, `vision_model.` / `vision_tower.`,
    /// `audio_model.` / `audio_tower.` …). A sub-config without `model_type` takes the parent's.
    /// A prefix that names no tower with a sub-config, or more than one, is an error: the heads
    /// of one tower are never read for another.
    pub fn for_module(&self, prefix: &str) -> Result<HfConfig> {
        const TOWERS: [(&str, &[&str]); 3] = [
            (
                "text_config",
                &["text_model", "language_model", "text_encoder", "text_tower"],
            ),
            (
                "vision_config",
                &[
                    "vision_model",
                    "vision_tower",
                    "vision_encoder",
                    "visual",
                    "image_encoder",
                ],
            ),
            (
                "audio_config",
                &["audio_model", "audio_tower", "audio_encoder"],
            ),
        ];
        let present: Vec<&str> = TOWERS
            .iter()
            .map(|t| t.0)
            .filter(|k| self.json.get(*k).is_some_and(Value::is_object))
            .collect();
        if present.is_empty() {
            return Ok(self.clone());
        }
        let parts: Vec<&str> = prefix.split('.').collect();
        let named: Vec<&str> = TOWERS
            .iter()
            .filter(|(_, names)| names.iter().any(|n| parts.contains(n)))
            .map(|t| t.0)
            .collect();
        let key = match named[..] {
            [one] if present.contains(&one) => one,
            _ => {
                return Err(Error::UnsupportedModule {
                    module: format!("attention `{prefix}`"),
                    what: format!("a multimodal config.json ({})", present.join(", ")),
                    why: format!(
                        "the prefix names {}, so which sub-config gives its heads is ambiguous",
                        match named.len() {
                            0 => "no tower (text_model., language_model., vision_model., \
                                  vision_tower., audio_model. …)"
                                .to_string(),
                            _ => format!("the towers of {}", named.join(" and ")),
                        }
                    ),
                })
            }
        };
        let mut json = self.json[key].clone();
        if let (Some(obj), Some(parent)) = (json.as_object_mut(), self.model_type()) {
            obj.entry("model_type")
                .or_insert_with(|| Value::String(parent.to_string()));
        }
        Ok(HfConfig {
            json,
            source: format!("{} `{key}`", self.source),
        })
    }

    /// A norm's epsilon under `key` (`rms_norm_eps`, `layer_norm_eps`), `default` when absent;
    /// a non-number or a negative value is an error naming it.
    pub fn norm_eps(&self, key: &str, default: f64) -> Result<f64> {
        match self.number_in(&self.json, key)? {
            None => Ok(default),
            Some(e) if e.is_finite() && e >= 0.0 => Ok(e),
            Some(e) => Err(Error::file(
                &self.source,
                format!("config.json `{key}` = {e} is not a finite number ≥ 0"),
            )),
        }
    }

    /// This config with `defaults` — transformers' default values of the model type's config
    /// class — filled in where a key is absent (a `null` stays: it means unset). `rope_theta`
    /// counts as present inside `rope_parameters` / `rope_scaling` too.
    pub fn with_defaults(mut self, defaults: &[(&str, ConfigDefault)]) -> Self {
        for &(key, value) in defaults {
            let nested = |o: &str| self.json.get(o).and_then(|o| o.get(key)).is_some();
            let present = self.json.get(key).is_some()
                || (key == "rope_theta" && (nested("rope_parameters") || nested("rope_scaling")));
            if let (false, Some(obj)) = (present, self.json.as_object_mut()) {
                // Whole numbers as JSON integers, as transformers writes them.
                let v = match value {
                    ConfigDefault::Flag(b) => Value::from(b),
                    ConfigDefault::Number(x) if x.fract() == 0.0 && x >= 0.0 => {
                        Value::from(x as u64)
                    }
                    ConfigDefault::Number(x) => Value::from(x),
                };
                obj.insert(key.to_string(), v);
            }
        }
        self
    }

    /// `attention_bias`, when the config says it.
    pub fn attention_bias(&self) -> Result<Option<bool>> {
        self.flag("attention_bias")
    }

    /// `is_decoder: true` (BERT-like models run as decoders).
    pub fn is_decoder(&self) -> Result<bool> {
        Ok(self.flag("is_decoder")? == Some(true))
    }

    /// The raw value under `key` (top level).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.json.get(key)
    }

    /// A boolean under `key`; `Ok(None)` when absent or null, an error naming the key and value
    /// for any other JSON type (transformers' config validation raises on them).
    pub fn flag(&self, key: &str) -> Result<Option<bool>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("config.json `{key}` = {v} is not true or false"),
                )
            }),
        }
    }

    /// A positive integer under `key`; `Ok(None)` when absent or null.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n >= 1)
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::file(
                        &self.source,
                        format!("config.json `{key}` = {v} is not a positive integer"),
                    )
                }),
        }
    }

    /// The query heads of the attention module at `prefix`: each family's key, and for
    /// encoder-decoder models (`encoder_attention_heads`/`decoder_attention_heads`) the one of
    /// the stack the prefix lies in.
    pub fn heads(&self, prefix: &str) -> Result<usize> {
        let stacked = if super::model_types::in_decoder_stack(prefix) {
            "decoder_attention_heads"
        } else {
            "encoder_attention_heads"
        };
        for key in [
            stacked,
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "attention_heads",
        ] {
            if let Some(h) = self.usize(key)? {
                return Ok(h);
            }
        }
        Err(Error::file(
            &self.source,
            "config.json names no head count (num_attention_heads, n_head, n_heads, num_heads, \
             attention_heads, encoder_/decoder_attention_heads)",
        ))
    }

    /// Key/value heads when they differ from the query heads' key (`num_key_value_heads`,
    /// `multi_query` for one).
    pub fn kv_heads(&self) -> Result<Option<usize>> {
        if let Some(n) = self.usize("num_key_value_heads")? {
            return Ok(Some(n));
        }
        Ok(match self.flag("multi_query")? {
            Some(true) => Some(1),
            _ => None,
        })
    }

    /// `key` as an object, `None` when absent or null; any other JSON type is an error (as
    /// transformers' config validation raises for `rope_parameters: [1, 2]` or
    /// `rope_scaling: "linear"`).
    fn object_or_null(&self, key: &str) -> Result<Option<&Value>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) if v.is_object() => Ok(Some(v)),
            Some(v) => Err(Error::file(
                &self.source,
                format!("config.json `{key}` = {v} is not an object"),
            )),
        }
    }

    /// The number under `key` of `obj`; `None` when absent. Anything but a number is an error
    /// naming the key and value — null included for `rope_theta`, which transformers cannot
    /// compute with; elsewhere null means unset.
    fn number_in(&self, obj: &Value, key: &str) -> Result<Option<f64>> {
        match obj.get(key) {
            None => Ok(None),
            Some(Value::Null) if key != "rope_theta" => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("config.json `{key}` = {v} is not a number"),
                )
            }),
        }
    }

    /// `x` when finite and positive, else an error naming `key`.
    fn positive(&self, key: &str, x: f64) -> Result<f64> {
        match x.is_finite() && x > 0.0 {
            true => Ok(x),
            false => Err(Error::file(
                &self.source,
                format!("config.json `{key}` = {x} is not a finite positive number"),
            )),
        }
    }

    /// Gemma 2's `attn_logit_softcapping`, where the model type reads it; null is no cap.
    pub fn softcap(&self, reads: &[&str]) -> Result<Option<f32>> {
        if !reads.contains(&"attn_logit_softcapping") {
            return Ok(None);
        }
        Ok(self
            .positive_f64("attn_logit_softcapping")?
            .map(|c| c as f32))
    }

    /// OLMo's `clip_qkv`, where the model type reads it; null is no clamp.
    pub fn clip_qkv(&self, reads: &[&str]) -> Result<Option<f32>> {
        if !reads.contains(&"clip_qkv") {
            return Ok(None);
        }
        Ok(self.positive_f64("clip_qkv")?.map(|c| c as f32))
    }

    /// A finite positive number under `key`; `Ok(None)` when absent or null.
    fn positive_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| {
                    Error::file(
                        &self.source,
                        format!("config.json `{key}` = {v} is not a positive number"),
                    )
                }),
        }
    }

    /// The score scale the config asks of the module at `prefix`, when it is not 1/√head_dim:
    /// GPT-2's `scale_attn_weights = false` and `scale_attn_by_inverse_layer_idx`, Gemma 2's
    /// 1/√`query_pre_attn_scalar`, Granite's `attention_multiplier`, MPT's `softmax_scale`, where the model type reads them (`reads`; elsewhere
    /// [`HfConfig::check_settings`] refuses them).
    pub fn scale(&self, prefix: &str, head_dim: usize, reads: &[&str]) -> Result<Option<f32>> {
        let default = 1.0 / (head_dim as f64).sqrt();
        let mut scale = default;
        if reads.contains(&"query_pre_attn_scalar") {
            if let Some(s) = self.positive_f64("query_pre_attn_scalar")? {
                scale = 1.0 / s.sqrt();
            }
        }
        if reads.contains(&"softmax_scale") {
            // MPT's attn_config.softmax_scale (lifted by `with_own_rules`): the scale itself.
            if let Some(m) = self.json.get("softmax_scale").filter(|v| !v.is_null()) {
                scale = m.as_f64().filter(|m| m.is_finite()).ok_or_else(|| {
                    Error::file(
                        &self.source,
                        format!("config.json `attn_config.softmax_scale` = {m} is not a number"),
                    )
                })?;
            }
        }
        if reads.contains(&"attention_multiplier") {
            if let Some(m) = self
                .json
                .get("attention_multiplier")
                .filter(|v| !v.is_null())
            {
                scale = m.as_f64().filter(|m| m.is_finite()).ok_or_else(|| {
                    Error::file(
                        &self.source,
                        format!("config.json `attention_multiplier` = {m} is not a number"),
                    )
                })?;
            }
        }
        if reads.contains(&"scale_attn_weights") && self.flag("scale_attn_weights")? == Some(false)
        {
            scale = 1.0;
        }
        if reads.contains(&"scale_attn_by_inverse_layer_idx")
            && self.flag("scale_attn_by_inverse_layer_idx")? == Some(true)
        {
            let layer = layer_index(prefix).ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("scale_attn_by_inverse_layer_idx needs the layer of `{prefix}`"),
                )
            })?;
            scale /= (layer + 1) as f64;
        }
        Ok(((scale - default).abs() > 1e-12 * default).then_some(scale as f32))
    }

    /// Whether `position_embedding_type` is "rotary" (ESM); "absolute" or absent: no positions
    /// in the attention; any other value is refused (transformers 5.25's ESM has no other).
    pub fn rotary_position_type(&self) -> Result<bool> {
        match self.json.get("position_embedding_type") {
            None | Some(Value::Null) => Ok(false),
            Some(v) if v.as_str() == Some("absolute") => Ok(false),
            Some(v) if v.as_str() == Some("rotary") => Ok(true),
            Some(v) => Err(Error::file(
                &self.source,
                format!(
                    "config.json `position_embedding_type` = {v}: this model type's attention \
                     is \"absolute\" (none in the attention) or \"rotary\""
                ),
            )),
        }
    }

    /// T5's `relative_attention_num_buckets` (default 32) and `relative_attention_max_distance`
    /// (default 128).
    pub fn t5_bias(&self) -> Result<T5BiasSettings> {
        Ok(T5BiasSettings {
            buckets: self.usize("relative_attention_num_buckets")?.unwrap_or(32),
            max_distance: self
                .usize("relative_attention_max_distance")?
                .unwrap_or(128),
        })
    }
}

/// The layer number in a prefix: its first dot-separated part that is a number
/// (`model.layers.3.self_attn.` → 3).
pub fn layer_index(prefix: &str) -> Option<usize> {
    prefix.split('.').find_map(|part| part.parse().ok())
}

#[cfg(test)]
mod tests;
