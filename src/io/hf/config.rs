//! A Hugging Face `config.json`, read for what an attention layer needs: heads (by each
//! family's key), key/value heads, head size, the score scale rule, RoPE settings in either
//! spelling (transformers 4.x `rope_theta`/`rope_scaling`/`partial_rotary_factor`/`rotary_pct`,
//! transformers 5 `rope_parameters`), a sliding window and T5's relative-bias settings.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::rope::{Rope, RopeScaling};

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
        Ok(HfConfig { json, source })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// `model_type`, when the config names it.
    pub fn model_type(&self) -> Option<&str> {
        self.json.get("model_type").and_then(Value::as_str)
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

    fn f64(&self, obj: &Value, key: &str) -> Option<f64> {
        obj.get(key).and_then(Value::as_f64)
    }

    /// The query heads of the attention module at `prefix`: each family's key, and for
    /// encoder-decoder models (`encoder_attention_heads`/`decoder_attention_heads`) the one of
    /// the stack the prefix lies in.
    pub fn heads(&self, prefix: &str) -> Result<usize> {
        let stacked = if prefix.contains("decoder") {
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
        ] {
            if let Some(h) = self.usize(key)? {
                return Ok(h);
            }
        }
        Err(Error::file(
            &self.source,
            "config.json names no head count (num_attention_heads, n_head, n_heads, num_heads, \
             encoder_/decoder_attention_heads)",
        ))
    }

    /// Key/value heads when they differ from the query heads' key (`num_key_value_heads`,
    /// `multi_query` for one).
    pub fn kv_heads(&self) -> Result<Option<usize>> {
        if let Some(n) = self.usize("num_key_value_heads")? {
            return Ok(Some(n));
        }
        Ok(
            match self.json.get("multi_query").and_then(Value::as_bool) {
                Some(true) => Some(1),
                _ => None,
            },
        )
    }

    /// The RoPE of a module with heads of `head_dim`, from either spelling: θ (default 10000),
    /// the rotating share of each head (`partial_rotary_factor`, `rotary_pct`; default all of
    /// it), and `default`, `linear` or `llama3` scaling. Another `rope_type` (yarn, dynamic,
    /// longrope, …) is `Err(UnsupportedModule)`, never approximated.
    pub fn rope(&self, head_dim: usize) -> Result<Rope> {
        let params = self.json.get("rope_parameters").filter(|v| v.is_object());
        let scaling = self.json.get("rope_scaling").filter(|v| v.is_object());
        let find = |key: &str| {
            [params, scaling]
                .into_iter()
                .flatten()
                .find_map(|p| self.f64(p, key))
                .or_else(|| self.f64(&self.json, key))
        };
        let theta = find("rope_theta")
            .or_else(|| self.f64(&self.json, "rotary_emb_base"))
            .unwrap_or(10_000.0);
        let partial = find("partial_rotary_factor")
            .or_else(|| self.f64(&self.json, "rotary_pct"))
            .unwrap_or(1.0);
        let rope_type = [params, scaling]
            .into_iter()
            .flatten()
            .find_map(|p| p.get("rope_type").or_else(|| p.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let need = |key: &str| {
            find(key).ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("rope_type {rope_type:?} needs `{key}`"),
                )
            })
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
                original_max_positions: self
                    .f64(&self.json, "original_max_position_embeddings")
                    .map_or_else(|| need("original_max_position_embeddings"), Ok)?,
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
        let rotary_dims = (head_dim as f64 * partial) as usize;
        let rope = Rope {
            theta,
            rotary_dims,
            interleaved: false,
            scaling,
        };
        rope.check(head_dim)?;
        Ok(rope)
    }

    /// Mistral-style `sliding_window` (query i sees keys i − W < j ≤ i), when set and in use by
    /// the layer at `prefix`: `layer_types` (when given) says which layers slide.
    pub fn sliding_window(&self, prefix: &str) -> Result<Option<usize>> {
        if self.json.get("use_sliding_window").and_then(Value::as_bool) == Some(false) {
            return Ok(None);
        }
        let Some(window) = self.usize("sliding_window")? else {
            return Ok(None);
        };
        let Some(types) = self.json.get("layer_types").and_then(Value::as_array) else {
            return Ok(Some(window));
        };
        let kind = layer_index(prefix)
            .and_then(|n| types.get(n))
            .and_then(Value::as_str);
        match kind {
            Some("sliding_attention") => Ok(Some(window)),
            Some(_) => Ok(None),
            None => Err(Error::file(
                &self.source,
                format!("config.json `layer_types` does not say whether layer `{prefix}` slides"),
            )),
        }
    }

    /// The score scale the config asks of the module at `prefix`, when it is not 1/√head_dim:
    /// gemma's `query_pre_attn_scalar`, GPT-2's `scale_attn_weights = false` and
    /// `scale_attn_by_inverse_layer_idx`. Settings that change the scores in ways the engine
    /// does not run (logit soft-capping, BERT's relative distance embeddings) are refused.
    pub fn scale(&self, prefix: &str, head_dim: usize) -> Result<Option<f32>> {
        let refuse = |what: String, why: &str| Error::UnsupportedModule {
            module: format!("attention `{prefix}`"),
            what,
            why: why.into(),
        };
        if let Some(cap) = self
            .json
            .get("attn_logit_softcapping")
            .filter(|v| !v.is_null())
        {
            return Err(refuse(
                format!("attn_logit_softcapping = {cap}"),
                "scores are soft-capped with tanh before the softmax",
            ));
        }
        if let Some(kind) = self
            .json
            .get("position_embedding_type")
            .and_then(Value::as_str)
            .filter(|k| k.starts_with("relative"))
        {
            return Err(refuse(
                format!("position_embedding_type {kind:?}"),
                "BERT's relative distance embeddings add to the scores",
            ));
        }
        let mut scale = match self
            .json
            .get("query_pre_attn_scalar")
            .and_then(Value::as_f64)
        {
            Some(s) if s > 0.0 => 1.0 / s.sqrt(),
            _ => 1.0 / (head_dim as f64).sqrt(),
        };
        if self.json.get("scale_attn_weights").and_then(Value::as_bool) == Some(false) {
            scale = 1.0;
        }
        if self
            .json
            .get("scale_attn_by_inverse_layer_idx")
            .and_then(Value::as_bool)
            == Some(true)
        {
            let layer = layer_index(prefix).ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("scale_attn_by_inverse_layer_idx needs the layer of `{prefix}`"),
                )
            })?;
            scale /= (layer + 1) as f64;
        }
        let default = 1.0 / (head_dim as f64).sqrt();
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
        assert_eq!(c("{}").scale("h.0.attn.", 16).unwrap(), None);
        assert_eq!(
            c(r#"{"query_pre_attn_scalar": 64}"#)
                .scale("x.", 16)
                .unwrap(),
            Some(0.125)
        );
        assert_eq!(
            c(r#"{"scale_attn_weights": false}"#)
                .scale("h.0.", 16)
                .unwrap(),
            Some(1.0)
        );
        let by_layer = c(r#"{"scale_attn_by_inverse_layer_idx": true}"#);
        assert_eq!(by_layer.scale("h.3.attn.", 16).unwrap(), Some(0.0625));
        assert!(by_layer.scale("attn.", 16).is_err());
        assert!(c(r#"{"attn_logit_softcapping": 50.0}"#)
            .scale("x.", 16)
            .is_err());
        assert!(c(r#"{"attn_logit_softcapping": null}"#)
            .scale("x.", 16)
            .is_ok());
        assert!(c(r#"{"position_embedding_type": "relative_key"}"#)
            .scale("x.", 16)
            .is_err());
        let typed =
            c(r#"{"sliding_window": 4, "layer_types": ["full_attention", "sliding_attention"]}"#);
        assert_eq!(typed.sliding_window("layers.0.self_attn.").unwrap(), None);
        assert_eq!(
            typed.sliding_window("layers.1.self_attn.").unwrap(),
            Some(4)
        );
        assert!(typed.sliding_window("layers.7.self_attn.").is_err());
        assert_eq!(layer_index("model.decoder.layers.12.self_attn."), Some(12));
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
        assert_eq!(v4.rope(8).unwrap(), v5.rope(8).unwrap());
        assert!(
            matches!(v4.rope(8).unwrap().scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0)
        );
        let neox =
            HfConfig::parse(r#"{"rotary_pct": 0.25, "rotary_emb_base": 1000}"#, "t").unwrap();
        assert_eq!(
            (
                neox.rope(16).unwrap().rotary_dims,
                neox.rope(16).unwrap().theta
            ),
            (4, 1000.0)
        );
        let yarn = HfConfig::parse(
            r#"{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#,
            "t",
        )
        .unwrap();
        assert!(matches!(yarn.rope(8), Err(Error::UnsupportedModule { .. })));
        let missing = HfConfig::parse(r#"{"rope_scaling": {"rope_type": "linear"}}"#, "t").unwrap();
        assert!(missing.rope(8).is_err());
    }
}
