//! Falcon's, MPT's and DBRX's own config rules: Falcon's key/value heads (by
//! `new_decoder_architecture`, `multi_query`, `num_kv_heads`) and its refused `alibi`; MPT's
//! nested `attn_config`, whose keys the loader reads (`clip_qkv`, `softmax_scale`) or refuses by
//! name; DBRX's (`kv_n_heads`, `clip_qkv`, its ignored `rope_theta`).

use serde_json::Value;

use super::HfConfig;
use crate::error::{Error, Result};

/// An `attn_config` key of MPT that changes the answer, with its neutral values and why.
type Rule = (&'static str, fn(&Value) -> bool, &'static str);

/// transformers' MptAttention ignores these keys, so a checkpoint that sets them was trained
/// with attention that neither transformers nor the loader computes.
const MPT_REFUSED: &[Rule] = &[
    ("attn_type", |v| v.is_null() || v.as_str() == Some("multihead_attention"), "only multi-head attention is built (transformers ignores the other kinds)"),
    ("prefix_lm", off, "a bidirectional prefix is not implemented (transformers ignores it)"),
    ("qk_ln", off, "q/k LayerNorm is not implemented (transformers ignores it)"),
    ("qk_gn", off, "q/k group norm is not implemented (transformers ignores it)"),
    ("attn_uses_sequence_id", off, "attention within sequence ids is not implemented"),
    ("alibi", |v| v.is_null() || v.as_bool() == Some(true), "transformers' MptModel adds ALiBi whatever this says, and the loader does too, so a model trained without it would run with it"),
    ("alibi_bias_max", |v| v.is_null() || v.as_f64() == Some(8.0), "transformers' MptModel builds its ALiBi with max 8 whatever this says"),
    ("rope", off, "rotary embeddings in MPT are not implemented (transformers ignores them)"),
    ("sliding_window_size", |v| v.is_null() || v.as_i64() == Some(-1), "a sliding window in MPT is not implemented (transformers ignores it)"),
    ("kv_n_heads", |v| v.is_null(), "grouped key/value heads in MPT are not implemented (transformers builds multi-head Wqkv)"),
];

fn off(v: &Value) -> bool {
    v.is_null() || v.as_bool() == Some(false)
}

impl HfConfig {
    /// The model type's own rules before anything is read: Falcon's `alibi` is refused; MPT's
    /// `attn_config` keys are checked, and the two it reads become top-level keys (the rest of
    /// the loader reads those; a top-level one that MptAttention never reads is replaced).
    pub fn with_own_rules(mut self, prefix: &str, model_type: &str) -> Result<Self> {
        let refuse = |what: String, why: &str| Error::UnsupportedModule {
            module: format!("{model_type} attention `{prefix}`"),
            what,
            why: why.to_string(),
        };
        match model_type {
            "falcon" if self.flag("alibi")? == Some(true) => Err(refuse(
                "config.json `alibi` = true".into(),
                "Falcon's ALiBi (transformers' build_alibi_tensor) rounds the slopes and each \
                 slope·position to bfloat16 and divides the bias by √head_dim; the loader's \
                 ALiBi is exact f32 with BLOOM's scale",
            )),
            "mpt" => {
                let attn = self.attn_config()?;
                for (key, neutral, why) in MPT_REFUSED {
                    if let Some(v) = attn.get(*key).filter(|v| !neutral(v)) {
                        return Err(refuse(
                            format!("config.json `attn_config.{key}` = {v}"),
                            why,
                        ));
                    }
                }
                if let Some(obj) = self.json.as_object_mut() {
                    for key in ["clip_qkv", "softmax_scale"] {
                        obj.insert(key.into(), attn.get(key).cloned().unwrap_or(Value::Null));
                    }
                }
                Ok(self)
            }
            "dbrx" => self.dbrx_rules(prefix),
            _ => Ok(self),
        }
    }

    /// The nested `attn_config` of MPT and DBRX (an empty object when absent or null).
    fn attn_config(&self) -> Result<Value> {
        match self.json.get("attn_config") {
            None | Some(Value::Null) => Ok(Value::Object(Default::default())),
            Some(v) if v.is_object() => Ok(v.clone()),
            Some(v) => Err(Error::file(
                &self.source,
                format!("config.json `attn_config` = {v} is not an object"),
            )),
        }
    }

    /// DBRX's `attn_config`: `kv_n_heads` (default 1) becomes `num_key_value_heads` and
    /// `clip_qkv` a top-level key, as DbrxConfig sets them. DbrxAttention reads
    /// `attn_config.rope_theta` but rotates by `rope_parameters` (default θ 10000): a
    /// checkpoint whose two θ differ is refused, since the one transformers uses is not the
    /// one the model was trained with.
    fn dbrx_rules(mut self, prefix: &str) -> Result<Self> {
        let attn = self.attn_config()?;
        let rope_theta = |v: &Value| v.get("rope_theta").and_then(Value::as_f64);
        let used = self
            .json
            .get("rope_parameters")
            .and_then(rope_theta)
            .or_else(|| rope_theta(&self.json))
            .unwrap_or(10000.0);
        if let Some(theta) = attn.get("rope_theta").filter(|v| !v.is_null()) {
            if theta.as_f64() != Some(used) {
                return Err(Error::UnsupportedModule {
                    module: format!("dbrx attention `{prefix}`"),
                    what: format!("config.json `attn_config.rope_theta` = {theta}"),
                    why: format!(
                        "transformers 5.25 rotates by rope_parameters' θ = {used} and ignores \
                         this one, so the answer would not be the trained model's"
                    ),
                });
            }
        }
        let kv = attn.get("kv_n_heads").cloned().unwrap_or(Value::from(1));
        let clip = attn.get("clip_qkv").cloned().unwrap_or(Value::Null);
        if let Some(obj) = self.json.as_object_mut() {
            obj.insert("num_key_value_heads".into(), kv);
            obj.insert("clip_qkv".into(), clip);
        }
        Ok(self)
    }

