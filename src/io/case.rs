//! Case files: one safetensors file holding a whole attention problem and its answer
//! (DESIGN.md, "Weights and the case file"), and the pass rule `wgpu-mha check` applies.
//!
//! * metadata `variant` = `dmodel` (classic, seed 000) or `perhead` (seed 001); metadata `config`
//!   = JSON whose `sizes` holds `{d_model, num_heads}` or `{emb_size, q_k_size, v_size, head}`;
//!   optional `err_f32_vs_f64` (PyTorch's own float32 error);
//! * weights under their state-dict names (classic: the seed's `W_q…W_o` or
//!   `nn.MultiheadAttention`'s `in_proj_weight…out_proj.*`); inputs `Q`, `K`, `V` (classic) or
//!   `x_q`, `x_k_v` (per-head); a mask as [`crate::io::masks`] reads it (`mask`, `attn_mask`
//!   bool or float, `key_padding_mask`); metadata `scale` replaces 1/√d_k;
//! * expected `out_f64` (f64), `out` (PyTorch's f32 result) and optionally `attn_f64`.
//!
//! `bias_k`/`bias_v` (`[1, 1, E]`) and metadata `add_zero_attn = "true"` append keys every
//! query sees, as `nn.MultiheadAttention(add_bias_kv=True, add_zero_attn=True)` does.
//! Other tensors and metadata keys are ignored. A case passes when
//! `max|engine − out_f64| ≤ max(1e-5, 10·err_f32_vs_f64)`, or `1e-4·(1 + max|out_f64|)` when the
//! file has no `err_f32_vs_f64`.

use crate::attention::gpu_tensor::GpuTensor;
use crate::attention::{ForwardOptions, ForwardOutput, MultiHeadAttention};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::io::layouts::{load_weights, WeightLayout};
use crate::io::masks::read_mask;
use crate::io::safetensors::SafetensorsFile;
use crate::model::config::AttentionConfig;
use crate::model::mask::{AttnDims, Mask};
use crate::model::tensor::Tensor;
use crate::model::weights::AttentionWeights;

/// Which seed module a case describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseVariant {
    /// `variant = "dmodel"`: seed 000, inputs `Q, K, V`, mask `mask` (0 = masked).
    Classic,
    /// `variant = "perhead"`: seed 001, inputs `x_q, x_k_v`, mask `attn_mask` (true = masked).
    PerHead,
    /// `variant = "hf"`: a Hugging Face attention module as saved, inputs `hidden_states` (and
    /// `key_value_states`), mask from `causal` and `attention_mask` (see `io::hf::case`).
    Hf,
}

impl CaseVariant {
    /// The metadata spelling (`dmodel` / `perhead`).
    pub fn name(&self) -> &'static str {
        match self {
            CaseVariant::Classic => "dmodel",
            CaseVariant::PerHead => "perhead",
            CaseVariant::Hf => "hf",
        }
    }
}

/// One case file, read and checked for consistency (nothing has run yet).
#[derive(Debug, Clone)]
pub struct Case {
    /// The file's name (its path when read with [`Case::from_file`]).
    pub name: String,
    /// For a Hugging Face case: the module (family, prefix, how it attends).
    pub module: Option<String>,
    /// Which seed module the case describes (metadata `variant`).
    pub variant: CaseVariant,
    /// The module's sizes and options, from metadata `config` and the weights.
    pub config: AttentionConfig,
    /// The module's weights, checked against `config`.
    pub weights: AttentionWeights,
    /// `Q` or `x_q`: `[B, Lq, model_dim]`.
    pub query: Tensor,
    /// `K` or `x_k_v`: `[B, Lk, key_dim]`.
    pub key: Tensor,
    /// `V` for classic cases; `None` for per-head ones, whose values come from `key` (`x_k_v`).
    pub value: Option<Tensor>,
    /// The attention mask the file gives (see [`crate::io::masks`]).
    pub mask: Mask,
    /// RoPE positions of the keys `[B, Lk]` (a Hugging Face case's `position_ids`), when the
    /// module has RoPE and the file gives them.
    pub positions: Option<Vec<usize>>,
    /// Shape of the output, `[B, Lq, output_dim]`.
    pub out_shape: Vec<usize>,
    /// The exact answer (`out_f64`).
    pub out_f64: Vec<f64>,
    /// PyTorch's float32 answer (`out`), when present.
    pub out_f32: Option<Tensor>,
    /// Attention probabilities `[B, H, Lq, Lk]` (`attn_f64`), when present.
    pub attn_f64: Option<Vec<f64>>,
    /// PyTorch's own float32 error on this case (metadata `err_f32_vs_f64`), when present.
    pub err_f32_vs_f64: Option<f64>,
}

