//! RoPE settings from either spelling of a config (transformers 4.x `rope_theta` /
//! `rope_scaling` / `partial_rotary_factor` / `rotary_pct`, transformers 5 `rope_parameters`).

use serde_json::Value;

use super::layers::LayerKind;
use super::HfConfig;
use crate::error::{Error, Result};
use crate::model::rope::{Factors, Rope, RopeScaling};

impl HfConfig {
    /// The RoPE of a module with heads of `head_dim`, from either spelling: θ (default 10000),
    /// the rotating share of each head (`partial_rotary_factor`, `rotary_pct`; default
    /// `default_share`, the model type's: 0.25 for gpt_neox, else all of it), and `default`,
    /// `linear`, `llama3`, `yarn`, `dynamic` or `longrope` scaling. Another `rope_type` is
    /// `Err(UnsupportedModule)`, never approximated; a value of the wrong JSON type (θ as a
    /// string or null, `rope_type: 5`, `rope_parameters: [1, 2]`) is an error naming the key, as
    /// transformers raises.
    ///
    /// transformers 5 nests one `rope_parameters` object per layer type (Gemma 3); then the one
    /// of `layer_kind` is read, and a config without it is an error naming it.
    pub fn rope(
        &self,
        head_dim: usize,
        default_share: f64,
        layer_kind: Option<LayerKind>,
    ) -> Result<Rope> {
        let mut params = self.object_or_null("rope_parameters")?;
        let mut scaling = self.object_or_null("rope_scaling")?;
        let nested = |p: Option<&Value>| {
            p.and_then(Value::as_object)
                .is_some_and(|o| o.values().any(Value::is_object))
        };
        // Olmo3 and ModernBERT read only the per-kind objects of `rope_parameters`.
        let flat_refused = |model_type: &str, class: &str| Error::UnsupportedModule {
            module: self.source.clone(),
            what: format!("{model_type} with one flat `rope_parameters` object"),
            why: format!(
                "{class} reads RoPE parameters per layer type \
                 (`full_attention`, `sliding_attention`)"
            ),
        };
        if nested(params) || nested(scaling) {
            let Some(kind) = layer_kind.filter(|_| !nested(scaling)) else {
                return Err(Error::UnsupportedModule {
                    module: self.source.clone(),
                    what: "RoPE parameters per layer type".into(),
                    why: "this model type's layers have one RoPE".into(),
                });
            };
            params = params.and_then(|p| p.get(kind.name()));
            let Some(p) = params.filter(|p| p.is_object()) else {
                return Err(Error::file(
                    &self.source,
                    format!(
                        "config.json `rope_parameters` has no object for `{}`",
                        kind.name()
                    ),
                ));
            };
            params = Some(p);
            scaling = None;
        } else if self.model_type() == Some("olmo3") {
            // Olmo3Config builds its per-kind objects from the 4.x spelling: `rope_theta` for
            // both kinds, `rope_scaling` for the full layers only. A flat `rope_parameters`
            // is not what it reads.
            if params.is_some() {
                return Err(flat_refused("olmo3", "Olmo3Config"));
            }
            if layer_kind == Some(LayerKind::Sliding) {
                scaling = None;
            }
        } else if self.model_type() == Some("modernbert") && params.is_some() {
            // ModernBertConfig keeps only its per-kind objects; flat keys are dropped.
            return Err(flat_refused("modernbert", "ModernBertConfig"));
        }
        let find = |key: &str| -> Result<Option<f64>> {
            for p in [params, scaling].into_iter().flatten() {
                if let Some(x) = self.number_in(p, key)? {
                    return Ok(Some(x));
                }
            }
            self.number_in(&self.json, key)
        };
        let kind_theta = self.modernbert_theta(params, layer_kind)?;
        let mut theta = match kind_theta.map_or_else(|| find("rope_theta"), |t| Ok(Some(t)))? {
            Some(t) => t,
            None => self
                .number_in(&self.json, "rotary_emb_base")?
                .unwrap_or(10_000.0),
        };
        self.positive("rope_theta", theta)?;
        let share = match find("partial_rotary_factor")? {
            Some(s) => s,
            None => self
                .number_in(&self.json, "rotary_pct")?
                .unwrap_or(default_share),
        };
        if !(share > 0.0 && share <= 1.0) {
            return Err(Error::file(
                &self.source,
                format!("config.json's rotating share of each head {share} is not in (0, 1]"),
            ));
        }
        let mut rope_type = "default";
        for p in [params, scaling].into_iter().flatten() {
            if let Some(t) = p.get("rope_type").or_else(|| p.get("type")) {
                rope_type = t.as_str().ok_or_else(|| {
                    Error::file(
                        &self.source,
                        format!("config.json `rope_type` = {t} is not a string"),
                    )
                })?;
                break;
            }
        }
        // Phi3Config reads its 4.x names `su` and `yarn` as longrope, and raises for any type
        // but default and longrope.
        if self.model_type() == Some("phi3") {
            rope_type = match rope_type {
                "su" | "yarn" => "longrope",
                "default" | "longrope" => rope_type,
                other => {
                    return Err(Error::UnsupportedModule {
                        module: self.source.clone(),
                        what: format!("phi3 with rope_type {other:?}"),
                        why: "transformers' Phi3Config takes only default and longrope (su and \
                              yarn meaning longrope)"
                            .into(),
                    })
                }
            };
        }
        let need = |key: &str| -> Result<f64> {
            let x = find(key)?.ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("rope_type {rope_type:?} needs `{key}`"),
                )
            })?;
            self.positive(key, x)
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
                original_max_positions: match self
                    .number_in(&self.json, "original_max_position_embeddings")?
                {
                    Some(n) => self.positive("original_max_position_embeddings", n)?,
                    None => need("original_max_position_embeddings")?,
                },
            },
            "yarn" => self.yarn(&find, &need, params)?,
            // transformers' _compute_dynamic_ntk_parameters: past max_position_embeddings
            // (not the original), θ grows with the call's sequence length.
            // Hunyuan's "dynamic" with `alpha` (transformers' ntk_alpha): a fixed θ·α^(d/(d−2)).
            "dynamic" if self.hunyuan_alpha([params, scaling])?.is_some() => {
                let alpha = self.hunyuan_alpha([params, scaling])?.unwrap_or(1.0);
                let d = head_dim as f64;
                theta *= alpha.powf(d / (d - 2.0));
                self.positive("rope_theta", theta)?;
                RopeScaling::None
            }
            "dynamic" => RopeScaling::Dynamic {
                factor: need("factor")?,
                max_positions: self.max_positions()?,
            },
            "longrope" => self.longrope(&find, &need, [params, scaling])?,
            other => {
                return Err(Error::UnsupportedModule {
                    module: self.source.clone(),
                    what: format!("rope_type {other:?}"),
                    why: "RoPE runs the default, linear, llama3, yarn, dynamic and longrope \
                          types"
                        .into(),
                })
            }
        };
        // transformers: int(head_dim · partial_rotary_factor) dimensions rotate.
        let rotary_dims = (head_dim as f64 * share) as usize;
        let rope = Rope {
            theta,
            rotary_dims,
            interleaved: false,
            scaling,
        };
        rope.check(head_dim)?;
        Ok(rope)
    }

    /// ModernBERT's θ of a layer kind where its RoPE object names none: `global_rope_theta`
    /// (full layers) or `local_rope_theta` (sliding), the defaults already filled in. A
    /// top-level `rope_theta`, which ModernBertConfig does not read, is refused.
    fn modernbert_theta(
        &self,
        params: Option<&Value>,
        kind: Option<LayerKind>,
    ) -> Result<Option<f64>> {
        if self.model_type() != Some("modernbert") {
            return Ok(None);
        }
        if self.json.get("rope_theta").is_some() {
            return Err(Error::UnsupportedModule {
                module: self.source.clone(),
                what: "modernbert with a top-level `rope_theta`".into(),
                why: "ModernBertConfig takes θ per layer kind (global_rope_theta, \
                      local_rope_theta, or rope_parameters per layer type)"
                    .into(),
            });
        }
        if let Some(t) = params
            .map(|p| self.number_in(p, "rope_theta"))
            .transpose()?
        {
            return Ok(t);
        }
        let key = match kind {
            Some(LayerKind::Sliding) => "local_rope_theta",
            _ => "global_rope_theta",
        };
        let default = if key == "local_rope_theta" {
            1e4
        } else {
            1.6e5
        };
        Ok(Some(self.number_in(&self.json, key)?.unwrap_or(default)))
    }

    /// Hunyuan's NTK `alpha` (a non-zero number in its RoPE object), read by its model type only.
    fn hunyuan_alpha(&self, objects: [Option<&Value>; 2]) -> Result<Option<f64>> {
        if self.model_type() != Some("hunyuan_v1_dense") {
            return Ok(None);
        }
        for o in objects.into_iter().flatten() {
            if let Some(a) = self.number_in(o, "alpha")? {
                return Ok((a != 0.0).then_some(a));
            }
        }
        Ok(None)
    }

    /// `max_position_embeddings`, which dynamic and longrope scaling need.
    fn max_positions(&self) -> Result<f64> {
        let key = "max_position_embeddings";
        let n = self.number_in(&self.json, key)?.ok_or_else(|| {
            Error::file(
                &self.source,
                format!("its RoPE scaling needs `{key}`, which config.json lacks"),
            )
        })?;
        self.positive(key, n)
    }

    /// transformers' `_compute_longrope_parameters`: `short_factor` and `long_factor` (one per
    /// rotating pair); `original_max_position_embeddings` from the top level first (phi3
    /// writes it there), else the RoPE object, else `max_position_embeddings`; `factor` when
    /// given, else max_position_embeddings / original; `attention_factor` when given, else
    /// √(1 + ln factor / ln original) (1 for a factor ≤ 1).
    fn longrope(
        &self,
        find: &dyn Fn(&str) -> Result<Option<f64>>,
        need: &dyn Fn(&str) -> Result<f64>,
        objects: [Option<&Value>; 2],
    ) -> Result<RopeScaling> {
        let list = |key: &str| -> Result<Vec<f64>> {
            let v = objects
                .into_iter()
                .flatten()
                .find_map(|o| o.get(key))
                .ok_or_else(|| {
                    Error::file(
                        &self.source,
                        format!("rope_type \"longrope\" needs `{key}`"),
                    )
                })?;
            let numbers: Option<Vec<f64>> = v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_f64).collect());
            let numbers = numbers.ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("config.json `{key}` = {v} is not a list of numbers"),
                )
            })?;
            Ok(numbers)
        };
        let (short, long) = (list("short_factor")?, list("long_factor")?);
        let factors = Factors::new(&short, &long).ok_or_else(|| {
            Error::file(
                &self.source,
                format!(
                    "config.json's longrope short_factor and long_factor hold {} and {} values",
                    short.len(),
                    long.len()
                ),
            )
        })?;
        let top = "original_max_position_embeddings";
        let original = match self.number_in(&self.json, top)? {
            Some(n) => self.positive(top, n)?,
            None => match find(top)? {
                Some(_) => need(top)?,
                None => self.max_positions()?,
            },
        };
        let factor = match find("factor")? {
            Some(f) => f,
            None => self.max_positions()? / original,
        };
        let attention_factor = match find("attention_factor")? {
            Some(a) => self.positive("attention_factor", a)?,
            None if factor <= 1.0 => 1.0,
            None => (1.0 + factor.ln() / original.ln()).sqrt(),
        };
        Ok(RopeScaling::LongRope {
            factors,
            original_max_positions: original,
            attention_factor,
        })
    }

    /// transformers' `_compute_yarn_parameters`: `attention_factor` when given, else
    /// 0.1·ln(factor) + 1 (or the `mscale` / `mscale_all_dim` ratio of two such), `beta_fast`
    /// 32 and `beta_slow` 1 when absent or 0, `truncate` true when absent.
    fn yarn(
        &self,
        find: &dyn Fn(&str) -> Result<Option<f64>>,
        need: &dyn Fn(&str) -> Result<f64>,
        params: Option<&Value>,
    ) -> Result<RopeScaling> {
        let factor = need("factor")?;
        let mscale = |m: f64| match factor <= 1.0 {
            true => 1.0,
            false => 0.1 * m * factor.ln() + 1.0,
        };
        let attention_factor = match find("attention_factor")? {
            Some(a) => self.positive("attention_factor", a)?,
            None => match (find("mscale")?, find("mscale_all_dim")?) {
                (Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
                _ => mscale(1.0),
            },
        };
        let or = |key: &str, default: f64| -> Result<f64> {
            match find(key)? {
                None => Ok(default),
                Some(0.0) => Ok(default),
                Some(x) => self.positive(key, x),
            }
        };
        let truncate = match params.and_then(|p| p.get("truncate")) {
            None | Some(Value::Null) => true,
            Some(v) => v.as_bool().ok_or_else(|| {
                Error::file(
                    &self.source,
                    format!("config.json `truncate` = {v} is not true or false"),
                )
            })?,
        };
        Ok(RopeScaling::Yarn {
            factor,
            original_max_positions: need("original_max_position_embeddings")?,
            beta_fast: or("beta_fast", 32.0)?,
            beta_slow: or("beta_slow", 1.0)?,
            attention_factor,
            truncate,
        })
    }
}

