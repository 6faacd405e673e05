//! DeepSeek-V2/V3 multi-head latent attention as saved (`q_a_proj` + `q_a_layernorm` +
//! `q_b_proj` or `q_proj`, `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`), loaded
//! into the core's absorbed form ([`crate::model::mla`]).

use super::config::HfConfig;
use super::families::{Family, ModelType};
use super::projections::linear;
use super::{HfAttention, HfCheckpoint};
use crate::error::{Error, Result};
use crate::model::mla::{MlaDims, MlaWeights};

impl HfCheckpoint {
    /// The MLA module at `prefix` (its tensors already checked to be MLA's): sizes from the
    /// config (transformers' defaults where absent), checked against every tensor; RoPE over
    /// `qk_rope_head_dim` (interleaved pairs: V2's complex rotation, V3's with
    /// `rope_interleave`, its default; else rotate-half); scale `qk_head_dim^-0.5`, times yarn's
    /// mscale² when `mscale_all_dim` is set.
    pub(super) fn mla_attention(
        &self,
        prefix: &str,
        model_type: &ModelType,
        config: Option<&HfConfig>,
        heads: Option<usize>,
    ) -> Result<HfAttention> {
        let Some(c) = config else {
            return Err(Error::file(
                &self.name,
                format!(
                    "`{prefix}` is multi-head latent attention, whose sizes only config.json gives"
                ),
            ));
        };
        let heads = match heads {
            Some(h) => h,
            None => c.heads(prefix)?,
        };
        // expand_kv makes one key and value per query head; transformers' repeat_kv would
        // then multiply them by heads / num_key_value_heads, which only 1 keeps well-formed.
        if let Some(kv) = c.kv_heads()?.filter(|&kv| kv != heads) {
            return Err(Error::UnsupportedModule {
                module: format!("mla attention `{prefix}`"),
                what: format!("num_key_value_heads = {kv} with {heads} heads"),
                why: "MLA expands one key and value per query head; transformers' repeat_kv \
                      fails on any other count"
                    .into(),
            });
        }
        let size =
            |key: &str, default: usize| -> Result<usize> { Ok(c.usize(key)?.unwrap_or(default)) };
        let read = |name: &str| linear(self, prefix, name, false);
        let norm = |name: &str| -> Result<Vec<f32>> {
            Ok(self.read(&format!("{prefix}{name}.weight"))?.1)
        };
        let lora = self.contains(&format!("{prefix}q_a_proj.weight"));
        let (q_a, q_b) = match lora {
            true => (
                Some((read("q_a_proj")?, norm("q_a_layernorm")?)),
                read("q_b_proj")?,
            ),
            false => (None, read("q_proj")?),
        };
        let kv_a = read("kv_a_proj_with_mqa")?;
        let q_lora_rank = q_a.as_ref().map(|(a, _)| a.out_features);
        if let (Some(given), Some(rank)) = (c.usize("q_lora_rank")?, q_lora_rank) {
            if given != rank {
                return Err(Error::weight(
                    format!("{prefix}q_a_proj.weight"),
                    format!("has {rank} outputs, but config.json has q_lora_rank = {given}"),
                ));
            }
        }
        let dims = MlaDims {
            hidden: kv_a.in_features,
            heads,
            q_lora_rank,
            kv_lora_rank: size("kv_lora_rank", 512)?,
            qk_nope_head_dim: size("qk_nope_head_dim", 128)?,
            qk_rope_head_dim: size("qk_rope_head_dim", 64)?,
            v_head_dim: size("v_head_dim", 128)?,
        };
        let weights = MlaWeights {
            dims,
            q_a,
            q_b,
            kv_a,
            kv_norm: norm("kv_a_layernorm")?,
            kv_b: read("kv_b_proj")?,
            o: read("o_proj")?,
        };
        weights.check(&|stored| format!("{prefix}{stored}"))?;
        // Biases: q_a_proj, kv_a_proj_with_mqa and o_proj by attention_bias, all or none.
        let bias = c.flag("attention_bias")?.unwrap_or(false);
        let biased = [
            weights.q_a.as_ref().map(|(a, _)| (a, "q_a_proj")),
            Some((&weights.kv_a, "kv_a_proj_with_mqa")),
            Some((&weights.o, "o_proj")),
        ];
        for (l, stored) in biased.into_iter().flatten() {
            if l.bias.is_some() != bias {
                return Err(Error::weight(
                    format!("{prefix}{stored}.bias"),
                    format!(
                        "is {}, but config.json has attention_bias = {bias}",
                        if bias { "missing" } else { "saved" }
                    ),
                ));
            }
        }
        let mut rope = c.rope(dims.qk_rope_head_dim, 1.0, None)?;
        // V3 reads `rope_interleave` (default true); V2 always rotates interleaved pairs.
        rope.interleaved = match model_type.name {
            "deepseek_v3" => c.flag("rope_interleave")?.unwrap_or(true),
            "deepseek_v2" => true,
            other => {
                return Err(Error::UnsupportedModule {
                    module: format!("mla attention `{prefix}`"),
                    what: format!("model_type {other:?}"),
                    why: "multi-head latent attention runs deepseek_v2 and deepseek_v3".into(),
                })
            }
        };
        let scale = (dims.qk_head_dim() as f64).powf(-0.5) * c.mla_mscale_squared()?;
        let (config, core_weights) = weights.absorbed(scale, rope)?;
        Ok(HfAttention {
            family: Family::Mla,
            model_type: c.model_type().map(String::from),
            prefix: prefix.to_string(),
            cross: false,
            causal: true,
            window: None,
            chunk: None,
            config,
            weights: core_weights,
            relative_bias: None,
            input_norm: None,
            grid_bias: None,
            gated_bias: None,
            local_block: None,
            mla: Some(weights.inputs()),
        })
    }
}