/// The outcome of running one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The engine's output and the path it took.
    pub forward: ForwardOutput,
    /// `max|engine − out_f64|` (NaN if the engine produced NaN).
    pub max_abs_err: f64,
    /// The pass bound ([`Case::bound`]).
    pub bound: f64,
}

impl CaseResult {
    /// Whether the error is within the bound (a NaN error fails).
    pub fn passed(&self) -> bool {
        self.max_abs_err <= self.bound
    }
}

/// Reads a seed case (`variant` classic or per-head) from an opened safetensors file; what
/// `Case::from_safetensors` (in `io::case_file`) runs for those variants.
pub(crate) fn seed_case(file: &SafetensorsFile, variant: CaseVariant) -> Result<Case> {
    let bad_meta = |problem: String| Error::file(file.name(), problem);
    let config = config_from_metadata(file, variant)?;
    let add_zero_attn = add_zero_attn(file)?;
    let loaded = load_weights(file, "", Some(config.heads))?;
    // A classic case may hold the seed's names or nn.MultiheadAttention's (same module).
    let layout_fits = match variant {
        CaseVariant::Classic => loaded.layout != WeightLayout::PerHead,
        CaseVariant::PerHead | CaseVariant::Hf => loaded.layout == WeightLayout::PerHead,
    };
    if !layout_fits {
        return Err(bad_meta(format!(
            "metadata `variant` is {:?}, but the weights are in the {:?} layout",
            variant.name(),
            loaded.layout.name()
        )));
    }
    let l = &loaded.config;
    let dims = |c: &AttentionConfig| {
        (
            c.model_dim,
            c.key_dim,
            c.value_dim,
            c.heads,
            c.qk_head_dim,
            c.v_head_dim,
        )
    };
    if dims(l) != dims(&config) {
        return Err(bad_meta(format!(
            "the weights' shapes give model/key/value widths {}/{}/{}, {} heads of q/k {} and v {}, \
             but metadata `config` sizes give {}/{}/{}, {} heads of q/k {} and v {}",
            l.model_dim, l.key_dim, l.value_dim, l.heads, l.qk_head_dim, l.v_head_dim,
            config.model_dim, config.key_dim, config.value_dim, config.heads,
            config.qk_head_dim, config.v_head_dim
        )));
    }
    // Bias on/off follows the file (the seeds always have it); `scale` replaces 1/√d_k.
    // `bias_k`/`bias_v` came with the weights; metadata `add_zero_attn` joins them.
    let with_zero = loaded
        .config
        .with_appended_keys(loaded.config.add_bias_kv, add_zero_attn);
    let config = match file.metadata("scale") {
        None => with_zero,
        Some(s) => match s.trim().parse::<f32>() {
            Ok(v) => with_zero.with_scale(v)?,
            Err(_) => {
                return Err(bad_meta(format!(
                    "metadata `scale` = {s:?} is not a number"
                )))
            }
        },
    };

    // Classic cases hold Q, K, V; per-head ones x_q, x_k_v (keys and values from one tensor).
    let (query_name, key_name) = match variant {
        CaseVariant::Classic => ("Q", "K"),
        CaseVariant::PerHead | CaseVariant::Hf => ("x_q", "x_k_v"),
    };
    let query = file.tensor_f32(query_name)?;
    let key = file.tensor_f32(key_name)?;
    let value = match variant {
        CaseVariant::Classic => Some(file.tensor_f32("V")?),
        CaseVariant::PerHead | CaseVariant::Hf => None,
    };
    let value_shape = value.as_ref().unwrap_or(&key).shape();
    config.check_inputs(query.shape(), key.shape(), value_shape)?;
    let (batch, lq, lk) = (query.shape()[0], query.shape()[1], key.shape()[1]);
    let mask = read_mask(
        file,
        AttnDims {
            batch,
            heads: config.heads,
            lq,
            lk,
        },
    )?;

    let out_shape = vec![batch, lq, config.output_dim()];
    let (out_f64, out_f32, err_f32_vs_f64) = read_expected(file, &out_shape)?;
    let attn_f64 = if file.contains("attn_f64") {
        let (shape, attn) = file.tensor_f64("attn_f64")?;
        // nn.MultiheadAttention's weights cover the appended keys too.
        let want = [batch, config.heads, lq, lk + config.appended_keys()];
        if shape != want {
            return Err(Error::shape("attn_f64", format!("{want:?}"), &shape));
        }
        Some(attn)
    } else {
        None
    };
    Ok(Case {
        name: file.name().to_string(),
        module: None,
        variant,
        config,
        weights: loaded.weights,
        query,
        key,
        value,
        mask,
        positions: None,
        out_shape,
        out_f64,
        out_f32,
        attn_f64,
        err_f32_vs_f64,
    })
}

