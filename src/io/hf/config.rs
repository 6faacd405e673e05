//! A Hugging Face `config.json`, read for what an attention layer needs: heads (by each
//! family's key), key/value heads, head size, the score scale rule, RoPE settings in either
//! spelling (transformers 4.x `rope_theta`/`rope_scaling`/`partial_rotary_factor`/`rotary_pct`,
//! transformers 5 `rope_parameters`), a sliding window and T5's relative-bias settings.

use serde_json::Value;

use crate::error::{Error, Result};

/// The parsed `config.json` of one model.
#[derive(Debug, Clone)]
pub struct HfConfig {
    json: Value,
    /// Where the text came from, for messages (`DIR/config.json`, or a case file's `hf_config`).
    source: String,
}

/// Rotary position embedding settings, as far as the config states them.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSettings {
    pub theta: f64,
    /// `rope_type` of `rope_scaling`/`rope_parameters` (`default`, `linear`, `llama3`, …).
    pub rope_type: String,
    /// Fraction of each head's dimensions that rotate (`partial_rotary_factor`, `rotary_pct`).
    pub partial: f64,
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

    /// RoPE settings from either spelling, with transformers' defaults (θ = 10000, the whole
    /// head rotates) where a key is absent; meaningful only for a family that uses RoPE
    /// ([`super::families::Family::uses_rope`]).
    pub fn rope(&self) -> RopeSettings {
        let params = self.json.get("rope_parameters");
        let scaling = self.json.get("rope_scaling").filter(|v| v.is_object());
        let theta = params
            .and_then(|p| self.f64(p, "rope_theta"))
            .or_else(|| self.f64(&self.json, "rope_theta"))
            .or_else(|| self.f64(&self.json, "rotary_emb_base"))
            .unwrap_or(10_000.0);
        let rope_type = [params, scaling]
            .into_iter()
            .flatten()
            .find_map(|p| p.get("rope_type").or_else(|| p.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let partial = params
            .and_then(|p| self.f64(p, "partial_rotary_factor"))
            .or_else(|| self.f64(&self.json, "partial_rotary_factor"))
            .or_else(|| self.f64(&self.json, "rotary_pct"))
            .unwrap_or(1.0);
        RopeSettings {
            theta,
            rope_type,
            partial,
        }
    }

    /// Mistral-style `sliding_window` (query i sees keys i − W < j ≤ i), when set and in use.
    pub fn sliding_window(&self) -> Result<Option<usize>> {
        if self.json.get("use_sliding_window").and_then(Value::as_bool) == Some(false) {
            return Ok(None);
        }
        self.usize("sliding_window")
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
    fn rope_reads_both_spellings() {
        let v4 = HfConfig::parse(
            r#"{"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}"#,
            "t",
        )
        .unwrap();
        let v5 = HfConfig::parse(
            r#"{"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}}"#,
            "t",
        )
        .unwrap();
        assert_eq!(v4.rope(), v5.rope());
        assert_eq!(v4.rope().rope_type, "llama3");
        let neox = HfConfig::parse(r#"{"rotary_pct": 0.25}"#, "t").unwrap();
        assert_eq!(neox.rope().partial, 0.25);
        assert_eq!(neox.rope().theta, 10_000.0);
    }
}
