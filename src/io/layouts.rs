//! Attention weights by state-dict name.
//!
//! [`AttentionWeights::from_safetensors`] recognises four layouts by tensor names (under an
//! optional prefix such as `encoder.layers.0.self_attn.`):
//!
//! | layout | tensors |
//! |---|---|
//! | [`WeightLayout::Classic`] (seed 000) | `W_q.weight W_q.bias W_k.* W_v.* W_o.*` |
//! | [`WeightLayout::PerHead`] (seed 001) | `w_q.weight w_q.bias w_k.* w_v.*`, no output projection |
//! | [`WeightLayout::TorchPacked`] | `nn.MultiheadAttention`: `in_proj_weight [3E,E]`, `in_proj_bias [3E]`, `out_proj.weight`, `out_proj.bias` |
//! | [`WeightLayout::TorchSeparate`] | `nn.MultiheadAttention(kdim, vdim)`: `q_proj_weight [E,E]`, `k_proj_weight [E,kdim]`, `v_proj_weight [E,vdim]`, `in_proj_bias`, `out_proj.*` |
//!
//! Any layout may also hold `bias_k` and `bias_v` (`nn.MultiheadAttention(add_bias_kv=True)`,
//! `[1, 1, E]`), which turn the config's `add_bias_kv` on.
//!
//! The config is inferred from the shapes; the number of heads comes from the caller or from the
//! file's metadata (`num_heads`, `heads` or `head`). Biases are on when present (all or none).
//! Weights may be F32, F16 or BF16. Every problem is a typed `Err` naming the tensor.

use std::path::Path;

use crate::error::{Error, Result};
use crate::io::safetensors::SafetensorsFile;
use crate::model::config::AttentionConfig;
use crate::model::weights::{AttentionWeights, BiasKv, Linear};

/// How the weights were stored (the names they were found under).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// Seed 000: `W_q.weight`, `W_q.bias`, … `W_o.*`.
    Classic,
    /// Seed 001: `w_q.*`, `w_k.*`, `w_v.*`, no output projection.
    PerHead,
    /// `nn.MultiheadAttention` with packed `in_proj_weight [3E, E]`.
    TorchPacked,
    /// `nn.MultiheadAttention(kdim, vdim)` with `q_proj_weight`, `k_proj_weight`, `v_proj_weight`.
    TorchSeparate,
}

impl WeightLayout {
    /// The name the fixtures use in their `layout` metadata.
    pub fn name(&self) -> &'static str {
        match self {
            WeightLayout::Classic => "dmodel",
            WeightLayout::PerHead => "perhead",
            WeightLayout::TorchPacked => "torch_mha_packed",
            WeightLayout::TorchSeparate => "torch_mha_separate",
        }
    }
}

/// What [`AttentionWeights::from_safetensors`] returns: the inferred config, the weights
/// (checked against it) and the layout they were found in.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedWeights {
    /// The config inferred from the weights' shapes and the head count.
    pub config: AttentionConfig,
    /// The weights, checked against `config`.
    pub weights: AttentionWeights,
    /// The layout the weights were found in.
    pub layout: WeightLayout,
}

impl AttentionWeights {
    /// Loads attention weights from a safetensors file. `prefix` is prepended to every state-dict
    /// name (`""`, or e.g. `"encoder.layers.0.self_attn."`); `heads` overrides the file's
    /// `num_heads`/`heads` metadata. See the [module docs](crate::io::safetensors) for the layouts.
    pub fn from_safetensors(
        path: impl AsRef<Path>,
        prefix: &str,
        heads: Option<usize>,
    ) -> Result<LoadedWeights> {
        load_weights(&SafetensorsFile::open(path)?, prefix, heads)
    }

    /// [`from_safetensors`](Self::from_safetensors) from bytes in memory.
    pub fn from_safetensors_bytes(
        bytes: &[u8],
        prefix: &str,
        heads: Option<usize>,
    ) -> Result<LoadedWeights> {
        let file = SafetensorsFile::from_bytes("<bytes>", bytes.to_vec())?;
        load_weights(&file, prefix, heads)
    }
}