impl Case {
    /// The pass bound: `max(1e-5, 10·err_f32_vs_f64)`, or `1e-4·(1 + max|out_f64|)` without
    /// it, and never more than [`Case::bound_cap`]: a file cannot declare any answer correct.
    pub fn bound(&self) -> f64 {
        let declared = match self.err_f32_vs_f64 {
            Some(e) => (10.0 * e).max(1e-5),
            None => 1e-4 * (1.0 + self.max_abs_expected()),
        };
        declared.min(self.bound_cap())
    }

    /// The largest bound a case may have: `1e-2·(1 + max|out_f64|)`.
    pub fn bound_cap(&self) -> f64 {
        1e-2 * (1.0 + self.max_abs_expected())
    }

    /// Whether the file's `err_f32_vs_f64` asked for more than [`Case::bound_cap`].
    pub fn bound_capped(&self) -> bool {
        self.err_f32_vs_f64
            .is_some_and(|e| (10.0 * e).max(1e-5) > self.bound_cap())
    }

    /// Largest finite |out_f64|.
    fn max_abs_expected(&self) -> f64 {
        self.out_f64
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()))
    }

    /// `max|output − out_f64|` over the positions where `out_f64` is finite or differs from the
    /// output; a NaN (or same-signed infinity) that `out_f64` expects at exactly that position
    /// counts as a match, as PyTorch propagates NaN from the inputs. NaN anywhere else, or
    /// outputs of the wrong length, make the error NaN (a failure).
    pub fn max_abs_err(&self, output: &[f32]) -> f64 {
        if output.len() != self.out_f64.len() {
            return f64::NAN;
        }
        let same_non_finite = |(&g, &w): &(&f32, &f64)| {
            let g = g as f64;
            !(g.is_nan() && w.is_nan() || g.is_infinite() && g == w)
        };
        let (got, want): (Vec<f32>, Vec<f64>) = output
            .iter()
            .zip(&self.out_f64)
            .filter(same_non_finite)
            .unzip();
        crate::model::tensor::max_abs_error(&got, &want)
    }

    /// `(batch, Lq, Lk)` (0 where a hand-built case has too few dimensions).
    pub fn dims(&self) -> (usize, usize, usize) {
        let dim = |t: &Tensor, i: usize| t.shape().get(i).copied().unwrap_or(0);
        (dim(&self.query, 0), dim(&self.query, 1), dim(&self.key, 1))
    }

    /// A one-line description: variant, sizes, batch and lengths, mask.
    pub fn describe(&self) -> String {
        let c = &self.config;
        let (b, lq, lk) = self.dims();
        let sizes = match self.variant {
            CaseVariant::Classic => format!("dmodel d_model={} heads={}", c.model_dim, c.heads),
            CaseVariant::PerHead => format!(
                "perhead emb={} q_k={} v={} head={}",
                c.model_dim, c.qk_head_dim, c.v_head_dim, c.heads
            ),
            CaseVariant::Hf => format!(
                "hf {} E={} heads={} head_dim={}",
                self.module.as_deref().unwrap_or("?"),
                c.model_dim,
                c.heads,
                c.qk_head_dim
            ),
        };
        let mask = match &self.mask {
            Mask::Attend(t) | Mask::Block(t) => {
                let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
                format!("{}[{}]", self.mask.kind_name(), dims.join(","))
            }
            other => other.kind_name().to_string(),
        };
        let mut options = String::new();
        if c.add_bias_kv {
            options.push_str(" +bias_kv");
        }
        if c.add_zero_attn {
            options.push_str(" +zero_attn");
        }
        if let Some(s) = c.scale {
            options.push_str(&format!(" scale={s}"));
        }
        if let Some(cap) = c.softcap {
            options.push_str(&format!(" softcap={cap}"));
        }
        if let Some(n) = &c.qk_norm {
            options.push_str(&format!(" qk_norm={:?}/{:?}", n.kind, n.scope));
            if n.after_rope {
                options.push_str(" after_rope");
            }
        }
        if c.sinks {
            options.push_str(" +sinks");
        }
        if let Some(clip) = c.clip_qkv {
            options.push_str(&format!(" clip_qkv={clip}"));
        }
        if let Some(m) = c.alibi {
            options.push_str(&format!(" +alibi(max_bias={m})"));
        }
        format!("{sizes}{options} B={b} Lq={lq} Lk={lk} mask={mask}")
    }

    /// Runs the case on a module built from its config and weights: `forward(Q, K, V, mask)` for
    /// classic cases, `forward_cross(x_q, x_k_v, attn_mask)` (keys and values from the same
    /// tensor) for per-head ones.
    pub fn forward(
        &self,
        mha: &MultiHeadAttention,
        options: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        let options = &ForwardOptions {
            positions: self.positions.clone(),
            ..options.clone()
        };
        match &self.value {
            Some(v) => mha.forward_with(&self.query, &self.key, v, &self.mask, options),
            None => mha.forward_with(&self.query, &self.key, &self.key, &self.mask, options),
        }
    }

    /// The f64 CPU reference of this case's problem (independent of the GPU and of the file's
    /// expected outputs).
    pub fn reference(&self) -> Result<crate::reference::ReferenceOutput> {
        let value = self.value.as_ref().unwrap_or(&self.key);
        crate::reference::forward_at(
            &self.config,
            &self.weights,
            &self.query,
            &self.key,
            value,
            &self.mask,
            self.positions.as_deref(),
        )
    }

    /// Builds the module on `gpu`, runs the case and measures it against `out_f64`.
    pub fn run(&self, gpu: &Gpu, options: &ForwardOptions) -> Result<CaseResult> {
        let mha = MultiHeadAttention::new(gpu, self.config, &self.weights)?;
        let forward = self.forward(&mha, options)?;
        let max_abs_err = self.max_abs_err(forward.output.data());
        Ok(CaseResult {
            forward,
            max_abs_err,
            bound: self.bound(),
        })
    }

    /// [`run`](Self::run) without blocking, the form a browser runs: the inputs go up as device
    /// tensors, the forward is recorded and submitted, and the output (and probabilities, when
    /// `options` asks for them) come back through [`GpuTensor::read_async`], whose `Err` is also
    /// where a GPU error of the forward surfaces in a browser.
    pub async fn run_async(&self, gpu: &Gpu, options: &ForwardOptions) -> Result<CaseResult> {
        let mha = MultiHeadAttention::new(gpu, self.config, &self.weights)?;
        let options = ForwardOptions {
            positions: self.positions.clone(),
            ..options.clone()
        };
        let query = GpuTensor::upload(gpu, &self.query)?;
        let key = GpuTensor::upload(gpu, &self.key)?;
        // A per-head case's values are its keys (`x_k_v`), as in `forward`.
        let value = match &self.value {
            Some(v) => GpuTensor::upload(gpu, v)?,
            None => key.clone(),
        };
        let ran = mha.forward_gpu_with(&query, &key, &value, &self.mask, &options)?;
        let output = ran.output.read_async(gpu).await?;
        let probs = match &ran.probs {
            Some(p) => Some(p.read_async(gpu).await?),
            None => None,
        };
        let max_abs_err = self.max_abs_err(output.data());
        Ok(CaseResult {
            forward: ForwardOutput {
                output,
                probs,
                path: ran.path,
                pass_ms: Vec::new(),
            },
            max_abs_err,
            bound: self.bound(),
        })
    }
}

