//! Hugging Face checkpoints as saved: `config.json` + `model.safetensors` (or the shards a
//! `model.safetensors.index.json` names), or one safetensors file with the config text in its
//! metadata (a Hugging Face case file). The attention modules in it are found by tensor names
//! ([`families`]) and loaded with what `config.json` says about them ([`config`]).

pub mod case;
pub mod config;
pub mod families;
pub mod model_types;

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::io::safetensors::SafetensorsFile;
use crate::model::config::AttentionConfig;
use crate::model::mask::{AttnDims, Mask, MaskTensor, PaddingMask};
use crate::model::relative_bias::RelativeBias;
use crate::model::weights::AttentionWeights;
use config::HfConfig;
use families::Family;

/// The tensors (in one or more files) and the config of one model.
#[derive(Debug)]
pub struct HfCheckpoint {
    name: String,
    config: Option<HfConfig>,
    shards: Vec<SafetensorsFile>,
    /// Tensor name → shard.
    index: HashMap<String, usize>,
}

impl HfCheckpoint {
    /// A model directory (`config.json` and `model.safetensors` or an index of shards), or a
    /// safetensors file (its metadata `hf_config` as the config, when present).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if !path.is_dir() {
            let file = SafetensorsFile::open(path)?;
            let config = file
                .metadata("hf_config")
                .map(|t| HfConfig::parse(t, format!("{}: metadata hf_config", file.name())))
                .transpose()?;
            return Ok(Self::from_shards(
                file.name().to_string(),
                config,
                vec![file],
            ));
        }
        let read = |name: &str| {
            std::fs::read_to_string(path.join(name)).map_err(|source| Error::Io {
                path: path.join(name).display().to_string(),
                source,
            })
        };
        let config_path = path.join("config.json");
        let config = match config_path.exists() {
            true => Some(HfConfig::parse(
                &read("config.json")?,
                config_path.display().to_string(),
            )?),
            false => None,
        };
        let shard_names: Vec<String> = if path.join("model.safetensors").exists() {
            vec!["model.safetensors".into()]
        } else if path.join("model.safetensors.index.json").exists() {
            let index: serde_json::Value =
                serde_json::from_str(&read("model.safetensors.index.json")?).map_err(|e| {
                    Error::file(
                        path.join("model.safetensors.index.json")
                            .display()
                            .to_string(),
                        format!("is not valid JSON ({e})"),
                    )
                })?;
            let mut files: Vec<String> = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .map(|m| {
                    m.values()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            files.dedup();
            // A shard is a file name beside the index, never a path elsewhere.
            if let Some(bad) = files.iter().find(|f| f.contains('/') || f.contains('\\')) {
                return Err(Error::file(
                    path.join("model.safetensors.index.json")
                        .display()
                        .to_string(),
                    format!("names shard {bad:?}, which is not a file beside the index"),
                ));
            }
            files
        } else {
            return Err(Error::file(
                path.display().to_string(),
                "holds neither model.safetensors nor model.safetensors.index.json",
            ));
        };
        let shards = shard_names
            .iter()
            .map(|f| SafetensorsFile::open(path.join(f)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_shards(
            path.display().to_string(),
            config,
            shards,
        ))
    }

    fn from_shards(name: String, config: Option<HfConfig>, shards: Vec<SafetensorsFile>) -> Self {
        let mut index = HashMap::new();
        for (i, shard) in shards.iter().enumerate() {
            for t in shard.names() {
                index.entry(t.to_string()).or_insert(i);
            }
        }
        HfCheckpoint {
            name,
            config,
            shards,
            index,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> Option<&HfConfig> {
        self.config.as_ref()
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.index.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    pub fn contains(&self, tensor: &str) -> bool {
        self.index.contains_key(tensor)
    }

    /// A float tensor as `(shape, f32 values)`; errors name the tensor.
    pub fn read(&self, tensor: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let shard = self
            .index
            .get(tensor)
            .ok_or_else(|| Error::weight(tensor, "is missing"))?;
        self.shards[*shard]
            .read_f32(tensor)
            .map_err(|p| Error::weight(tensor, p))
    }

    /// Every attention module in the checkpoint, as `(family, prefix)`.
    pub fn modules(&self) -> Vec<(Family, String)> {
        families::find_modules(&self.names())
    }

    /// The attention module at `prefix`, loaded. Errors list the tensors under the prefix, name
    /// the family when one is recognised, and suggest the prefixes that hold attention modules.
    pub fn attention(&self, prefix: &str, heads: Option<usize>) -> Result<HfAttention> {
        let modules = self.modules();
        let Some(&(family, _)) = modules.iter().find(|(_, p)| p == prefix) else {
            return Err(self.no_module_at(prefix, &modules));
        };
        // A multimodal config gives each tower its own sub-config; the prefix picks it.
        let module_config = self
            .config
            .as_ref()
            .map(|c| c.for_module(prefix))
            .transpose()?;
        let model_type = family.model_type(
            module_config.as_ref().and_then(HfConfig::model_type),
            prefix,
        )?;
        if let Some(c) = &module_config {
            c.check_settings(prefix, model_type.reads)?;
        }
        families::check_understood(family, prefix, &self.names())?;
        let heads = match (heads, &module_config) {
            (Some(h), _) => h,
            (None, Some(c)) => c.heads(prefix)?,
            (None, None) => {
                return Err(Error::file(
                    &self.name,
                    "has no config.json (or metadata hf_config) to give the number of heads; pass it (--heads H)",
                ))
            }
        };
        let kv_heads = module_config
            .as_ref()
            .map(HfConfig::kv_heads)
            .transpose()?
            .flatten();
        let (mut config, weights) = families::load(self, family, prefix, heads, kv_heads)?;
        if let Some(kv) = kv_heads.filter(|&kv| kv != config.kv_heads) {
            return Err(Error::file(
                &self.name,
                format!(
                    "`{prefix}`: config.json has num_key_value_heads = {kv}, but the key \
                     projection's shape gives {} key/value heads",
                    config.kv_heads
                ),
            ));
        }
        // transformers builds the projections with or without biases by `attention_bias` and
        // ignores tensors it did not build: a checkpoint that disagrees is not run either way.
        let has_bias = [Some(&weights.q), Some(&weights.k), Some(&weights.v)]
            .into_iter()
            .chain([weights.o.as_ref()])
            .flatten()
            .any(|l| l.bias.is_some());
        if let Some(said) = module_config
            .as_ref()
            .and_then(HfConfig::attention_bias)
            .filter(|&b| b != has_bias)
        {
            return Err(Error::file(
                &self.name,
                format!(
                    "`{prefix}`: config.json has attention_bias = {said}, but the projections \
                     {} biases",
                    if has_bias { "have" } else { "have no" }
                ),
            ));
        }
        let cross = families::is_cross_attention(prefix);
        let mut window = None;
        if family.uses_rope() {
            let Some(c) = &module_config else {
                return Err(Error::file(
                    &self.name,
                    format!("`{prefix}` uses RoPE, whose θ and scaling only config.json gives"),
                ));
            };
            config = config.with_rope(c.rope(config.qk_head_dim)?)?;
        }
        if let Some(c) = module_config.as_ref().filter(|_| !cross) {
            window = c.sliding_window(prefix, model_type.reads)?;
        }
        if let Some(scale) = module_config
            .as_ref()
            .map(|c| c.scale(prefix, config.qk_head_dim, model_type.reads))
            .transpose()?
            .flatten()
        {
            config = config.with_scale(scale)?;
        }
        if let Some(cap) = module_config
            .as_ref()
            .map(|c| c.softcap(model_type.reads))
            .transpose()?
            .flatten()
        {
            config = config.with_softcap(cap)?;
        }
        if model_type.unscaled {
            config = config.with_scale(1.0)?;
        }
        let mut relative_bias = None;
        if family == Family::T5 {
            // T5 does not scale the scores.
            config = config.with_scale(1.0)?;
            if !cross {
                relative_bias = Some(self.t5_relative_bias(prefix, heads)?);
            }
        }
        Ok(HfAttention {
            family,
            model_type: module_config
                .as_ref()
                .and_then(|c| c.model_type().map(String::from)),
            prefix: prefix.to_string(),
            cross,
            causal: !cross
                && model_type.causal_self_attention(
                    prefix,
                    module_config.as_ref().is_some_and(HfConfig::is_decoder),
                ),
            window,
            config,
            weights,
            relative_bias,
        })
    }

    /// The attention module of layer `layer`: the one module whose prefix holds `.{layer}.`,
    /// else an error listing the candidates.
    pub fn layer_prefix(&self, layer: usize) -> Result<String> {
        let needle = format!(".{layer}.");
        let modules = self.modules();
        let hits: Vec<&String> = modules
            .iter()
            .map(|(_, p)| p)
            .filter(|p| p.contains(&needle) || p.starts_with(&needle[1..]))
            .collect();
        match hits[..] {
            [one] => Ok(one.clone()),
            [] => Err(self.no_module_at(&format!("(layer {layer})"), &modules)),
            _ => Err(Error::file(
                &self.name,
                format!(
                    "layer {layer} has {} attention modules ({}); pick one with --prefix",
                    hits.len(),
                    hits.iter()
                        .map(|p| format!("{p:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// T5's table lives in the stack's block 0 (`<stack>.block.0.layer.0.SelfAttention.`);
    /// later blocks reuse it.
    fn t5_relative_bias(&self, prefix: &str, heads: usize) -> Result<RelativeBias> {
        let stack = prefix.split(".block.").next().unwrap_or_default();
        let name = format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
        let name = match self.contains(&name) {
            true => name,
            false => format!("{prefix}relative_attention_bias.weight"),
        };
        let (shape, table) = self.read(&name)?;
        let settings = match &self.config {
            Some(c) => c.t5_bias()?,
            None => {
                return Err(Error::file(
                    &self.name,
                    "has no config.json for T5's relative_attention_max_distance",
                ))
            }
        };
        if shape.len() != 2 || shape[1] != heads {
            return Err(Error::weight(
                name,
                format!("has shape {shape:?}, expected [buckets, {heads}]"),
            ));
        }
        RelativeBias::new(
            table,
            shape[0],
            heads,
            settings.max_distance,
            !prefix.contains("decoder"),
        )
    }

    fn no_module_at(&self, prefix: &str, modules: &[(Family, String)]) -> Error {
        let under: Vec<&str> = self
            .names()
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .take(8)
            .collect();
        let mut problem = format!("no attention module at prefix {prefix:?}");
        match under.is_empty() {
            true => problem.push_str("; no tensor lies under it"),
            false => problem.push_str(&format!("; the tensors under it: {}", under.join(", "))),
        }
        if !modules.is_empty() {
            let list: Vec<String> = modules
                .iter()
                .take(8)
                .map(|(f, p)| format!("{p:?} ({})", f.name()))
                .collect();
            problem.push_str(&format!("; attention modules found: {}", list.join(", ")));
        }
        Error::file(&self.name, problem)
    }
}

/// One attention module of a checkpoint, loaded.
#[derive(Debug, Clone)]
pub struct HfAttention {
    pub family: Family,
    /// `model_type` from the config, when there is one.
    pub model_type: Option<String>,
    pub prefix: String,
    /// Attends to another sequence (`key_value_states`).
    pub cross: bool,
    /// A decoder self-attention: query i sees keys j ≤ i.
    pub causal: bool,
    /// Mistral's `sliding_window` W (with `causal`): query i sees keys i − W < j ≤ i.
    pub window: Option<usize>,
    pub config: AttentionConfig,
    pub weights: AttentionWeights,
    /// T5 self-attention's relative position bias.
    pub relative_bias: Option<RelativeBias>,
}

impl HfAttention {
    /// The mask this module applies to `dims`: causal when it is a decoder self-attention, the
    /// padding of `attention_mask` (`[B, Lk]`, 1 = real token), and T5's relative bias — all
    /// composed as `transformers` does.
    pub fn mask(&self, dims: AttnDims, attention_mask: Option<&MaskTensor>) -> Result<Mask> {
        let base = match (&self.relative_bias, self.causal, self.window) {
            (Some(bias), causal, _) => bias.mask(dims, causal)?,
            (None, true, Some(w)) => Mask::SlidingWindow(w),
            (None, true, None) => Mask::Causal,
            (None, false, _) => Mask::None,
        };
        match attention_mask {
            None => Ok(base),
            Some(m) => base.with_key_padding(&PaddingMask::HfAttention(m.clone()), dims),
        }
    }
}
