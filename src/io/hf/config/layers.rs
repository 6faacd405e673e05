//! Which layers slide and how far: `sliding_window` with qwen2's switches, `layer_types`
//! (validated as transformers validates it), Gemma's alternating patterns and GPT-Neo's
//! `attention_layers` / `attention_types`.

use serde_json::Value;

use super::{layer_index, HfConfig};

/// A layer's attention kind, as `layer_types` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// `full_attention`: no sliding window.
    Full,
    /// `sliding_attention`: the config's sliding window.
    Sliding,
}

impl LayerKind {
    /// Its name in `layer_types` (and in per-layer-type `rope_parameters`).
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Full => "full_attention",
            LayerKind::Sliding => "sliding_attention",
        }
    }
}
use crate::error::{Error, Result};

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

impl HfConfig {
    /// Mistral-style `sliding_window` (query i sees keys i − W < j ≤ i), when the model type
    /// reads it (`reads`) and the layer at `prefix` uses it: qwen2's `use_sliding_window`, and
    /// which layers slide by `layer_types` or else `max_window_layers` (layers from it on).
    /// A layer kind other than full or sliding attention is refused.
    pub fn sliding_window(&self, prefix: &str, reads: &[&str]) -> Result<Option<usize>> {
        if reads.contains(&"attention_layers") {
            return self.gpt_neo_window(prefix);
        }
        if self.model_type() == Some("modernbert") {
            return self.modernbert_window(prefix, reads);
        }
        if !reads.contains(&"sliding_window") {
            return Ok(None);
        }
        // SmolLM3's masks follow layer_types whatever use_sliding_window says (the key only
        // shapes the default layer_types).
        let gated = self.model_type() != Some("smollm3");
        if gated
            && reads.contains(&"use_sliding_window")
            && self.flag("use_sliding_window")? != Some(true)
        {
            // Qwen2-MoE's config sets sliding_window to 0 without use_sliding_window (qwen2's
            // to None, whose sliding mask transformers cannot build): a layer that layer_types
            // calls sliding then attends to no key, which nothing should run.
            let explicit = reads.contains(&"layer_types")
                && self.json.get("layer_types").is_some_and(Value::is_array);
            if explicit && self.layer_kind(prefix, reads)? == LayerKind::Sliding {
                return Err(Error::UnsupportedModule {
                    module: format!("attention `{prefix}`"),
                    what: "a sliding layer in `layer_types` without `use_sliding_window`".into(),
                    why: "transformers then has no window for it (qwen2: no mask; qwen2_moe: a \
                          window of 0 keys)"
                        .into(),
                });
            }
            return Ok(None);
        }
        let Some(window) = self.usize("sliding_window")? else {
            return Ok(None);
        };
        match self.layer_kind(prefix, reads)? {
            LayerKind::Sliding => Ok(Some(window)),
            LayerKind::Full => Ok(None),
        }
    }