/// Loads attention weights from an already opened file (see [`AttentionWeights::from_safetensors`]).
pub fn load_weights(
    file: &SafetensorsFile,
    prefix: &str,
    heads: Option<usize>,
) -> Result<LoadedWeights> {
    let has = |n: &str| file.contains(&format!("{prefix}{n}"));
    let layout = if has("W_q.weight") {
        WeightLayout::Classic
    } else if has("w_q.weight") {
        WeightLayout::PerHead
    } else if has("in_proj_weight") {
        WeightLayout::TorchPacked
    } else if has("q_proj_weight") {
        WeightLayout::TorchSeparate
    } else {
        return Err(unknown_layout(file, prefix));
    };
    let heads = resolve_heads(file, heads)?;
    let loader = Loader { file, prefix };
    let (config, weights) = match layout {
        WeightLayout::Classic => loader.seed(["W_q", "W_k", "W_v"], Some("W_o"), heads)?,
        WeightLayout::PerHead => {
            if has("w_o.weight") {
                return Err(Error::weight(
                    format!("{prefix}w_o.weight"),
                    "is present, but the per-head layout (w_q, w_k, w_v) has no output projection",
                ));
            }
            loader.seed(["w_q", "w_k", "w_v"], None, heads)?
        }
        WeightLayout::TorchPacked | WeightLayout::TorchSeparate => loader.torch(layout, heads)?,
    };
    let (config, weights) = loader.bias_kv(config, weights)?;
    weights.check(&config).map_err(|e| prefixed(e, prefix))?;
    Ok(LoadedWeights {
        config,
        weights,
        layout,
    })
}

/// `AttentionWeights::check` names weights without the prefix; add it back.
fn prefixed(e: Error, prefix: &str) -> Error {
    match e {
        Error::Weight { name, problem } if !prefix.is_empty() => Error::Weight {
            name: format!("{prefix}{name}"),
            problem,
        },
        other => other,
    }
}

fn resolve_heads(file: &SafetensorsFile, heads: Option<usize>) -> Result<usize> {
    let heads = match heads {
        Some(h) => h,
        None => {
            let mut found = None;
            for key in ["num_heads", "heads", "head"] {
                if let Some(h) = file.metadata_usize(key)? {
                    found = Some(h);
                    break;
                }
            }
            found.ok_or_else(|| {
                Error::Config(format!(
                    "{}: the number of heads is not in the file (metadata `num_heads` or `heads`); \
                     pass it (`--heads H`)",
                    file.name()
                ))
            })?
        }
    };
    if heads == 0 {
        return Err(Error::Config(
            "the number of heads is 0; it must be at least 1".into(),
        ));
    }
    Ok(heads)
}

fn unknown_layout(file: &SafetensorsFile, prefix: &str) -> Error {
    const KEYS: [&str; 4] = [
        "W_q.weight",
        "w_q.weight",
        "in_proj_weight",
        "q_proj_weight",
    ];
    let names = file.names();
    let mut problem = format!(
        "no attention weights under prefix {prefix:?}: expected `W_q.weight` (classic), \
         `w_q.weight` (per-head), `in_proj_weight` or `q_proj_weight` (nn.MultiheadAttention)"
    );
    // A likely prefix: the part before a recognised name anywhere in the file.
    let mut prefixes: Vec<&str> = names
        .iter()
        .filter_map(|n| KEYS.iter().find_map(|k| n.strip_suffix(k)))
        .collect();
    prefixes.dedup();
    if !prefixes.is_empty() {
        let list: Vec<String> = prefixes.iter().take(4).map(|p| format!("{p:?}")).collect();
        problem.push_str(&format!("; did you mean prefix {}?", list.join(" or ")));
    } else {
        let shown: Vec<&str> = names.iter().take(6).copied().collect();
        let more = if names.len() > 6 { ", …" } else { "" };
        problem.push_str(&format!("; the file holds: {}{more}", shown.join(", ")));
    }
    Error::file(file.name(), problem)
}

/// Rows and/or columns a weight must have, and why (for the message).
struct Expect {
    rows: Option<usize>,
    cols: Option<usize>,
    why: String,
}

impl Expect {
    fn any() -> Self {
        Expect {
            rows: None,
            cols: None,
            why: String::new(),
        }
    }
}

struct Loader<'a> {
    file: &'a SafetensorsFile,
    prefix: &'a str,
}