impl HfConfig {
    /// transformers' `yarn_apply_mscale` (DeepSeek's MLA): the factor its softmax scale is
    /// multiplied by — mscale², mscale = 0.1·`mscale_all_dim`·ln(`factor`) + 1 (1 when
    /// factor ≤ 1) — when the RoPE type is not `default` and `mscale_all_dim` is set and not 0;
    /// else 1.
    pub fn mla_mscale_squared(&self) -> Result<f64> {
        let params = match self.object_or_null("rope_parameters")? {
            Some(p) => Some(p),
            None => self.object_or_null("rope_scaling")?,
        };
        let Some(p) = params else { return Ok(1.0) };
        let rope_type = p.get("rope_type").or_else(|| p.get("type"));
        if rope_type.is_none_or(|t| t.as_str() == Some("default")) {
            return Ok(1.0);
        }
        let all_dim = self.number_in(p, "mscale_all_dim")?.unwrap_or(0.0);
        if all_dim == 0.0 {
            return Ok(1.0);
        }
        let factor = self.number_in(p, "factor")?.ok_or_else(|| {
            Error::file(
                &self.source,
                "rope_parameters sets mscale_all_dim but no `factor`",
            )
        })?;
        let mscale = match factor <= 1.0 {
            true => 1.0,
            false => 0.1 * all_dim * factor.ln() + 1.0,
        };
        Ok(mscale * mscale)
    }
}
