//! The arguments of `wgpu-mha run` (case files, state dicts and, through `cli::hf`, Hugging
//! Face checkpoints) and the attention core `run` and `check` pick: one place that both
//! `cli::interop` and `cli::hf` read, so neither imports the other's types.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use wgpu_mha::{AttentionPath, ForwardOptions};

/// Which attention core to run (`auto` = fused unless it cannot be used).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum PathArg {
    #[default]
    Auto,
    Multipass,
    Fused,
}

impl PathArg {
    pub(crate) fn options(self) -> ForwardOptions {
        ForwardOptions {
            return_probs: false,
            path: match self {
                PathArg::Auto => AttentionPath::Auto,
                PathArg::Multipass => AttentionPath::MultiPass,
                PathArg::Fused => AttentionPath::Fused,
            },
            positions: None,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A case file: its weights, inputs and mask are used.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["weights", "hf", "inputs", "prefix", "heads"], required_unless_present_any = ["weights", "hf"])]
    pub(crate) case: Option<PathBuf>,
    /// Weights: a state dict in safetensors (`W_q.*`, `w_q.*`, or nn.MultiheadAttention's
    /// `in_proj_weight`/`q_proj_weight`, `out_proj.*`).
    #[arg(long, value_name = "FILE", requires = "inputs", conflicts_with = "hf")]
    pub(crate) weights: Option<PathBuf>,
    /// A Hugging Face checkpoint as saved: a directory (`config.json` + `model.safetensors` or
    /// its shards) or one safetensors file; pick the module with --layer or --prefix. Inputs:
    /// `hidden_states`, `key_value_states` (cross-attention), `attention_mask` (1 = real token).
    #[arg(long, value_name = "DIR|FILE", requires = "inputs")]
    pub(crate) hf: Option<PathBuf>,
    /// With --hf: the layer whose attention module runs (when the layer has several, use --prefix).
    #[arg(long, requires = "hf", conflicts_with = "prefix")]
    pub(crate) layer: Option<usize>,
    /// Prefix of the attention tensors in the weights file (e.g. `encoder.layers.0.self_attn.`);
    /// default: the file's `prefix` metadata, else none.
    #[arg(long)]
    pub(crate) prefix: Option<String>,
    /// Number of heads (default: the weights file's `num_heads`/`heads` metadata, or config.json).
    #[arg(long)]
    pub(crate) heads: Option<usize>,
    /// Inputs: `query`, `key`, `value` (or `Q`, `K`, `V`), or `x_q`, `x_k_v`; optional mask
    /// `mask` (u8, 0 = masked) or `attn_mask` (bool: true = masked; float: added to the scores),
    /// and `key_padding_mask` `[B, Lk]` (true = padding), as PyTorch takes them.
    #[arg(long, value_name = "FILE")]
    pub(crate) inputs: Option<PathBuf>,
    /// Where to write the output tensor `out` (f32, safetensors).
    #[arg(long, value_name = "FILE")]
    pub(crate) out: PathBuf,
    /// Attention core to run.
    #[arg(long, value_enum, default_value_t)]
    pub(crate) path: PathArg,
    /// Inputs are sequence-first `[L, B, E]` (nn.MultiheadAttention's default,
    /// `batch_first=False`); the output is written the same way. Unbatched `[L, E]` inputs need
    /// no flag.
    #[arg(long, conflicts_with_all = ["case", "hf"])]
    pub(crate) seq_first: bool,
    /// Score scale replacing 1/√d_k (F.scaled_dot_product_attention's `scale`; T5 uses 1).
    /// Not with --hf, whose config.json gives the scale.
    #[arg(long, conflicts_with_all = ["case", "hf"])]
    pub(crate) scale: Option<f32>,
    /// nn.MultiheadAttention(add_zero_attn=True): a zero key and value after the input's (and
    /// after `bias_k`/`bias_v`, which come with the weights). Also read from the weights file's
    /// metadata `add_zero_attn` = "true".
    #[arg(long, conflicts_with_all = ["case", "hf"])]
    pub(crate) add_zero_attn: bool,
    /// Also write the attention weights `attn_weights` `[B, H, Lq, Lk]` (runs the multi-pass
    /// path, which computes them).
    #[arg(long)]
    pub(crate) probs: bool,
    /// With --probs: average the weights over heads, `[B, Lq, Lk]`, as PyTorch's
    /// `average_attn_weights=True`.
    #[arg(long, requires = "probs")]
    pub(crate) average: bool,
}
