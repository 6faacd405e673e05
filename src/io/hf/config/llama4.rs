//! Llama 4's per-layer attention settings (Llama4TextConfig): chunked local attention on the
//! layers `layer_types` calls `chunked_attention` (by default the RoPE layers, when
//! `attention_chunk_size` is set), and temperature tuning on the NoPE layers; a layer's kind by
//! `layer_types`, for messages (Qwen3-Next's linear-attention layers).

use serde_json::Value;

use super::HfConfig;
use crate::error::{Error, Result};
use crate::model::config::TemperatureTuning;

impl HfConfig {
    /// The chunk of Llama 4's layer at `prefix`: `attention_chunk_size` where the layer is
    /// chunked, `None` where it is full attention. Another layer kind is refused.
    pub fn attention_chunk(&self, prefix: &str) -> Result<Option<usize>> {
        let chunked = match self.json.get("layer_types").and_then(Value::as_array) {
            None => self.usize("attention_chunk_size")?.is_some() && self.rope_layer(prefix)?,
            Some(types) => {
                let layer = super::layer_index(prefix).ok_or_else(|| {
                    Error::file(
                        &self.source,
                        format!("which layers are chunked depends on the layer of `{prefix}`, which it does not name"),
                    )
                })?;
                match types.get(layer).and_then(Value::as_str) {
                    Some("chunked_attention") => true,
                    Some("full_attention") => false,
                    Some(other) => {
                        return Err(Error::UnsupportedModule {
                            module: format!("attention `{prefix}`"),
                            what: format!("layer type {other:?}"),
                            why: "Llama 4's layers run full or chunked attention".into(),
                        })
                    }
                    None => {
                        return Err(Error::file(
                            &self.source,
                            format!("config.json `layer_types` has no entry for `{prefix}`"),
                        ))
                    }
                }
            }
        };
        if !chunked {
            return Ok(None);
        }
        match self.usize("attention_chunk_size")? {
            Some(c) => Ok(Some(c)),
            // transformers raises building this mask.
            None => Err(Error::file(
                &self.source,
                format!(
                    "`{prefix}` is a chunked layer, but config.json sets no attention_chunk_size"
                ),
            )),
        }
    }

    /// Llama 4's temperature tuning of the layer at `prefix`: on its NoPE layers when
    /// `attn_temperature_tuning` is set, with `floor_scale` and `attn_scale`.
    pub fn temperature_tuning(&self, prefix: &str) -> Result<Option<TemperatureTuning>> {
        if self.flag("attn_temperature_tuning")? != Some(true) || self.rope_layer(prefix)? {
            return Ok(None);
        }
        let number = |key: &str| {
            self.number_in(&self.json, key)?.ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("config.json sets attn_temperature_tuning but no `{key}`"),
                )
            })
        };
        let floor_scale = self.positive("floor_scale", number("floor_scale")?)?;
        let attn_scale = number("attn_scale")?;
        if !attn_scale.is_finite() {
            return Err(Error::file(
                &self.source,
                format!("config.json `attn_scale` = {attn_scale} is not finite"),
            ));
        }
        Ok(Some(TemperatureTuning {
            floor_scale: floor_scale as f32,
            attn_scale: attn_scale as f32,
        }))
    }

    /// The kind `layer_types` gives the layer at `prefix`, when it names one.
    pub fn layer_type_of(&self, prefix: &str) -> Option<&str> {
        let layer = super::layer_index(prefix)?;
        self.json
            .get("layer_types")?
            .as_array()?
            .get(layer)?
            .as_str()
    }
}
