//! The parts of an attention module beyond its projections, each as transformers builds it
//! for the model type: its position scheme (RoPE of the family's or the model type's kind, or
//! ALiBi), biases, q/k norms, sinks and T5's relative bias.

use super::config::HfConfig;
use super::config::LayerKind;
use super::families::{self, Biases, Family, ModelType, NormTensors, QkNormRule};
use super::model_types::RopeLayers;
use super::HfCheckpoint;
use crate::error::{Error, Result};
use crate::model::config::AttentionConfig;
use crate::model::qk_norm::{QkNorm, QkNormWeights};
use crate::model::relative_bias::RelativeBias;

impl HfCheckpoint {
    /// RoPE or ALiBi as the model type applies them: ALiBi where it has it (BLOOM); else RoPE
    /// for a RoPE family's self-attention, or a model type that rotates under another family's
    /// names (GPT-J, RoFormer), from the config — its kind per layer (Gemma 3), interleaved
    /// pairs (Cohere, GPT-J, RoFormer) and `rotary_dim` (GPT-J).
    pub(super) fn positions(
        &self,
        prefix: &str,
        family: Family,
        model_type: &ModelType,
        cross: bool,
        module_config: Option<&HfConfig>,
        config: AttentionConfig,
    ) -> Result<AttentionConfig> {
        if let Some(max_bias) = model_type.alibi() {
            return config.with_alibi(max_bias);
        }
        if cross || !(family.uses_rope() || model_type.rotates()) {
            return Ok(config);
        }
        if model_type.rope_layers() == RopeLayers::Never {
            return Ok(config);
        }
        let Some(c) = module_config else {
            return Err(Error::file(
                &self.name,
                format!("`{prefix}` uses RoPE, whose θ and scaling only config.json gives"),
            ));
        };
        // EXAONE 4 and Cohere 2 rotate only on their sliding layers (NoPE elsewhere).
        if let RopeLayers::SlidingOnly { without_window } = model_type.rope_layers() {
            let rotates = match c.usize("sliding_window")? {
                Some(_) => c.layer_kind(prefix, model_type.reads)? == LayerKind::Sliding,
                None => without_window,
            };
            if !rotates {
                return Ok(config);
            }
        }
        if model_type.rope_layers() == RopeLayers::NoRopeLayers && !c.rope_layer(prefix)? {
            return Ok(config);
        }
        let kind = model_type
            .rope_per_layer_kind()
            .then(|| c.layer_kind(prefix, model_type.reads))
            .transpose()?;
        let mut rope = c.rope(config.qk_head_dim, model_type.default_rotary_share(), kind)?;
        rope.interleaved = model_type.interleaved_rope();
        if let Some(dims) = model_type
            .rotary_dim_key()
            .map(|key| c.usize(key))
            .transpose()?
            .flatten()
        {
            rope.rotary_dims = dims;
        }
        config.with_rope(rope)
    }

    /// `{prefix}sinks`: one logit per query head.
    pub(super) fn sinks(&self, prefix: &str, heads: usize) -> Result<Vec<f32>> {
        let name = format!("{prefix}sinks");
        if !self.contains(&name) {
            return Err(Error::weight(name, "is missing; this attention has sinks"));
        }
        let (shape, values) = self.read(&name)?;
        if values.len() != heads {
            return Err(Error::weight(
                name,
                format!("has shape {shape:?}, expected [{heads}] (one per query head)"),
            ));
        }
        Ok(values)
    }

    /// BitNet's `{prefix}attn_sub_norm.weight`: one weight per combined element (its
    /// RMSNorm(hidden_size) over the `heads · head_dim` outputs, which must be as many).
    pub(super) fn sub_norm(&self, prefix: &str, width: usize) -> Result<Vec<f32>> {
        let name = format!("{prefix}attn_sub_norm.weight");
        if !self.contains(&name) {
            return Err(Error::weight(
                name,
                "is missing; BitNet normalises the attention output",
            ));
        }
        let (shape, values) = self.read(&name)?;
        if values.len() != width {
            return Err(Error::weight(
                name,
                format!("has shape {shape:?}, expected [{width}] (heads · head_dim)"),
            ));
        }
        Ok(values)
    }

