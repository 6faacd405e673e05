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
use crate::model::mask::{AttnDims, Mask, MaskTensor};
use crate::model::qk_norm::{QkNorm, QkNormWeights};
use crate::model::relative_bias::RelativeBias;
use crate::model::tensor::Tensor;

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
        // ESM rotates a cross-attention's keys with the queries' positions: not computed.
        let esm_rotary = model_type.rotary_by_position_type()
            && module_config
                .map(HfConfig::rotary_position_type)
                .transpose()?
                == Some(true);
        if cross && esm_rotary {
            return Err(Error::UnsupportedModule {
                module: format!("{} attention `{prefix}`", family.name()),
                what: "a rotary cross-attention".into(),
                why: "ESM rotates the encoder's keys by the decoder's positions; not implemented"
                    .into(),
            });
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
        if model_type.rotary_by_position_type() && !esm_rotary {
            return Ok(config);
        }
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
                NormTensors::QkLayernorm => read_one(format!("{prefix}{which}_layernorm.weight")),
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
        let mut weights = QkNormWeights::new(read("q", c.heads)?, read("k", c.kv_heads)?);
        if rule.bias {
            weights.q_bias = read_one(format!("{prefix}q_layernorm.bias"))?;
            weights.k_bias = read_one(format!("{prefix}k_layernorm.bias"))?;
        }
        for (which, w, b, heads) in [
            ("q", &weights.q, &weights.q_bias, c.heads),
            ("k", &weights.k, &weights.k_bias, c.kv_heads),
        ] {
            norm.check_with_bias(&format!("{prefix}{which}"), w, b, heads, c.qk_head_dim)?;
        }
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
    /// later blocks reuse it. `per_layer` (UMT5): each module's own table, which must be there.
    pub(super) fn t5_relative_bias(
        &self,
        prefix: &str,
        heads: usize,
        per_layer: bool,
    ) -> Result<RelativeBias> {
        let stack = prefix.split(".block.").next().unwrap_or_default();
        // Block 0's module of the same kind (LongT5's encoder: `LocalSelfAttention`).
        let kind = prefix
            .trim_end_matches('.')
            .rsplit('.')
            .next()
            .unwrap_or_default();
        let name = format!("{stack}.block.0.layer.0.{kind}.relative_attention_bias.weight");
        let name = match self.contains(&name) && !per_layer {
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

impl HfCheckpoint {
    /// LongT5's encoder self-attention: the local block length (`local_radius` + 1, default
    /// 128), for `encoder_attention_type` "local" (the default); "transient-global" is refused:
    /// its keys include sums over blocks of the input, which the core has no form for.
    pub(super) fn longt5_local_block(&self, prefix: &str, c: &HfConfig) -> Result<usize> {
        match c.get("encoder_attention_type").and_then(|v| v.as_str()) {
            None | Some("local") => {}
            Some(kind) => {
                return Err(Error::UnsupportedModule {
                    module: format!("t5 attention `{prefix}`"),
                    what: format!("LongT5's encoder_attention_type {kind:?}"),
                    why: "transient-global attention adds keys summed over blocks of the input; \
                          only \"local\" is implemented"
                        .into(),
                })
            }
        }
        let radius = c.usize("local_radius")?.unwrap_or(127);
        radius.checked_add(1).ok_or_else(|| {
            Error::file(
                c.source(),
                format!("config.json `local_radius` = {radius} is too large"),
            )
        })
    }
}

impl super::HfAttention {
    /// LongT5's local attention: t5's bias of (key − query), −inf beyond `block − 1`
    /// positions. A padded `attention_mask` is refused: LongT5 masks padded queries too, and
    /// transformers' rows there are uniform over their window, which no key mask gives.
    pub(super) fn local_mask(
        &self,
        bias: &RelativeBias,
        dims: AttnDims,
        attention_mask: Option<&MaskTensor>,
    ) -> Result<Mask> {
        let block = self.local_block.unwrap_or(usize::MAX);
        if attention_mask.is_some_and(|m| m.data().contains(&0)) {
            return Err(Error::Config(
                "LongT5's local attention with padding is not implemented: it masks padded \
                 queries too (transformers' rows there are uniform over their window)"
                    .into(),
            ));
        }
        let Mask::Bias(t) = bias.mask(dims, false)? else {
            return Err(Error::Config("the relative bias is not additive".into()));
        };
        let (lq, lk) = (dims.lq, dims.lk);
        let first_query = lk as i64 - lq as i64;
        let mut values = t.data().to_vec();
        for (n, v) in values.iter_mut().enumerate() {
            let (i, j) = ((n / lk) % lq, n % lk);
            if (j as i64 - (first_query + i as i64)).unsigned_abs() >= block as u64 {
                *v = f32::NEG_INFINITY;
            }
        }
        Ok(Mask::Bias(Tensor::new(t.shape().to_vec(), values)?))
    }
}