    /// Key/value heads as the model type's config class computes them: Falcon's from
    /// `new_decoder_architecture` (`num_kv_heads`, default the query heads) and `multi_query`
    /// (one), else one per query head — transformers recomputes its saved
    /// `num_key_value_heads` the same way and ignores the stored value; the others by
    /// [`HfConfig::kv_heads`].
    pub fn kv_heads_of(&self, model_type: &str, heads: usize) -> Result<Option<usize>> {
        if model_type != "falcon" {
            return self.kv_heads();
        }
        let kv = self.usize("num_kv_heads")?.unwrap_or(heads);
        if self.flag("new_decoder_architecture")? == Some(true) {
            return Ok(Some(kv));
        }
        if self.flag("multi_query")? != Some(false) {
            return Ok(Some(1));
        }
        if kv != heads {
            // FalconAttention packs one key/value head per query head here, then repeats them
            // as if there were num_kv_heads: transformers fails on it.
            return Err(Error::UnsupportedModule {
                module: "falcon attention".into(),
                what: format!("config.json `num_kv_heads` = {kv} without new_decoder_architecture or multi_query"),
                why: format!("its query_key_value holds one key/value head per query head ({heads}), which transformers cannot repeat into {kv} groups"),
            });
        }
        Ok(Some(heads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> HfConfig {
        HfConfig::parse(text, "test").unwrap()
    }

    #[test]
    fn falcon_key_value_heads_are_its_config_class_s() {
        let kv = |text: &str| config(text).kv_heads_of("falcon", 8);
        // multi_query (the default, filled in by the model type's defaults) is one head.
        assert_eq!(
            kv(r#"{"multi_query": true, "num_kv_heads": 4}"#).unwrap(),
            Some(1)
        );
        // new_decoder_architecture: num_kv_heads, whatever num_key_value_heads says.
        let gqa = r#"{"new_decoder_architecture": true, "multi_query": true, "num_kv_heads": 2,
            "num_key_value_heads": 1}"#;
        assert_eq!(kv(gqa).unwrap(), Some(2));
        assert_eq!(
            kv(r#"{"new_decoder_architecture": true}"#).unwrap(),
            Some(8)
        );
        assert_eq!(kv(r#"{"multi_query": false}"#).unwrap(), Some(8));
        let err = kv(r#"{"multi_query": false, "num_kv_heads": 2}"#).unwrap_err();
        assert!(err.to_string().contains("num_kv_heads"), "{err}");
        // Other model types keep the generic rule.
        let other = config(r#"{"num_kv_heads": 2, "num_key_value_heads": 4}"#);
        assert_eq!(other.kv_heads_of("llama", 8).unwrap(), Some(4));
    }

    #[test]
    fn falcon_alibi_and_mpt_attn_config_keys_are_refused_by_name() {
        let err = config(r#"{"alibi": true}"#)
            .with_own_rules("h.0.self_attention.", "falcon")
            .unwrap_err();
        assert!(err.to_string().contains("bfloat16"), "{err}");
        assert!(config(r#"{"alibi": false}"#)
            .with_own_rules("p.", "falcon")
            .is_ok());
        for (setting, key) in [
            (r#""attn_type": "multiquery_attention""#, "attn_type"),
            (r#""prefix_lm": true"#, "prefix_lm"),
            (r#""qk_ln": true"#, "qk_ln"),
            (r#""attn_uses_sequence_id": true"#, "attn_uses_sequence_id"),
            (r#""alibi": false"#, "alibi"),
            (r#""alibi_bias_max": 16"#, "alibi_bias_max"),
            (r#""rope": true"#, "rope"),
            (r#""sliding_window_size": 64"#, "sliding_window_size"),
            (r#""kv_n_heads": 2"#, "kv_n_heads"),
        ] {
            let text = format!(r#"{{"model_type": "mpt", "attn_config": {{{setting}}}}}"#);
            let err = config(&text).with_own_rules("p.", "mpt").unwrap_err();
            let want = format!("`attn_config.{key}`");
            assert!(err.to_string().contains(&want), "{setting}: {err}");
        }
    }

    #[test]
    fn mpt_reads_clip_qkv_and_softmax_scale_from_attn_config_only() {
        let reads = ["clip_qkv", "softmax_scale"];
        let neutral = r#"{"attn_config": {"alibi": true, "alibi_bias_max": 8, "attn_impl": "torch",
            "attn_pdrop": 0.1, "qk_ln": false, "clip_qkv": 0.5, "softmax_scale": 0.25}}"#;
        let c = config(neutral).with_own_rules("p.", "mpt").unwrap();
        assert_eq!(c.clip_qkv(&reads).unwrap(), Some(0.5));
        assert_eq!(c.scale("p.", 8, &reads).unwrap(), Some(0.25));
        // A top-level clip_qkv is not MPT's: transformers reads attn_config's, here none.
        let c = config(r#"{"clip_qkv": 2.0}"#)
            .with_own_rules("p.", "mpt")
            .unwrap();
        assert_eq!(c.clip_qkv(&reads).unwrap(), None);
        assert_eq!(c.scale("p.", 8, &reads).unwrap(), None);
    }
}
