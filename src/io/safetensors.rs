//! Safetensors in and out: attention weights by state-dict name, and the small typed reader the
//! case files and the CLI use.
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
//! The config is inferred from the shapes; the number of heads comes from the caller or from the
//! file's metadata (`num_heads`, `heads` or `head`). Biases are on when present (all or none).
//! Weights may be F32, F16 or BF16. Every problem is a typed `Err` naming the tensor.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::model::config::AttentionConfig;
use crate::model::mask::MaskTensor;
use crate::model::tensor::Tensor;
use crate::model::weights::{AttentionWeights, Linear};

/// A safetensors file read into memory and validated (header, offsets, sizes).
///
/// Nothing here panics on a corrupt or truncated file: every failure is an [`Error::File`] (or
/// [`Error::Io`] when the file cannot be read at all).
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    name: String,
    bytes: Vec<u8>,
    data_start: usize,
    metadata: HashMap<String, String>,
    tensors: HashMap<String, TensorInfo>,
}

impl SafetensorsFile {
    /// Reads and validates a file; messages name it by its path.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(path.display().to_string(), bytes)
    }

    /// Validates bytes already in memory; `name` is used in messages.
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> Result<Self> {
        let name = name.into();
        let (header_len, metadata): (usize, Metadata) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| Error::file(&name, format!("not a readable safetensors file ({e})")))?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(k, info)| (k, info.clone()))
            .collect();
        Ok(SafetensorsFile {
            data_start: 8 + header_len,
            metadata: metadata.metadata().clone().unwrap_or_default(),
            tensors,
            name,
            bytes,
        })
    }

    /// The name used in messages (the path for [`open`](Self::open)).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A string from the `__metadata__` header.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }

    /// Whether a tensor of this name exists.
    pub fn contains(&self, tensor: &str) -> bool {
        self.tensors.contains_key(tensor)
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Shape of a tensor, if it exists.
    pub fn shape(&self, tensor: &str) -> Option<&[usize]> {
        self.tensors.get(tensor).map(|t| t.shape.as_slice())
    }

    /// Dtype of a tensor, if it exists.
    pub fn dtype(&self, tensor: &str) -> Option<Dtype> {
        self.tensors.get(tensor).map(|t| t.dtype)
    }

    fn raw(&self, tensor: &str) -> std::result::Result<(&TensorInfo, &[u8]), String> {
        let info = self.tensors.get(tensor).ok_or("is missing")?;
        let (start, end) = info.data_offsets;
        // `read_metadata` has checked the offsets; stay defensive anyway.
        let data = self
            .bytes
            .get(self.data_start + start..self.data_start + end)
            .ok_or("has data offsets outside the file")?;
        Ok((info, data))
    }

    /// Values of a floating-point tensor (F32, F16 or BF16) as f32; the error is a problem
    /// phrase for the caller to attach to the tensor's name.
    fn read_f32(&self, tensor: &str) -> std::result::Result<(Vec<usize>, Vec<f32>), String> {
        let (info, data) = self.raw(tensor)?;
        let values = match info.dtype {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => return Err(format!("has dtype {other:?}; it must be F32, F16 or BF16")),
        };
        Ok((info.shape.clone(), values))
    }

    /// Values of a floating-point tensor (F64, F32, F16 or BF16) as f64.
    fn read_f64(&self, tensor: &str) -> std::result::Result<(Vec<usize>, Vec<f64>), String> {
        let (info, data) = self.raw(tensor)?;
        if info.dtype == Dtype::F64 {
            let values = data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            return Ok((info.shape.clone(), values));
        }
        let (shape, values) = self.read_f32(tensor).map_err(|_| {
            format!(
                "has dtype {:?}; it must be F64, F32, F16 or BF16",
                info.dtype
            )
        })?;
        Ok((shape, values.into_iter().map(f64::from).collect()))
    }

    /// A float tensor (F32, F16 or BF16) as an f32 [`Tensor`]; a missing tensor or another
    /// dtype is an [`Error::File`] naming it.
    pub fn tensor_f32(&self, tensor: &str) -> Result<Tensor> {
        let (shape, values) = self
            .read_f32(tensor)
            .map_err(|p| self.tensor_error(tensor, p))?;
        Tensor::new(shape, values)
    }

    /// A float tensor (F64, F32, F16 or BF16) widened to f64: `(shape, values)`.
    pub fn tensor_f64(&self, tensor: &str) -> Result<(Vec<usize>, Vec<f64>)> {
        self.read_f64(tensor)
            .map_err(|p| self.tensor_error(tensor, p))
    }

    /// A U8 or BOOL tensor as a [`MaskTensor`] (any nonzero byte is "set").
    pub fn mask_tensor(&self, tensor: &str) -> Result<MaskTensor> {
        let (info, data) = self.raw(tensor).map_err(|p| self.tensor_error(tensor, p))?;
        match info.dtype {
            Dtype::U8 | Dtype::BOOL => MaskTensor::new(info.shape.clone(), data.to_vec()),
            other => Err(self.tensor_error(
                tensor,
                format!("has dtype {other:?}; a mask must be U8 or BOOL"),
            )),
        }
    }

    /// An [`Error::File`] about one tensor of this file.
    pub(crate) fn tensor_error(&self, tensor: &str, problem: impl std::fmt::Display) -> Error {
        Error::file(&self.name, format!("tensor `{tensor}` {problem}"))
    }

    /// Parses a whole-number metadata value (`num_heads`), `None` when the key is absent.
    pub(crate) fn metadata_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.metadata(key) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| {
                Error::file(
                    &self.name,
                    format!("metadata `{key}` = {v:?} is not a whole number"),
                )
            }),
        }
    }
}

