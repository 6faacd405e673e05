//! WavLM's gated relative position bias: T5's bidirectional buckets (`num_buckets`,
//! `max_bucket_distance`) over a `[buckets, heads]` table held by the stack's layer 0
//! (`rel_attn_embed`), scaled per batch row, head and query by a gate computed from the
//! module's input: each head's slice x_h of the hidden state goes through
//! `gru_rel_pos_linear` (d → 8), summed in two groups of four, a, b = sigmoid(…), and the
//! gate is a·(b·c_h − 1) + 2 (`gru_rel_pos_const`). The bias depends on the inputs, so the
//! module's mask is made from them ([`super::HfAttention::mask_for`]).

use super::config::HfConfig;
use super::HfCheckpoint;
use crate::error::{Error, Result};
use crate::model::mask::{AttnDims, Mask};
use crate::model::relative_bias::RelativeBias;
use crate::model::tensor::Tensor;

/// The tensors of WavLM's gate under a module's prefix (the table only in layer 0's).
pub(super) const TENSORS: [&str; 4] = [
    "gru_rel_pos_const",
    "gru_rel_pos_linear.weight",
    "gru_rel_pos_linear.bias",
    "rel_attn_embed.weight",
];

/// One WavLM module's gated bias.
#[derive(Debug, Clone)]
pub struct GatedBias {
    bias: RelativeBias,
    /// `gru_rel_pos_linear`: `[8, head_dim]` and `[8]`.
    weight: Vec<f32>,
    bias8: Vec<f32>,
    /// `gru_rel_pos_const`: one per head.
    constant: Vec<f32>,
    head_dim: usize,
}

impl HfCheckpoint {
    /// The gated bias of the WavLM module at `prefix` (its stack's layer 0 holds the table).
    pub(super) fn wavlm_bias(&self, prefix: &str, c: &HfConfig, heads: usize) -> Result<GatedBias> {
        let buckets = c.usize("num_buckets")?.unwrap_or(320);
        let max_distance = c.usize("max_bucket_distance")?.unwrap_or(800);
        // transformers truncates max_exact + share; the shared bucket rule truncates the share
        // alone: the same while the share is ≥ 0, i.e. max_distance beyond the exact range.
        if buckets < 4 || max_distance <= buckets / 4 {
            return Err(Error::file(
                c.source(),
                format!(
                    "config.json num_buckets = {buckets}, max_bucket_distance = {max_distance}: \
                     WavLM's far buckets need max_bucket_distance > num_buckets / 4 here"
                ),
            ));
        }
        let stack = prefix.split(".layers.").next().unwrap_or_default();
        let table_name = format!("{stack}.layers.0.attention.rel_attn_embed.weight");
        let (shape, table) = self.read(&table_name)?;
        if shape != [buckets, heads] {
            return Err(Error::weight(
                table_name,
                format!(
                    "has shape {shape:?}, expected [num_buckets, heads] = [{buckets}, {heads}]"
                ),
            ));
        }
        let bias = RelativeBias::new(table, buckets, heads, max_distance, true)?;
        let (shape, constant) = self.read(&format!("{prefix}gru_rel_pos_const"))?;
        if constant.len() != heads {
            return Err(Error::weight(
                format!("{prefix}gru_rel_pos_const"),
                format!("has shape {shape:?}, expected [1, {heads}, 1, 1]"),
            ));
        }
        let (shape, weight) = self.read(&format!("{prefix}gru_rel_pos_linear.weight"))?;
        let head_dim = shape.get(1).copied().unwrap_or(0);
        if shape.len() != 2 || shape[0] != 8 || head_dim == 0 {
            return Err(Error::weight(
                format!("{prefix}gru_rel_pos_linear.weight"),
                format!("has shape {shape:?}, expected [8, head_dim]"),
            ));
        }
        let (shape, bias8) = self.read(&format!("{prefix}gru_rel_pos_linear.bias"))?;
        if bias8.len() != 8 {
            return Err(Error::weight(
                format!("{prefix}gru_rel_pos_linear.bias"),
                format!("has shape {shape:?}, expected [8]"),
            ));
        }
        Ok(GatedBias {
            bias,
            weight,
            bias8,
            constant,
            head_dim,
        })
    }
}

impl GatedBias {
    /// The additive `[B, H, L, L]` bias for hidden states `x` `[B, L, H·head_dim]`.
    pub fn mask(&self, x: &Tensor, dims: AttnDims) -> Result<Mask> {
        let (h, d) = (self.bias.heads, self.head_dim);
        if x.shape() != [dims.batch, dims.lq, h * d] || dims.lq != dims.lk {
            return Err(Error::Config(format!(
                "WavLM's gated bias needs the module's own input [B, L, {}] with Lq = Lk; got \
                 {:?} (Lk = {})",
                h * d,
                x.shape(),
                dims.lk
            )));
        }
        let Mask::Bias(base) = self.bias.mask(dims, false)? else {
            return Err(Error::Config("the relative bias is not additive".into()));
        };
        let (b, l) = (dims.batch, dims.lq);
        let mut out = Vec::with_capacity(b * h * l * l);
        for bi in 0..b {
            for hi in 0..h {
                for i in 0..l {
                    let row = &x.data()[(bi * l + i) * h * d + hi * d..][..d];
                    let proj = |k: usize| {
                        let w = &self.weight[k * d..][..d];
                        self.bias8[k] + w.iter().zip(row).map(|(a, b)| a * b).sum::<f32>()
                    };
                    let sigmoid = |v: f32| 1.0 / (1.0 + (-v).exp());
                    let a = sigmoid((0..4).map(proj).sum());
                    let g = sigmoid((4..8).map(proj).sum());
                    let gate = a * (g * self.constant[hi] - 1.0) + 2.0;
                    let base_row = &base.data()[(hi * l + i) * l..][..l];
                    out.extend(base_row.iter().map(|v| gate * v));
                }
            }
        }
        Ok(Mask::Bias(Tensor::new([b, h, l, l], out)?))
    }
}