/// `out_f64` (which must be `out_shape`), `out` if present, and metadata `err_f32_vs_f64`.
pub(crate) fn read_expected(
    file: &SafetensorsFile,
    out_shape: &[usize],
) -> Result<(Vec<f64>, Option<Tensor>, Option<f64>)> {
    let (shape, out_f64) = file.tensor_f64("out_f64")?;
    if shape != out_shape {
        return Err(Error::shape("out_f64", format!("{out_shape:?}"), &shape));
    }
    let out_f32 = match file.contains("out") {
        false => None,
        true => {
            let out = file.tensor_f32("out")?;
            if out.shape() != out_shape {
                return Err(Error::shape("out", format!("{out_shape:?}"), out.shape()));
            }
            Some(out)
        }
    };
    let err = match file.metadata("err_f32_vs_f64") {
        None => None,
        Some(s) => match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Some(v),
            _ => {
                return Err(Error::file(
                    file.name(),
                    format!(
                        "metadata `err_f32_vs_f64` = {s:?} is not a finite, non-negative number"
                    ),
                ))
            }
        },
    };
    Ok((out_f64, out_f32, err))
}

/// The config from metadata `config` → `sizes`.
fn config_from_metadata(file: &SafetensorsFile, variant: CaseVariant) -> Result<AttentionConfig> {
    let bad = |problem: String| Error::file(file.name(), problem);
    let text = file
        .metadata("config")
        .ok_or_else(|| bad("metadata `config` is missing".into()))?;
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| bad(format!("metadata `config` is not valid JSON ({e})")))?;
    let sizes = json
        .get("sizes")
        .ok_or_else(|| bad("metadata `config` has no `sizes`".into()))?;
    let size = |key: &str| -> Result<usize> {
        let v = sizes
            .get(key)
            .ok_or_else(|| bad(format!("metadata `config` sizes.{key} is missing")))?;
        v.as_u64()
            .filter(|&n| n >= 1)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                bad(format!(
                    "metadata `config` sizes.{key} = {v} is not a positive integer"
                ))
            })
    };
    match variant {
        CaseVariant::Classic => AttentionConfig::classic(size("d_model")?, size("num_heads")?),
        CaseVariant::PerHead => AttentionConfig::per_head(
            size("emb_size")?,
            size("q_k_size")?,
            size("v_size")?,
            size("head")?,
        ),
        // Read by `io::hf::case` from `hf_config`; never asked here.
        CaseVariant::Hf => Err(bad(
            "a Hugging Face case takes its sizes from metadata `hf_config`".into(),
        )),
    }
}

/// Metadata `add_zero_attn` (`nn.MultiheadAttention(add_zero_attn=True)`): `"true"` or
/// `"false"` in any case, absent = false; anything else is an error, never a guess.
pub fn add_zero_attn(file: &SafetensorsFile) -> Result<bool> {
    let value = file
        .metadata("add_zero_attn")
        .map(|v| v.trim().to_ascii_lowercase());
    match value.as_deref() {
        // Python's str(True) is "True"; accept either case.
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Error::file(
            file.name(),
            format!("metadata `add_zero_attn` = {other:?}; expected \"true\" or \"false\""),
        )),
    }
}