impl Loader<'_> {
    fn full(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A float tensor of the given rank, as `(shape, values)`; errors are `Error::Weight`.
    fn tensor(&self, name: &str, rank: usize) -> Result<(Vec<usize>, Vec<f32>)> {
        let full = self.full(name);
        let (shape, values) = self
            .file
            .read_f32(&full)
            .map_err(|p| Error::weight(&full, p))?;
        if shape.len() != rank {
            let expected = if rank == 2 {
                "[out_features, in_features]"
            } else {
                "[out_features]"
            };
            return Err(Error::weight(
                &full,
                format!("has shape {shape:?}, expected rank {rank} {expected}"),
            ));
        }
        Ok((shape, values))
    }

    fn optional(&self, name: &str, rank: usize) -> Result<Option<(Vec<usize>, Vec<f32>)>> {
        if self.file.contains(&self.full(name)) {
            self.tensor(name, rank).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `weight [out, in]` (+ `bias [out]` when `bias` says so; presence must match). `expect`
    /// gives the rows and/or columns the weight must have and why, checked before the bias.
    fn linear(
        &self,
        weight: &str,
        bias_name: &str,
        bias: bool,
        first_bias: &str,
        expect: Expect,
    ) -> Result<Linear> {
        let (shape, w) = self.tensor(weight, 2)?;
        let (out_features, in_features) = (shape[0], shape[1]);
        if expect.rows.is_some_and(|r| r != out_features)
            || expect.cols.is_some_and(|c| c != in_features)
        {
            let dim = |d: Option<usize>| d.map_or("*".to_string(), |d| d.to_string());
            return Err(Error::weight(
                self.full(weight),
                format!(
                    "has shape {shape:?}, expected [{}, {}] ({})",
                    dim(expect.rows),
                    dim(expect.cols),
                    expect.why
                ),
            ));
        }
        let b = match (self.optional(bias_name, 1)?, bias) {
            (Some((bs, b)), true) => {
                if bs[0] != out_features {
                    return Err(Error::weight(
                        self.full(bias_name),
                        format!(
                            "has shape {bs:?}, expected [{out_features}] (the rows of `{}`)",
                            self.full(weight)
                        ),
                    ));
                }
                Some(b)
            }
            (None, false) => None,
            (None, true) => {
                return Err(Error::weight(
                    self.full(bias_name),
                    format!(
                        "is missing, but `{}` is present (biases are all or none)",
                        self.full(first_bias)
                    ),
                ))
            }
            (Some(_), false) => {
                return Err(Error::weight(
                    self.full(bias_name),
                    format!(
                        "is present, but `{}` is not (biases are all or none)",
                        self.full(first_bias)
                    ),
                ))
            }
        };
        Ok(Linear {
            out_features,
            in_features,
            weight: w,
            bias: b,
        })
    }

    /// The two seed layouts: `{q,k,v,o}.weight` / `.bias`.
    fn seed(
        &self,
        [q, k, v]: [&str; 3],
        o: Option<&str>,
        heads: usize,
    ) -> Result<(AttentionConfig, AttentionWeights)> {
        let qb = format!("{q}.bias");
        let bias = self.file.contains(&self.full(&qb));
        let lin = |n: &str, expect| {
            self.linear(
                &format!("{n}.weight"),
                &format!("{n}.bias"),
                bias,
                &qb,
                expect,
            )
        };
        let lq = lin(q, Expect::any())?;
        let lk = lin(
            k,
            Expect {
                rows: Some(lq.out_features),
                cols: None,
                why: format!("as many rows as `{}`", self.full(&format!("{q}.weight"))),
            },
        )?;
        let lv = lin(v, Expect::any())?;
        let lo = o
            .map(|o| {
                lin(
                    o,
                    Expect {
                        rows: Some(lq.in_features),
                        cols: Some(lv.out_features),
                        why: format!(
                            "[model_dim, heads·v_head_dim] from `{}` and `{}`",
                            self.full(&format!("{q}.weight")),
                            self.full(&format!("{v}.weight"))
                        ),
                    },
                )
            })
            .transpose()?;
        let split = |name: &str, rows: usize| -> Result<usize> {
            if !rows.is_multiple_of(heads) {
                return Err(Error::weight(
                    self.full(&format!("{name}.weight")),
                    format!("has {rows} rows, which do not split into {heads} heads"),
                ));
            }
            Ok(rows / heads)
        };
        split(q, lq.out_features)?;
        split(v, lv.out_features)?;
        assembled(heads, bias, [lq, lk, lv], lo)
    }

    /// `bias_k`, `bias_v` of `nn.MultiheadAttention(add_bias_kv=True)` (`[1, 1, E]`), in any
    /// layout: both or neither, `heads·head_dim` values each. Present, they turn the config's
    /// `add_bias_kv` on.
    fn bias_kv(
        &self,
        config: AttentionConfig,
        weights: AttentionWeights,
    ) -> Result<(AttentionConfig, AttentionWeights)> {
        let read = |name: &str, want: usize| -> Result<Option<Vec<f32>>> {
            let full = self.full(name);
            if !self.file.contains(&full) {
                return Ok(None);
            }
            let (shape, values) = self
                .file
                .read_f32(&full)
                .map_err(|p| Error::weight(&full, p))?;
            if shape.last() != Some(&want) || values.len() != want {
                return Err(Error::weight(
                    full,
                    format!("has shape {shape:?}, expected [1, 1, {want}] (heads·head_dim)"),
                ));
            }
            Ok(Some(values))
        };
        let pair = (
            read("bias_k", config.qk_width())?,
            read("bias_v", config.v_width())?,
        );
        let (k, v) = match pair {
            (None, None) => return Ok((config, weights)),
            (Some(k), Some(v)) => (k, v),
            (k, _) => {
                let (missing, present) = match k {
                    Some(_) => ("bias_v", "bias_k"),
                    None => ("bias_k", "bias_v"),
                };
                return Err(Error::weight(
                    self.full(missing),
                    format!(
                        "is missing, but `{}` is present (add_bias_kv has both)",
                        self.full(present)
                    ),
                ));
            }
        };
        let config = config.with_appended_keys(true, config.add_zero_attn);
        let bias_kv = Some(BiasKv { k, v });
        Ok((config, AttentionWeights { bias_kv, ..weights }))
    }

    /// `nn.MultiheadAttention`, packed or separate projections.
    fn torch(
        &self,
        layout: WeightLayout,
        heads: usize,
    ) -> Result<(AttentionConfig, AttentionWeights)> {
        let in_bias = self.optional("in_proj_bias", 1)?;
        let bias = in_bias.is_some();
        let (q, k, v, e) = if layout == WeightLayout::TorchPacked {
            let (shape, w) = self.tensor("in_proj_weight", 2)?;
            let e = shape[1];
            if shape[0] != 3 * e {
                return Err(Error::weight(
                    self.full("in_proj_weight"),
                    format!("has shape {shape:?}, expected [3·E, E] = [{}, {e}]", 3 * e),
                ));
            }
            let rows = |i: usize| w[i * e * e..(i + 1) * e * e].to_vec();
            let lin = |weight| Linear {
                out_features: e,
                in_features: e,
                weight,
                bias: None,
            };
            (lin(rows(0)), lin(rows(1)), lin(rows(2)), e)
        } else {
            let (qs, qw) = self.tensor("q_proj_weight", 2)?;
            let e = qs[0];
            if qs[1] != e {
                return Err(Error::weight(
                    self.full("q_proj_weight"),
                    format!("has shape {qs:?}, expected [E, E] = [{e}, {e}]"),
                ));
            }
            let side = |name: &str| -> Result<Linear> {
                let (s, w) = self.tensor(name, 2)?;
                if s[0] != e {
                    return Err(Error::weight(
                        self.full(name),
                        format!("has shape {s:?}, expected [E, in] with E = {e} (the rows of q_proj_weight)"),
                    ));
                }
                Ok(Linear {
                    out_features: e,
                    in_features: s[1],
                    weight: w,
                    bias: None,
                })
            };
            let q = Linear {
                out_features: e,
                in_features: e,
                weight: qw,
                bias: None,
            };
            (q, side("k_proj_weight")?, side("v_proj_weight")?, e)
        };
        let (mut q, mut k, mut v) = (q, k, v);
        if let Some((bs, b)) = in_bias {
            if bs[0] != 3 * e {
                return Err(Error::weight(
                    self.full("in_proj_bias"),
                    format!("has shape {bs:?}, expected [3·E] = [{}]", 3 * e),
                ));
            }
            q.bias = Some(b[..e].to_vec());
            k.bias = Some(b[e..2 * e].to_vec());
            v.bias = Some(b[2 * e..].to_vec());
        }
        let o = self.linear(
            "out_proj.weight",
            "out_proj.bias",
            bias,
            "in_proj_bias",
            Expect {
                rows: Some(e),
                cols: Some(e),
                why: "[E, E]".into(),
            },
        )?;
        if !e.is_multiple_of(heads) {
            return Err(Error::Config(format!(
                "embed_dim {e} (from `{}`) is not divisible by {heads} heads",
                self.full(if layout == WeightLayout::TorchPacked {
                    "in_proj_weight"
                } else {
                    "q_proj_weight"
                })
            )));
        }
        // nn.MultiheadAttention scales by 1/sqrt(E/heads), the default.
        assembled(heads, bias, [q, k, v], Some(o))
    }
}

/// The config the weights' shapes imply (`heads` heads; the caller checked that they split),
/// validated, with the weights.
fn assembled(
    heads: usize,
    bias: bool,
    [q, k, v]: [Linear; 3],
    o: Option<Linear>,
) -> Result<(AttentionConfig, AttentionWeights)> {
    let weights = AttentionWeights::projections(q, k, v, o);
    // Bias on/off as the loader found it; `check` then names any projection that differs.
    let config = AttentionConfig {
        bias,
        ..weights.implied_config(heads, heads)?
    };
    Ok((config, weights))
}
