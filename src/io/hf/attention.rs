//! One attention module of a checkpoint as loaded ([`HfAttention`]): what it is, its weights,
//! and the mask rule it applies, composed as `transformers` does.

use crate::error::{Error, Result};
use crate::model::config::AttentionConfig;
use crate::model::mask::{AttnDims, Mask, MaskTensor, PaddingMask};
use crate::model::mla::MlaInputs;
use crate::model::relative_bias::RelativeBias;
use crate::model::tensor::Tensor;
use crate::model::weights::AttentionWeights;

use super::families::Family;
use super::wavlm;

/// One attention module of a checkpoint, loaded.
#[derive(Debug, Clone)]
pub struct HfAttention {
    /// The layout its tensors were found in.
    pub family: Family,
    /// `model_type` from the config, when there is one.
    pub model_type: Option<String>,
    /// Its state-dict prefix (`model.layers.0.self_attn.`).
    pub prefix: String,
    /// Attends to another sequence (`key_value_states`).
    pub cross: bool,
    /// A decoder self-attention: query i sees keys j ≤ i.
    pub causal: bool,
    /// Mistral's `sliding_window` W (with `causal`): query i sees keys i − W < j ≤ i; in an
    /// encoder (ModernBERT's local layers), keys |i − j| ≤ W.
    pub window: Option<usize>,
    /// Llama 4's chunked attention (with `causal`): query i sees keys j ≤ i in its own chunk of
    /// `chunk` positions.
    pub chunk: Option<usize>,
    /// The module's sizes and options (heads, head sizes, scale, RoPE …).
    pub config: AttentionConfig,
    /// The module's projections (and its norms, sinks, gate where it has them).
    pub weights: AttentionWeights,
    /// T5 self-attention's relative position bias.
    pub relative_bias: Option<RelativeBias>,
    /// WavLM's gated relative position bias (made from the inputs: [`HfAttention::mask_for`]).
    pub gated_bias: Option<wavlm::GatedBias>,
    /// LongT5's local attention: keys within `block − 1` positions of the query.
    pub local_block: Option<usize>,
    /// BEiT's relative position bias `[1, H, N, N]` over the config's patch grid.
    pub grid_bias: Option<Tensor>,
    /// The LayerNorm (its stored prefix) the model applies before this module inside its
    /// attention block (megatron-bert's `ln`): not computed here; inputs are its output.
    pub input_norm: Option<String>,
    /// Multi-head latent attention's pre-stage: the core's inputs are not the hidden states
    /// (see [`HfAttention::inputs`]).
    pub mla: Option<MlaInputs>,
}

impl HfAttention {
    /// A self-attention layer of a RoPE family that runs without positions (NoPE: EXAONE 4's
    /// and Cohere 2's full layers).
    pub fn is_nope_layer(&self) -> bool {
        self.family.uses_rope()
            && !self.cross
            && self.config.rope.is_none()
            && self.config.alibi.is_none()
            && self.mla.is_none()
    }

    /// The core's (query, key/value) inputs for hidden states `x`: `x` itself, or MLA's query
    /// input and latent.
    pub fn inputs(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        match &self.mla {
            Some(mla) => mla.of(x),
            None => Ok((x.clone(), x.clone())),
        }
    }

    /// The mask for hidden states `x` (the module's input): WavLM's gated bias is made from
    /// them; every other module's is [`HfAttention::mask`]'s.
    pub fn mask_for(
        &self,
        x: &Tensor,
        dims: AttnDims,
        attention_mask: Option<&MaskTensor>,
    ) -> Result<Mask> {
        let Some(gated) = &self.gated_bias else {
            return self.mask(dims, attention_mask);
        };
        let base = gated.mask(x, dims)?;
        match attention_mask {
            None => Ok(base),
            Some(m) => base.with_key_padding(&PaddingMask::HfAttention(m.clone()), dims),
        }
    }

    /// The mask this module applies to `dims`: causal when it is a decoder self-attention, the
    /// padding of `attention_mask` (`[B, Lk]`, 1 = real token), and T5's relative bias — all
    /// composed as `transformers` does.
    pub fn mask(&self, dims: AttnDims, attention_mask: Option<&MaskTensor>) -> Result<Mask> {
        if self.gated_bias.is_some() {
            return Err(Error::Misuse(
                "WavLM's gated relative position bias is made from the module's input: use \
                 HfAttention::mask_for"
                    .into(),
            ));
        }
        if let Some(bias) = &self.grid_bias {
            let n = bias.shape()[2];
            if dims.lq != n || dims.lk != n {
                return Err(Error::Config(format!(
                    "BEiT's relative position bias is built for the config's patch grid: {n} \
                     tokens with [CLS]; these inputs have Lq = {}, Lk = {} (another grid, \
                     transformers' interpolate_pos_encoding, is not implemented)",
                    dims.lq, dims.lk
                )));
            }
            let base = Mask::Bias(bias.clone());
            return match attention_mask {
                None => Ok(base),
                Some(m) => base.with_key_padding(&PaddingMask::HfAttention(m.clone()), dims),
            };
        }
        if let (Some(chunk), true) = (self.chunk, self.causal) {
            let mask = self.chunked_mask(chunk, attention_mask)?;
            mask.check(dims)?;
            return Ok(mask);
        }
        // A decoder's padded batch: the causal rule in the shader, the padding per key.
        if let (None, true, Some(m)) = (&self.relative_bias, self.causal, attention_mask) {
            let mask = Mask::causal_with_padding(self.window, m);
            mask.check(dims)?;
            return Ok(mask);
        }
        let base = match (&self.relative_bias, self.causal, self.window) {
            (Some(bias), _, _) if self.local_block.is_some() => {
                return self.local_mask(bias, dims, attention_mask)
            }
            (Some(bias), causal, _) => bias.mask(dims, causal)?,
            (None, true, Some(w)) => Mask::SlidingWindow(w),
            (None, true, None) => Mask::Causal,
            (None, false, Some(w)) => {
                let data = (0..dims.lq * dims.lk)
                    .map(|n| ((n / dims.lk).abs_diff(n % dims.lk) <= w) as u8)
                    .collect();
                Mask::attend([1, 1, dims.lq, dims.lk], data)?
            }
            (None, false, None) => Mask::None,
        };
        match attention_mask {
            None => Ok(base),
            Some(m) => base.with_key_padding(&PaddingMask::HfAttention(m.clone()), dims),
        }
    }

    /// Llama 4's chunked mask. transformers starts each row's chunks after its left padding
    /// (zeros before the first real token), which the shader's chunks do not follow: such a
    /// batch is refused.
    fn chunked_mask(&self, chunk: usize, keep: Option<&MaskTensor>) -> Result<Mask> {
        if let Some(m) = keep {
            let lk = m.shape().last().copied().unwrap_or(0).max(1);
            if m.data().chunks(lk).any(|row| row.first() == Some(&0)) {
                return Err(Error::Mask(format!(
                    "`{}` is a chunked layer, and an attention_mask row starts with padding: \
                     transformers then moves that row's chunk boundaries by its left padding, \
                     which the loader does not; pad on the right",
                    self.prefix
                )));
            }
        }
        Ok(Mask::Chunked {
            chunk,
            keep: keep.cloned(),
        })
    }
}
