//! A Hugging Face `config.json`, read for what an attention layer needs: heads (by each
//! family's key), key/value heads, head size, the score scale rule, RoPE settings in either
//! spelling (transformers 4.x `rope_theta`/`rope_scaling`/`partial_rotary_factor`/`rotary_pct`,
//! transformers 5 `rope_parameters`), a sliding window and T5's relative-bias settings. A key
//! that changes the answer and that the module's model type does not read is refused by name
//! ([`SETTINGS`]), never ignored. Multimodal configs keep each tower's settings in
//! `text_config` / `vision_config` / `audio_config`: [`HfConfig::for_module`] picks the one a
//! prefix lies in.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::rope::{Rope, RopeScaling};

mod settings;
pub use settings::{Setting, SETTINGS};

/// More layers than any model has: a bound on what a config's layer lists may expand to.
const MAX_LAYERS: usize = 1 << 16;

/// transformers' attention layer kinds (`ALLOWED_ATTN_LAYER_TYPES`, 5.25).
const LAYER_KINDS: &[&str] = &[
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "window_attention",
    "indexed_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
    "minimax_m3_sparse",
    "conv",
    "moe",
    "hybrid",
    "hybrid_sliding",
    "reference_sliding_attention",
    "linear_attention",
];

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
    pub buckets: usize,
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

    /// `attention_bias`, when the config says it.
    pub fn attention_bias(&self) -> Result<Option<bool>> {
        self.flag("attention_bias")
    }

    /// `is_decoder: true` (BERT-like models run as decoders).
    pub fn is_decoder(&self) -> Result<bool> {
        Ok(self.flag("is_decoder")? == Some(true))
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

    /// The RoPE of a module with heads of `head_dim`, from either spelling: θ (default 10000),
    /// the rotating share of each head (`partial_rotary_factor`, `rotary_pct`; default
    /// `default_share`, the model type's: 0.25 for gpt_neox, else all of it), and `default`,
    /// `linear` or `llama3` scaling. Another `rope_type` (yarn, dynamic, longrope, …) is
    /// `Err(UnsupportedModule)`, never approximated; a value of the wrong JSON type (θ as a
    /// string or null, `rope_type: 5`, `rope_parameters: [1, 2]`) is an error naming the key, as
    /// transformers raises.
    pub fn rope(&self, head_dim: usize, default_share: f64) -> Result<Rope> {
        let params = self.object_or_null("rope_parameters")?;
        let scaling = self.object_or_null("rope_scaling")?;
        // transformers 5 nests one object per layer type (gemma3, gpt-oss); never read as one.
        if let Some(nested) = [params, scaling]
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
            .find_map(|o| o.iter().find(|(_, v)| v.is_object()))
        {
            return Err(Error::UnsupportedModule {
                module: self.source.clone(),
                what: format!("RoPE parameters per layer type (`{}`)", nested.0),
                why: "one RoPE per layer kind is not implemented".into(),
            });
        }
        let find = |key: &str| -> Result<Option<f64>> {
            for p in [params, scaling].into_iter().flatten() {
                if let Some(x) = self.number_in(p, key)? {
                    return Ok(Some(x));
                }
            }
            self.number_in(&self.json, key)
        };
        let theta = match find("rope_theta")? {
            Some(t) => t,
            None => self
                .number_in(&self.json, "rotary_emb_base")?
                .unwrap_or(10_000.0),
        };
        self.positive("rope_theta", theta)?;
        let share = match find("partial_rotary_factor")? {
            Some(s) => s,
            None => self
                .number_in(&self.json, "rotary_pct")?
                .unwrap_or(default_share),
        };
        if !(share > 0.0 && share <= 1.0) {
            return Err(Error::file(
                &self.source,
                format!("config.json's rotating share of each head {share} is not in (0, 1]"),
            ));
        }
        let mut rope_type = "default";
        for p in [params, scaling].into_iter().flatten() {
            if let Some(t) = p.get("rope_type").or_else(|| p.get("type")) {
                rope_type = t.as_str().ok_or_else(|| {
                    Error::file(
                        &self.source,
                        format!("config.json `rope_type` = {t} is not a string"),
                    )
                })?;
                break;
            }
        }
        let need = |key: &str| -> Result<f64> {
            let x = find(key)?.ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("rope_type {rope_type:?} needs `{key}`"),
                )
            })?;
            self.positive(key, x)
        };
        let scaling = match rope_type {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: need("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                // transformers prefers the top-level value (phi3 writes both).
                original_max_positions: match self
                    .number_in(&self.json, "original_max_position_embeddings")?
                {
                    Some(n) => self.positive("original_max_position_embeddings", n)?,
                    None => need("original_max_position_embeddings")?,
                },
            },
            other => {
                return Err(Error::UnsupportedModule {
                    module: self.source.clone(),
                    what: format!("rope_type {other:?}"),
                    why: "RoPE runs the default, linear and llama3 types".into(),
                })
            }
        };
        // transformers: int(head_dim · partial_rotary_factor) dimensions rotate.
        let rotary_dims = (head_dim as f64 * share) as usize;
        let rope = Rope {
            theta,
            rotary_dims,
            interleaved: false,
            scaling,
        };
        rope.check(head_dim)?;
        Ok(rope)
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

    /// Mistral-style `sliding_window` (query i sees keys i − W < j ≤ i), when the model type
    /// reads it (`reads`) and the layer at `prefix` uses it: qwen2's `use_sliding_window`, and
    /// which layers slide by `layer_types` or else `max_window_layers` (layers from it on).
    /// A layer kind other than full or sliding attention is refused.
    pub fn sliding_window(&self, prefix: &str, reads: &[&str]) -> Result<Option<usize>> {
        if reads.contains(&"attention_layers") {
            return self.gpt_neo_window(prefix);
        }
        if !reads.contains(&"sliding_window") {
            return Ok(None);
        }
        if reads.contains(&"use_sliding_window") && self.flag("use_sliding_window")? != Some(true) {
            return Ok(None);
        }
        let Some(window) = self.usize("sliding_window")? else {
            return Ok(None);
        };
        let types = self
            .json
            .get("layer_types")
            .and_then(Value::as_array)
            .filter(|_| reads.contains(&"layer_types"));
        let layer = layer_index(prefix);
        // Gemma 2 configs saved by transformers 4 have no layer_types: layer i slides when i is
        // even (the rule transformers 5 fills layer_types with).
        if types.is_none() && self.model_type() == Some("gemma2") {
            let n = layer.ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("Gemma 2's alternating windows need the layer of `{prefix}`"),
                )
            })?;
            return Ok(n.is_multiple_of(2).then_some(window));
        }
        let Some(types) = types else {
            let first = match reads.contains(&"max_window_layers") {
                true => self.usize("max_window_layers")?.unwrap_or(0),
                false => 0,
            };
            return match (first, layer) {
                (0, _) => Ok(Some(window)),
                (_, Some(n)) => Ok((n >= first).then_some(window)),
                (_, None) => Err(Error::file(
                    &self.source,
                    format!("max_window_layers needs the layer of `{prefix}`"),
                )),
            };
        };
        match layer.and_then(|n| types.get(n)).and_then(Value::as_str) {
            Some("sliding_attention") => Ok(Some(window)),
            Some("full_attention") => Ok(None),
            Some(other) => Err(Error::UnsupportedModule {
                module: format!("attention `{prefix}`"),
                what: format!("layer type {other:?}"),
                why: "layers run full or sliding-window attention".into(),
            }),
            None => Err(Error::file(
                &self.source,
                format!("config.json `layer_types` does not say whether layer `{prefix}` slides"),
            )),
        }
    }

    /// GPT-Neo's window: a layer `local` in `attention_layers` (or, where that is absent, in
    /// `attention_types` expanded as transformers does: `[[kinds, n], …]` repeats `kinds` n
    /// times) sees keys i − window_size < j ≤ i; a `global` layer sees every earlier key.
    fn gpt_neo_window(&self, prefix: &str) -> Result<Option<usize>> {
        let layer = layer_index(prefix).ok_or_else(|| {
            Error::file(
                &self.source,
                format!("GPT-Neo's attention_layers need the layer of `{prefix}`"),
            )
        })?;
        let kinds: Vec<String> = match self.json.get("attention_layers").and_then(Value::as_array) {
            Some(layers) => layers
                .iter()
                .map(|k| k.as_str().unwrap_or("").to_string())
                .collect(),
            None => self.expand_attention_types()?,
        };
        let bad = |what: String| Error::file(&self.source, what);
        match kinds.get(layer).map(String::as_str) {
            Some("global") => Ok(None),
            // transformers' GPTNeoConfig default window_size is 256.
            Some("local") => Ok(Some(self.usize("window_size")?.unwrap_or(256))),
            Some(other) => Err(Error::UnsupportedModule {
                module: format!("attention `{prefix}`"),
                what: format!("GPT-Neo layer kind {other:?}"),
                why: "GPT-Neo layers are global or local".into(),
            }),
            None => Err(bad(format!(
                "config.json `attention_layers` / `attention_types` do not say whether layer \
                 `{prefix}` is global or local"
            ))),
        }
    }

    /// `attention_types` `[[["global", "local"], 12]]` → 24 kinds, layer by layer. A malformed
    /// item, or more layers than any model has, is an error naming the key.
    fn expand_attention_types(&self) -> Result<Vec<String>> {
        let bad = |what: String| Error::file(&self.source, what);
        let items = match self.json.get("attention_types") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Array(items)) => items,
            Some(v) => {
                return Err(bad(format!(
                    "config.json `attention_types` = {v} is not a list"
                )))
            }
        };
        let mut kinds = Vec::new();
        for item in items {
            let (Some(pattern), Some(times)) = (
                item.get(0).and_then(Value::as_array),
                item.get(1).and_then(Value::as_u64),
            ) else {
                return Err(bad(format!(
                    "config.json `attention_types` item {item} is not [[kinds…], times]"
                )));
            };
            let total = (pattern.len() as u64).saturating_mul(times);
            if total.saturating_add(kinds.len() as u64) > MAX_LAYERS as u64 {
                return Err(bad(format!(
                    "config.json `attention_types` expands past {MAX_LAYERS} layers"
                )));
            }
            for _ in 0..times {
                kinds.extend(pattern.iter().map(|k| k.as_str().unwrap_or("").to_string()));
            }
        }
        Ok(kinds)
    }

    /// transformers validates `layer_types` on every config: a list of known layer kinds, one
    /// per layer (`num_hidden_layers`). Anything else is an error naming the entry; a known kind
    /// other than full or sliding attention is refused where its layer is loaded.
    pub(crate) fn check_layer_types(&self) -> Result<()> {
        let types = match self.json.get("layer_types") {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::Array(types)) => types,
            Some(v) => {
                return Err(Error::file(
                    &self.source,
                    format!("config.json `layer_types` = {v} is not a list"),
                ))
            }
        };
        for (n, t) in types.iter().enumerate() {
            if !t.as_str().is_some_and(|k| LAYER_KINDS.contains(&k)) {
                return Err(Error::file(
                    &self.source,
                    format!(
                        "config.json `layer_types`[{n}] = {t} is not a layer type transformers \
                         knows ({})",
                        LAYER_KINDS.join(", ")
                    ),
                ));
            }
        }
        match self.usize("num_hidden_layers")? {
            Some(n) if n != types.len() => Err(Error::file(
                &self.source,
                format!(
                    "config.json has num_hidden_layers = {n} but {} `layer_types`",
                    types.len()
                ),
            )),
            _ => Ok(()),
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
    /// 1/√`query_pre_attn_scalar`, Granite's `attention_multiplier`, where the model type reads them (`reads`; elsewhere
    /// [`HfConfig::check_settings`] refuses them).
    pub fn scale(&self, prefix: &str, head_dim: usize, reads: &[&str]) -> Result<Option<f32>> {
        let default = 1.0 / (head_dim as f64).sqrt();
        let mut scale = default;
        if reads.contains(&"query_pre_attn_scalar") {
            if let Some(s) = self.positive_f64("query_pre_attn_scalar")? {
                scale = 1.0 / s.sqrt();
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
mod tests {
    use super::*;

    #[test]
    fn heads_follow_the_family_key_and_the_stack() {
        let bart = HfConfig::parse(
            r#"{"model_type": "bart", "encoder_attention_heads": 4, "decoder_attention_heads": 2}"#,
            "t",
        )
        .unwrap();
        assert_eq!(bart.heads("model.encoder.layers.0.self_attn.").unwrap(), 4);
        assert_eq!(
            bart.heads("model.decoder.layers.0.encoder_attn.").unwrap(),
            2
        );
        let gpt2 = HfConfig::parse(r#"{"n_head": 3}"#, "t").unwrap();
        assert_eq!(gpt2.heads("h.0.attn.").unwrap(), 3);
        assert!(HfConfig::parse(r#"{"n_head": 0}"#, "t")
            .unwrap()
            .heads("")
            .is_err());
        assert!(HfConfig::parse("[1]", "t").is_err());
    }

    #[test]
    fn scale_rules_and_refused_settings() {
        let c = |text: &str| HfConfig::parse(text, "t").unwrap();
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
        let clip = HfConfig::parse(
            r#"{"model_type": "clip", "text_config": {"model_type": "clip_text_model",
                "num_attention_heads": 2}, "vision_config": {"num_attention_heads": 4}}"#,
            "t",
        )
        .unwrap();
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
        let xglm = HfConfig::parse(r#"{"model_type": "xglm", "attention_heads": 3}"#, "t").unwrap();
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
        let v4 = HfConfig::parse(
            r#"{"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}}"#,
            "t",
        )
        .unwrap();
        let v5 = HfConfig::parse(
            r#"{"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}}"#,
            "t",
        )
        .unwrap();
        assert_eq!(v4.rope(8, 1.0).unwrap(), v5.rope(8, 1.0).unwrap());
        assert!(
            matches!(v4.rope(8, 1.0).unwrap().scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0)
        );
        let neox =
            HfConfig::parse(r#"{"rotary_pct": 0.25, "rotary_emb_base": 1000}"#, "t").unwrap();
        assert_eq!(
            (
                neox.rope(16, 1.0).unwrap().rotary_dims,
                neox.rope(16, 1.0).unwrap().theta
            ),
            (4, 1000.0)
        );
        let yarn = HfConfig::parse(
            r#"{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#,
            "t",
        )
        .unwrap();
        assert!(matches!(
            yarn.rope(8, 1.0),
            Err(Error::UnsupportedModule { .. })
        ));
        let missing = HfConfig::parse(r#"{"rope_scaling": {"rope_type": "linear"}}"#, "t").unwrap();
        assert!(missing.rope(8, 1.0).is_err());
    }
}