/// Writes f32 tensors (and optional string metadata) to a safetensors file.
pub fn write_safetensors(
    path: impl AsRef<Path>,
    tensors: &[(&str, &Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, t)| t.data().iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, t), b)| {
            safetensors::tensor::TensorView::new(Dtype::F32, t.shape().to_vec(), b)
                .map(|view| (*name, view))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::file(path.display().to_string(), format!("cannot serialize: {e}")))?;
    let out = safetensors::serialize(views, metadata)
        .map_err(|e| Error::file(path.display().to_string(), format!("cannot serialize: {e}")))?;
    std::fs::write(path, out).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

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
    pub config: AttentionConfig,
    pub weights: AttentionWeights,
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
        let qk_head_dim = split(q, lq.out_features)?;
        let v_head_dim = split(v, lv.out_features)?;
        let config = AttentionConfig {
            model_dim: lq.in_features,
            key_dim: lk.in_features,
            value_dim: lv.in_features,
            heads,
            qk_head_dim,
            v_head_dim,
            output_projection: lo.is_some(),
            bias,
            scale: None,
        }
        .validated()?;
        Ok((
            config,
            AttentionWeights {
                q: lq,
                k: lk,
                v: lv,
                o: lo,
            },
        ))
    }

    /// `nn.MultiheadAttention`, packed or separate projections.
    fn torch(
        &self,
        layout: WeightLayout,
        heads: usize,
    ) -> Result<(AttentionConfig, AttentionWeights)> {
        for extra in ["bias_k", "bias_v"] {
            if self.file.contains(&self.full(extra)) {
                return Err(Error::weight(
                    self.full(extra),
                    "is present: nn.MultiheadAttention(add_bias_kv=True) is not supported",
                ));
            }
        }
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
        let config = AttentionConfig {
            model_dim: e,
            key_dim: k.in_features,
            value_dim: v.in_features,
            heads,
            qk_head_dim: e / heads,
            v_head_dim: e / heads,
            output_projection: true,
            bias,
            // nn.MultiheadAttention scales by 1/sqrt(E/heads), the default.
            scale: None,
        }
        .validated()?;
        Ok((
            config,
            AttentionWeights {
                q,
                k,
                v,
                o: Some(o),
            },
        ))
    }
}
