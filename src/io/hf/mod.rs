//! Hugging Face checkpoints as saved: `config.json` + `model.safetensors` (or the shards a
//! `model.safetensors.index.json` names), or one safetensors file with the config text in its
//! metadata (a Hugging Face case file). The attention modules in it are found by tensor names
//! ([`families`]) and loaded with what `config.json` says about them ([`config`]).

mod attention;
mod beit;
pub mod case;
pub mod config;
pub mod decoder;
pub mod families;
mod family;
mod mla;
mod model_table;
pub mod model_types;
mod module_parts;
mod projections;
pub mod wavlm;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::files::{entry_exists, read_text, MAX_CONFIG_BYTES, MAX_INDEX_BYTES};
use crate::io::safetensors::SafetensorsFile;
use config::HfConfig;
use families::Family;

pub use attention::HfAttention;

/// The tensors (in one or more files) and the config of one model.
#[derive(Debug)]
pub struct HfCheckpoint {
    name: String,
    config: Option<HfConfig>,
    shards: Vec<SafetensorsFile>,
    /// Tensor name → shard.
    index: HashMap<String, usize>,
}

/// The files a model directory is read from (see [`HfCheckpoint::input_files`]).
struct DirLayout {
    config: Option<PathBuf>,
    /// The shards, and with an index its `weight_map`: tensor → position in `shards`.
    shards: Vec<PathBuf>,
    index: Option<(PathBuf, HashMap<String, usize>)>,
}

impl DirLayout {
    /// `config.json` when present (a link to nothing is reported, not taken as absent), and
    /// `model.safetensors`, else the shards `model.safetensors.index.json` names.
    fn of(dir: &Path) -> Result<Self> {
        let config = Some(dir.join("config.json")).filter(|p| entry_exists(p));
        let single = dir.join("model.safetensors");
        if entry_exists(&single) {
            return Ok(DirLayout {
                config,
                shards: vec![single],
                index: None,
            });
        }
        let index_path = dir.join("model.safetensors.index.json");
        if !entry_exists(&index_path) {
            return Err(Error::file(
                dir.display().to_string(),
                "holds neither model.safetensors nor model.safetensors.index.json",
            ));
        }
        let bad = |problem: String| Error::file(index_path.display().to_string(), problem);
        let index: serde_json::Value =
            serde_json::from_str(&read_text(&index_path, MAX_INDEX_BYTES)?)
                .map_err(|e| bad(format!("is not valid JSON ({e})")))?;
        let Some(map) = index.get("weight_map").and_then(|m| m.as_object()) else {
            return Err(bad(
                "has no `weight_map` object (tensor → shard file)".into()
            ));
        };
        let mut files: Vec<&str> = Vec::new();
        let mut tensors = HashMap::new();
        for (tensor, file) in map {
            let Some(file) = file.as_str() else {
                return Err(bad(format!(
                    "names shard {file} for `{tensor}`, not a file name"
                )));
            };
            // A shard is a file name beside the index, never a path elsewhere.
            if file.is_empty() || file.contains('/') || file.contains('\\') || file == ".." {
                return Err(bad(format!(
                    "names shard {file:?}, which is not a file beside the index"
                )));
            }
            let at = match files.iter().position(|f| *f == file) {
                Some(at) => at,
                None => {
                    files.push(file);
                    files.len() - 1
                }
            };
            tensors.insert(tensor.clone(), at);
        }
        Ok(DirLayout {
            config,
            shards: files.iter().map(|f| dir.join(f)).collect(),
            index: Some((index_path, tensors)),
        })
    }
}