    /// The q/k norm of a model type that has one: `q_norm.weight` and `k_norm.weight` under
    /// the module (missing: an error naming them), epsilon `rms_norm_eps`.
    pub(super) fn qk_norm(
        &self,
        prefix: &str,
        model_type: &ModelType,
        rule: QkNormRule,
        config: Option<&HfConfig>,
        c: &AttentionConfig,
    ) -> Result<(QkNorm, QkNormWeights)> {
        let eps = match config {
            Some(cfg) => cfg.norm_eps(rule.eps.0, rule.eps.1)?,
            None => rule.eps.1,
        };
        let norm = QkNorm {
            kind: rule.kind,
            scope: rule.scope,
            eps: eps as f32,
            weight_offset: rule.weight_offset,
            after_rope: rule.after_rope,
        };
        let read_one = |name: String| -> Result<Vec<f32>> {
            if !self.contains(&name) {
                return Err(Error::weight(
                    name,
                    format!(
                        "is missing; a {} attention normalises q and k",
                        model_type.name
                    ),
                ));
            }
            Ok(self.read(&name)?.1)
        };
        let read = |which: &str, heads: usize| -> Result<Vec<f32>> {
            match rule.tensors {
                NormTensors::Single => read_one(format!("{prefix}{which}_norm.weight")),
                NormTensors::QueryKeyLayernorm => {
                    let name = if which == "q" { "query" } else { "key" };
                    read_one(format!("{prefix}{name}_layernorm.weight"))
                }
                NormTensors::Weightless => Ok(vec![1.0; c.qk_head_dim]),
                NormTensors::PerHeadModules => (0..heads)
                    .map(|h| read_one(format!("{prefix}{which}_layernorm.norms.{h}.weight")))
                    .collect::<Result<Vec<_>>>()
                    .map(|w| w.concat()),
            }
        };
        let weights = QkNormWeights {
            q: read("q", c.heads)?,
            k: read("k", c.kv_heads)?,
        };
        norm.check(&format!("{prefix}q"), &weights.q, c.heads, c.qk_head_dim)?;
        norm.check(&format!("{prefix}k"), &weights.k, c.kv_heads, c.qk_head_dim)?;
        Ok((norm, weights))
    }

    /// transformers builds each projection with or without a bias by the model type's rule
    /// (and config key) and ignores a tensor it did not build, or leaves random one it built
    /// and found missing: a checkpoint that disagrees with the rule is refused, naming the
    /// tensor, either way.
    pub(super) fn check_biases(
        &self,
        family: Family,
        prefix: &str,
        model_type: &ModelType,
        config: Option<&HfConfig>,
    ) -> Result<()> {
        let names = families::projection_names(family);
        let stored = names.map(|n| self.contains(&format!("{prefix}{n}.bias")));
        let flag = |key: &str| config.map(|c| c.flag(key)).transpose().map(Option::flatten);
        let (built, rule) = match model_type.biases() {
            Biases::AsStored => {
                // A config's `attention_bias` that the tensors contradict is not run either.
                let any = stored.iter().any(|&b| b);
                match flag("attention_bias")? {
                    Some(said) if said != any => ([said; 4], format!("attention_bias = {said}")),
                    _ => return Ok(()),
                }
            }
            Biases::ByKey(key, default) => {
                let on = flag(key)?.unwrap_or(default);
                ([on; 4], format!("{key} = {on}"))
            }
            Biases::Never => ([false; 4], "no bias on any projection".to_string()),
            Biases::Always => ([true; 4], "a bias on every projection".to_string()),
            Biases::QkvOnly => (
                [true, true, true, false],
                "biases on q, k and v only".into(),
            ),
            Biases::QkvByKey(key, default) => {
                let on = flag(key)?.unwrap_or(default);
                (
                    [on, on, on, false],
                    format!("{key} = {on}, never on the output"),
                )
            }
            Biases::QkvAndOutByKeys((key, default), (out_key, out_default)) => {
                let on = flag(key)?.unwrap_or(default);
                let out = flag(out_key)?.unwrap_or(out_default);
                (
                    [on, on, on, out],
                    format!("{key} = {on} on q, k and v, {out_key} = {out} on the output"),
                )
            }
        };
        for i in 0..4 {
            if stored[i] == built[i] {
                continue;
            }
            let tensor = format!("{prefix}{}.bias", names[i]);
            return Err(Error::UnsupportedModule {
                module: format!("{} attention `{prefix}`", family.name()),
                what: format!(
                    "tensor `{tensor}` {}",
                    if stored[i] { "present" } else { "missing" }
                ),
                why: match stored[i] {
                    true => format!(
                        "transformers builds {} without it ({}, {rule}) and ignores the tensor",
                        names[i], model_type.name
                    ),
                    false => format!(
                        "transformers builds {} with it ({}, {rule}) and would leave it random",
                        names[i], model_type.name
                    ),
                },
            });
        }
        Ok(())
    }

    /// T5's table lives in the stack's block 0 (`<stack>.block.0.layer.0.SelfAttention.`);
    /// later blocks reuse it.
    pub(super) fn t5_relative_bias(&self, prefix: &str, heads: usize) -> Result<RelativeBias> {
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
            !super::model_types::in_decoder_stack(prefix),
        )
    }
}