    /// Whether the layer at `prefix` is a sliding or a full attention layer: by `layer_types`
    /// where the model type reads it, else by the rule transformers fills `layer_types` with —
    /// Gemma 2's even layers slide, Gemma 3's all but every `sliding_window_pattern`-th
    /// (default 6), qwen2's layers from `max_window_layers` on, and every layer of the others.
    /// A layer kind other than full or sliding attention is refused.
    pub fn layer_kind(&self, prefix: &str, reads: &[&str]) -> Result<LayerKind> {
        let types = self
            .json
            .get("layer_types")
            .and_then(Value::as_array)
            .filter(|_| reads.contains(&"layer_types"));
        let layer = || {
            layer_index(prefix).ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("which layers slide depends on the layer of `{prefix}`, which it does not name"),
                )
            })
        };
        let kind = |sliding: bool| match sliding {
            true => LayerKind::Sliding,
            false => LayerKind::Full,
        };
        let Some(types) = types else {
            return Ok(match self.model_type() {
                Some("gemma2" | "gpt_oss") => kind(layer()?.is_multiple_of(2)),
                Some("gemma3" | "gemma3_text") => {
                    let pattern = self.usize("sliding_window_pattern")?.unwrap_or(6);
                    kind(!(layer()? + 1).is_multiple_of(pattern))
                }
                // Cohere 2 and EXAONE 4: every sliding_window_pattern-th layer full (default 4;
                // EXAONE 4's pattern may be a string like "LLLG", which transformers can only
                // take with layer_types: here an error naming the key).
                Some("cohere2" | "exaone4") => {
                    let pattern = self.usize("sliding_window_pattern")?.unwrap_or(4);
                    kind(!(layer()? + 1).is_multiple_of(pattern))
                }
                // SmolLM3: with use_sliding_window and a window, its NoPE layers slide.
                Some("smollm3") => kind(
                    self.flag("use_sliding_window")? == Some(true)
                        && self.usize("sliding_window")?.is_some()
                        && !self.rope_layer(prefix)?,
                ),
                // ModernBERT: all but every global_attn_every_n_layers-th layer (default 3)
                // slide, from layer 0 (full) on.
                Some("modernbert") => {
                    let every = self.usize("global_attn_every_n_layers")?.unwrap_or(3);
                    kind(!layer()?.is_multiple_of(every))
                }
                // OLMo 3: every fourth layer full.
                Some("olmo3") => kind(!(layer()? + 1).is_multiple_of(4)),
                // Qwen2-MoE: the even layers below max_window_layers slide (with
                // use_sliding_window, which `sliding_window` checks first).
                Some("qwen2_moe") => {
                    let first_full = self.usize("max_window_layers")?.unwrap_or(28);
                    let layer = layer()?;
                    kind(layer.is_multiple_of(2) && layer < first_full)
                }
                _ if reads.contains(&"max_window_layers") => {
                    match self.usize("max_window_layers")?.unwrap_or(0) {
                        0 => LayerKind::Sliding,
                        first => kind(layer()? >= first),
                    }
                }
                _ => LayerKind::Sliding,
            });
        };
        match types.get(layer()?).and_then(Value::as_str) {
            Some("sliding_attention") => Ok(LayerKind::Sliding),
            Some("full_attention") => Ok(LayerKind::Full),
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

    /// ModernBERT's local layers see keys |i − j| ≤ local_attention / 2 (its config's
    /// `sliding_window`, a half-window: both sides, non-causal); the global layers every key.
    fn modernbert_window(&self, prefix: &str, reads: &[&str]) -> Result<Option<usize>> {
        if self.layer_kind(prefix, reads)? == LayerKind::Full {
            return Ok(None);
        }
        let local = self.usize("local_attention")?.unwrap_or(128);
        Ok(Some(local / 2))
    }

    /// Whether SmolLM3's (or Llama 4's) layer at `prefix` rotates: its `no_rope_layers` entry
    /// (1 = RoPE, 0 = none), else all but every `no_rope_layer_interval`-th layer (default 4).
    /// Llama4TextConfig takes an empty list for none.
    pub fn rope_layer(&self, prefix: &str) -> Result<bool> {
        let layer = layer_index(prefix).ok_or_else(|| {
            Error::file(
                &self.source,
                format!("which layers rotate depends on the layer of `{prefix}`, which it does not name"),
            )
        })?;
        let empty = |v: &Value| v.as_array().is_some_and(Vec::is_empty);
        match self.json.get("no_rope_layers") {
            Some(v) if empty(v) && self.model_type() == Some("llama4_text") => {
                let interval = self.usize("no_rope_layer_interval")?.unwrap_or(4);
                Ok(!(layer + 1).is_multiple_of(interval))
            }
            None | Some(Value::Null) => {
                let interval = self.usize("no_rope_layer_interval")?.unwrap_or(4);
                Ok(!(layer + 1).is_multiple_of(interval))
            }
            Some(Value::Array(flags)) => match flags.get(layer).and_then(Value::as_u64) {
                Some(flag) => Ok(flag != 0),
                None => Err(Error::file(
                    &self.source,
                    format!(
                        "config.json `no_rope_layers` has no 0/1 entry for layer {layer} (`{prefix}`)"
                    ),
                )),
            },
            Some(v) => Err(Error::file(
                &self.source,
                format!("config.json `no_rope_layers` = {v} is not a list"),
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
}