impl HfCheckpoint {
    /// A model directory (`config.json` and `model.safetensors` or an index of shards), or a
    /// safetensors file (its metadata `hf_config` as the config, when present). With an index,
    /// every tensor is read from the shard its `weight_map` names, and only those shards are
    /// read; `config.json` and the index are read only when they are regular files within
    /// [`MAX_CONFIG_BYTES`] / [`MAX_INDEX_BYTES`].
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
        let layout = DirLayout::of(path)?;
        let config = match &layout.config {
            Some(c) => Some(HfConfig::parse(
                &read_text(c, MAX_CONFIG_BYTES)?,
                c.display().to_string(),
            )?),
            None => None,
        };
        let shards = layout
            .shards
            .iter()
            .map(SafetensorsFile::open)
            .collect::<Result<Vec<_>>>()?;
        let name = path.display().to_string();
        let Some((index_path, map)) = layout.index else {
            return Ok(Self::from_shards(name, config, shards));
        };
        // The index settles where each tensor lives; a tensor it names must be there.
        let held: Vec<std::collections::HashSet<&str>> = shards
            .iter()
            .map(|s| s.names().into_iter().collect())
            .collect();
        if let Some((tensor, &at)) = map.iter().find(|(t, &at)| !held[at].contains(t.as_str())) {
            return Err(Error::file(
                index_path.display().to_string(),
                format!(
                    "names {} for `{tensor}`, which does not hold it",
                    shards[at].name()
                ),
            ));
        }
        Ok(HfCheckpoint {
            name,
            config,
            shards,
            index: map,
        })
    }

    /// A checkpoint held in memory as one safetensors file (a browser's `fetch`, say): its
    /// config from `config_json` (a `config.json`'s text) or, when `None`, from the file's
    /// metadata `hf_config`. `name` is used in messages.
    pub fn from_bytes(
        name: impl Into<String>,
        bytes: Vec<u8>,
        config_json: Option<&str>,
    ) -> Result<Self> {
        let file = SafetensorsFile::from_bytes(name, bytes)?;
        let config = match config_json {
            Some(text) => Some(HfConfig::parse(
                text,
                format!("{}: config.json", file.name()),
            )?),
            None => file
                .metadata("hf_config")
                .map(|t| HfConfig::parse(t, format!("{}: metadata hf_config", file.name())))
                .transpose()?,
        };
        Ok(Self::from_shards(
            file.name().to_string(),
            config,
            vec![file],
        ))
    }

    /// Every file [`HfCheckpoint::open`] reads for `path`: the file itself, or a directory's
    /// `config.json`, index and shards — what an output must never be written over.
    pub fn input_files(path: &Path) -> Result<Vec<PathBuf>> {
        if !path.is_dir() {
            return Ok(vec![path.to_path_buf()]);
        }
        let layout = DirLayout::of(path)?;
        let mut files = layout.shards;
        files.extend(layout.config);
        files.extend(layout.index.map(|(p, _)| p));
        Ok(files)
    }

    /// The tensors of `shards` without an index: one file (a case file, `model.safetensors`).
    pub(crate) fn from_shards(
        name: String,
        config: Option<HfConfig>,
        shards: Vec<SafetensorsFile>,
    ) -> Self {
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

    /// The path it was opened from, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model's `config.json` (or a case file's `hf_config`), when there is one.
    pub fn config(&self) -> Option<&HfConfig> {
        self.config.as_ref()
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.index.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Whether some file of the checkpoint holds `tensor`.
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
        // The model type's own rules first (Falcon's alibi, MPT's attn_config).
        let module_config = module_config
            .map(|c| c.with_own_rules(prefix, model_type.name))
            .transpose()?;
        if let Some(c) = &module_config {
            // Keys the model type reads are honoured, keys it never reads are ignored as
            // transformers ignores them; any other key that changes the answer is refused.
            c.check_settings(prefix, &[model_type.reads, model_type.ignores()].concat())?;
        }
        if family == Family::Mla {
            families::check_understood(family, prefix, &self.names(), &|_| false)?;
            return self.mla_attention(prefix, model_type, module_config.as_ref(), heads);
        }
        // Keys the model type reads take transformers' defaults where absent.
        let module_config = module_config.map(|c| c.with_defaults(model_type.defaults()));
        // The q/k norm of the model type, when its config switches it on.
        let norm_rule = match (model_type.qk_norm(), &module_config) {
            (Some(rule), Some(c)) => match rule.switch {
                Some(key) => (c.flag(key)? == Some(true)).then_some(rule),
                None => Some(rule),
            },
            (rule, _) => rule.filter(|r| r.switch.is_none()),
        };
        // Llama 4 normalises q and k on its RoPE layers only.
        let norm_rule = match (norm_rule, &module_config) {
            (Some(r), Some(c)) if r.rope_layers_only && !c.rope_layer(prefix)? => None,
            (rule, _) => rule,
        };
        // Tensors of the model type beyond its family's: q/k norms, sinks.
        let extra = |rest: &str| {
            norm_rule.is_some_and(|r| r.tensors.holds(rest))
                || (model_type.sinks() && rest == "sinks")
                || (model_type.grid_bias() && rest == beit::LAYER_TABLE)
                || (model_type.gated_bias() && wavlm::TENSORS.contains(&rest))
                || model_type.input_norm().is_some_and(|n| {
                    // ESM saves its LayerNorm under the legacy gamma / beta names.
                    rest.strip_prefix(n)
                        .is_some_and(|r| [".weight", ".bias", ".gamma", ".beta"].contains(&r))
                })
                || (model_type.sub_norm() && rest == "attn_sub_norm.weight")
        };
        families::check_understood(family, prefix, &self.names(), &extra)?;
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
            .map(|c| c.kv_heads_of(model_type.name, heads))
            .transpose()?
            .flatten();
        let (mut config, mut weights) =
            projections::load(self, family, model_type.name, prefix, heads, kv_heads)?;
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
        self.check_biases(family, prefix, model_type, module_config.as_ref())?;
        if model_type.sinks() {
            weights.sinks = Some(self.sinks(prefix, config.heads)?);
            config = config.with_sinks()?;
        }
        if model_type.sub_norm() {
            let eps = match &module_config {
                Some(c) => c.norm_eps("rms_norm_eps", 1e-5)?,
                None => 1e-5,
            };
            weights.output_norm = Some(self.sub_norm(prefix, config.v_width())?);
            config = config.with_output_norm(eps as f32)?;
        }
        if let Some(rule) = norm_rule {
            let (norm, norm_weights) =
                self.qk_norm(prefix, model_type, rule, module_config.as_ref(), &config)?;
            weights.qk_norm = Some(norm_weights);
            config = config.with_qk_norm(norm)?;
        }
        let cross = families::is_cross_attention(prefix);
        let mut window = None;
        config = self.positions(
            prefix,
            family,
            model_type,
            cross,
            module_config.as_ref(),
            config,
        )?;
        let mut chunk = None;
        if let Some(c) = module_config.as_ref().filter(|_| !cross) {
            window = c.sliding_window(prefix, model_type.reads)?;
            if model_type.reads.contains(&"attention_chunk_size") {
                chunk = c.attention_chunk(prefix)?;
                config.chunked = chunk;
            }
            if model_type.reads.contains(&"attn_temperature_tuning") {
                if let Some(t) = c.temperature_tuning(prefix)? {
                    config = config.with_temperature(t)?;
                }
            }
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
        if let Some(clip) = module_config
            .as_ref()
            .map(|c| c.clip_qkv(model_type.reads))
            .transpose()?
            .flatten()
        {
            config = config.with_clip_qkv(clip)?;
        }
        if model_type.unscaled {
            config = config.with_scale(1.0)?;
        }
        let mut relative_bias = None;
        let mut local_block = None;
        if let (true, false, false, Some(c)) = (
            model_type.local_encoder(),
            cross,
            model_types::in_decoder_stack(prefix),
            &module_config,
        ) {
            local_block = Some(self.longt5_local_block(prefix, c)?);
        }
        if family == Family::T5 {
            // T5 does not scale the scores.
            config = config.with_scale(1.0)?;
            if !cross {
                let per_layer = model_type.relative_bias_per_layer();
                relative_bias = Some(self.t5_relative_bias(prefix, heads, per_layer)?);
            }
        }
        let grid_bias = match (&module_config, model_type.grid_bias()) {
            (Some(c), true) => self.beit_position_bias(prefix, c, heads)?,
            _ => None,
        };
        let gated_bias = match (&module_config, model_type.gated_bias() && !cross) {
            (Some(c), true) => Some(self.wavlm_bias(prefix, c, heads)?),
            (None, true) => {
                return Err(Error::file(
                    &self.name,
                    "has no config.json for WavLM's num_buckets and max_bucket_distance",
                ))
            }
            _ => None,
        };
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
                    module_config
                        .as_ref()
                        .map(HfConfig::is_decoder)
                        .transpose()?
                        .unwrap_or(false),
                ),
            window,
            chunk,
            config,
            weights,
            relative_bias,
            input_norm: model_type.input_norm().map(|n| format!("{prefix}{n}")),
            grid_bias,
            gated_bias,
            local_block,
            mla: None,
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
            [] => Err(self.no_module_at(&needle, &modules)),
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

    /// `at`: a prefix, or `.N.` for layer N (the tensors holding it).
    fn no_module_at(&self, at: &str, modules: &[(Family, String)]) -> Error {
        let layer = at.starts_with('.') && at.ends_with('.');
        let lies_under = |n: &str| match layer {
            true => n.contains(at) || n.starts_with(&at[1..]),
            false => n.starts_with(at),
        };
        let names = self.names();
        let under: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| lies_under(n))
            .take(8)
            .collect();
        let mut problem = match layer {
            true => format!("no attention module in layer {}", &at[1..at.len() - 1]),
            false => format!("no attention module at prefix {at:?}"),
        };
        // Qwen3-Next's and others' linear-attention layers are not softmax attention.
        let kind = self.config.as_ref().and_then(|c| c.layer_type_of(at));
        if let Some(kind) = kind.filter(|k| *k != "full_attention") {
            problem.push_str(&format!(
                "; config.json's layer_types calls this layer {kind:?}, which is not the softmax \
                 attention the loader runs"
            ));
        }
        for (prefix, missing) in families::incomplete_modules(&names)
            .into_iter()
            .filter(|(p, _)| lies_under(p))
        {
            problem.push_str(&format!("; `{prefix}` {missing}"));
        }
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
