//! A Hugging Face self-attention module decoding through a `KvCache`, each step with the
//! mask the module applies — causal, its sliding window, or T5's relative position bias for
//! the step's queries — so that no step runs without what transformers would add.

use super::HfAttention;
use crate::attention::kv_cache::{KvCache, KvCacheBytes, StepOptions};
use crate::attention::mla_stage::MlaStage;
use crate::attention::AttentionPath;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::mask::AttnDims;
use crate::model::tensor::Tensor;
use crate::MultiHeadAttention;

/// A module and its cache (see [`HfAttention::decoder`]).
pub struct HfDecoder {
    module: HfAttention,
    mha: MultiHeadAttention,
    cache: KvCache,
    batch: usize,
    /// MLA's pre-stage on the device.
    stage: Option<MlaStage>,
}

/// A decoder's cache in bytes, next to an equivalent multi-head cache ([`HfDecoder::bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderCacheBytes {
    /// What the decoder's own cache holds on the device.
    pub cache: KvCacheBytes,
    /// Bytes per token of one sequence a multi-head cache of this module would hold.
    pub mha_per_token: u64,
}

impl HfAttention {
    /// A decoder of `batch` sequences of up to `capacity` tokens: a causal self-attention module
    /// only (cross-attention decodes against fixed keys, and an encoder's tokens see the ones
    /// after them: use the module's forward).
    pub fn decoder(&self, gpu: &Gpu, batch: usize, capacity: usize) -> Result<HfDecoder> {
        self.decoder_on(gpu, batch, capacity, AttentionPath::Auto)
    }

    /// [`decoder`](Self::decoder) on an explicit attention path (`MultiPass`, `Fused`).
    pub fn decoder_on(
        &self,
        gpu: &Gpu,
        batch: usize,
        capacity: usize,
        path: AttentionPath,
    ) -> Result<HfDecoder> {
        if self.cross {
            return Err(Error::Misuse(format!(
                "`{}` is a cross-attention module; a decoder steps a self-attention",
                self.prefix
            )));
        }
        // An encoder's token attends to the tokens after it, which no step has seen yet: each
        // step's rows would differ from the module's output, so none is computed.
        if !self.causal {
            return Err(Error::Misuse(format!(
                "`{}` is a bidirectional (encoder) self-attention: each token attends to the \
                 tokens after it, which a decoder has not seen yet; run the module's forward \
                 over the whole sequence",
                self.prefix
            )));
        }
        let mha = MultiHeadAttention::new(gpu, self.config, &self.weights)?;
        let cache = KvCache::with_path(&mha, batch, capacity, path)?;
        Ok(HfDecoder {
            module: self.clone(),
            mha,
            cache,
            batch,
            stage: self.mla.as_ref().map(|m| MlaStage::new(gpu, m)),
        })
    }
}

impl HfDecoder {
    /// The module's output for `x_new` (`[B, n, E]`, the next `n` tokens of each sequence),
    /// with RoPE `positions` (`[B, n]`; default: the cache position on; ignored by a NoPE layer
    /// of a RoPE model) and the module's own mask over the step's keys.
    pub fn step(&mut self, x_new: &Tensor, positions: Option<&[usize]>) -> Result<Tensor> {
        // A NoPE layer of a RoPE model takes the model's position_ids and ignores them, as
        // transformers' layer does.
        let positions = positions.filter(|_| !self.module.is_nope_layer());
        let n = x_new.shape().get(1).copied().unwrap_or(0);
        let dims = AttnDims {
            batch: self.batch,
            heads: self.module.config.heads,
            lq: n,
            lk: self.cache.len() + n,
        };
        let mask = self.module.mask(dims, None)?;
        // MLA: queries from its query input, keys (and values) from its latent.
        let latent = match &self.stage {
            Some(stage) => Some(stage.of(x_new)?),
            None => None,
        };
        let (x_q, x_k_v) = match &latent {
            Some((q, kv)) => (q, Some(kv)),
            None => (x_new, None),
        };
        let options = StepOptions {
            mask: Some(&mask),
            positions,
            x_k_v,
        };
        self.mha.forward_step_with(&mut self.cache, x_q, &options)
    }

    /// The cache's bytes, and what a multi-head cache of the module as transformers defines it
    /// would hold per token: f32 keys and values of every head (`H·(dk + dv)`; MLA's expanded
    /// `H·(qk_nope_head_dim + qk_rope_head_dim + v_head_dim)`), where MLA's latent cache holds
    /// `qk_rope_head_dim + kv_lora_rank`.
    pub fn bytes(&self) -> DecoderCacheBytes {
        let c = &self.module.config;
        let per_head = match &self.module.mla {
            Some(mla) => mla.dims().qk_head_dim() + mla.dims().v_head_dim,
            None => c.qk_head_dim + c.v_head_dim,
        };
        DecoderCacheBytes {
            cache: self.cache.bytes(),
            mha_per_token: 4 * (c.heads * per_head) as u64,
        }
    }

    /// Tokens decoded so far.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether no token has been decoded yet.
    pub fn is_empty(&self) -> bool {
        self.cache.len() == 0
    }
}
