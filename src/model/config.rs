//! `AttentionConfig`: one description for both seed modules.

use crate::error::{Error, Result};
use crate::model::qk_norm::QkNorm;
use crate::model::rope::Rope;

/// The most values one projection weight may hold (4 GiB of f32).
pub const MAX_WEIGHT_VALUES: u64 = 1 << 30;

/// Sizes and switches of one multi-head attention module.
///
/// * `classic(d_model, num_heads)` is seed 000: `W_q, W_k, W_v, W_o` all `d_model → d_model`,
///   `d_k = d_model / num_heads`, scale `1/sqrt(d_k)`.
/// * `per_head(emb_size, q_k_size, v_size, head)` is seed 001: `w_q, w_k: emb → head·q_k_size`,
///   `w_v: emb → head·v_size`, no output projection, scale `1/sqrt(q_k_size)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionConfig {
    /// Width of the query input (and of the output when there is an output projection).
    pub model_dim: usize,
    /// Width of the key input (equals `model_dim` for both seeds).
    pub key_dim: usize,
    /// Width of the value input (equals `model_dim` for both seeds).
    pub value_dim: usize,
    /// Number of (query) heads.
    pub heads: usize,
    /// Key/value heads: `heads` for multi-head attention, fewer for grouped-query attention
    /// (query head `h` reads key/value head `h / (heads / kv_heads)`), 1 for multi-query.
    pub kv_heads: usize,
    /// Per-head width of queries and keys.
    pub qk_head_dim: usize,
    /// Per-head width of values.
    pub v_head_dim: usize,
    /// Whether `W_o: heads·v_head_dim → model_dim` follows the attention.
    pub output_projection: bool,
    /// Whether the projections carry a bias.
    pub bias: bool,
    /// Score scale; `None` means `1/sqrt(qk_head_dim)`.
    pub scale: Option<f32>,
    /// Logit soft-capping (Gemma 2): a scaled score `s` becomes `c · tanh(s / c)` before the
    /// mask. `None`: scores are not capped.
    pub softcap: Option<f32>,
    /// ALiBi (BLOOM, MPT, Falcon with `alibi`) with this `max_bias`: query head h adds
    /// `alibi_slope(h, heads, max_bias) · (j − i′)` to its scores, i′ = i + Lk − Lq being the
    /// query's position. `None`: no ALiBi.
    pub alibi: Option<f32>,
    /// `nn.MultiheadAttention(add_bias_kv=True)`: a learned key and value
    /// ([`crate::AttentionWeights::bias_kv`]) appended after the projected keys.
    pub add_bias_kv: bool,
    /// `nn.MultiheadAttention(add_zero_attn=True)`: a zero key and value appended after those.
    pub add_zero_attn: bool,
    /// Rotary position embeddings of queries and keys (Llama, GPT-NeoX, …), by the positions
    /// of [`crate::ForwardOptions::positions`].
    pub rope: Option<Rope>,
    /// Queries and keys normalised after their projection, before RoPE (Qwen3, Gemma 3,
    /// OLMo 2, StableLM, Cohere), with [`crate::AttentionWeights::qk_norm`].
    pub qk_norm: Option<QkNorm>,
    /// Attention sinks (gpt-oss): a learned logit per query head
    /// ([`crate::AttentionWeights::sinks`]) that joins each softmax's denominator only, as a
    /// key with value zero every query sees.
    pub sinks: bool,
    /// OLMo's `clip_qkv`: the projected q, k and v clamped to `[-c, c]` before anything else.
    pub clip_qkv: Option<f32>,
    /// A `KvCache` keeps only the keys and reads the values from them (MLA's latent cache,
    /// [`crate::model::mla`]): W_v = W_k, and the output projection is zero on each value
    /// head's rotary dimensions, so values taken after RoPE give the forward's answer.
    pub values_from_keys: bool,
    /// Llama 4's attention temperature tuning (its NoPE layers): the query at position `p`
    /// (its row in the sequence, `i + Lk − Lq`) scaled by `ln(1 + floor((p + 1) / floor_scale))
    /// · attn_scale + 1`. `None`: no tuning.
    pub temperature: Option<TemperatureTuning>,
    /// Llama 4's chunked local attention (`attention_chunk_size`) where the Hugging Face loader
    /// reads it: that layer's masks are [`crate::Mask::Chunked`] (its `HfAttention::mask`
    /// makes them). Carried so that a page pool, whose steps take a window but no chunks,
    /// refuses the layer instead of attending past a chunk; the forward itself applies the mask
    /// it is given.
    pub chunked: Option<usize>,
    /// Qwen3-Next's output gate: the combined heads are multiplied by `sigmoid(W_g·x + b_g)`
    /// (the query input's gate projection, [`crate::AttentionWeights::gate`]) before `W_o`.
    pub output_gate: bool,
    /// BitNet's `attn_sub_norm`: an RMSNorm of each token's combined heads (all `heads ·
    /// v_head_dim` values, weights [`crate::AttentionWeights::output_norm`]) with this epsilon,
    /// before the output gate and `W_o`.
    pub output_norm: Option<f32>,
}

/// The two numbers of Llama 4's temperature tuning (see [`AttentionConfig::temperature`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TemperatureTuning {
    /// `floor_scale`: what `p + 1` is divided by (then floored) inside the logarithm; finite and
    /// positive.
    pub floor_scale: f32,
    /// `attn_scale`: what the logarithm is multiplied by.
    pub attn_scale: f32,
}

impl TemperatureTuning {
    /// The factor of the query at position `p`, in f32 as transformers computes it.
    pub fn factor(&self, p: usize) -> f32 {
        ((p as f32 + 1.0) / self.floor_scale).floor().ln_1p() * self.attn_scale + 1.0
    }
}

impl AttentionConfig {
    /// Seed 000: `MultiHeadAttention(d_model, num_heads)`.
    pub fn classic(d_model: usize, num_heads: usize) -> Result<Self> {
        if num_heads == 0 {
            return Err(Error::Config(
                "num_heads is 0; it must be at least 1".into(),
            ));
        }
        if !d_model.is_multiple_of(num_heads) {
            return Err(Error::Config(format!(
                "d_model {d_model} is not divisible by num_heads {num_heads}"
            )));
        }
        let d_k = d_model / num_heads;
        Self::unswitched(d_model, num_heads, d_k, d_k, true).validated()
    }

    /// Seed 001: `MultiHeadAttention(emb_size, q_k_size, v_size, head)`.
    pub fn per_head(emb_size: usize, q_k_size: usize, v_size: usize, head: usize) -> Result<Self> {
        Self::unswitched(emb_size, head, q_k_size, v_size, false).validated()
    }

    /// `heads` heads of `model_dim`-wide inputs, biased, every switch off (what both seeds
    /// share); not yet validated.
    fn unswitched(
        model_dim: usize,
        heads: usize,
        qk_head_dim: usize,
        v_head_dim: usize,
        output_projection: bool,
    ) -> Self {
        AttentionConfig {
            model_dim,
            key_dim: model_dim,
            value_dim: model_dim,
            heads,
            kv_heads: heads,
            qk_head_dim,
            v_head_dim,
            output_projection,
            bias: true,
            scale: None,
            softcap: None,
            alibi: None,
            add_bias_kv: false,
            add_zero_attn: false,
            rope: None,
            qk_norm: None,
            sinks: false,
            clip_qkv: None,
            values_from_keys: false,
            temperature: None,
            chunked: None,
            output_gate: false,
            output_norm: None,
        }
    }

    /// Turns the projection biases on or off.
    pub fn with_bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// Overrides the score scale (default `1/sqrt(qk_head_dim)`).
    pub fn with_scale(self, scale: f32) -> Result<Self> {
        self.validated_with(|c| c.scale = Some(scale))
    }

    /// Caps every scaled score softly at ±`cap`: `cap · tanh(s / cap)`, before the mask, as
    /// Gemma 2's `attn_logit_softcapping` does. `cap` must be finite and positive.
    pub fn with_softcap(self, cap: f32) -> Result<Self> {
        self.validated_with(|c| c.softcap = Some(cap))
    }

    /// Llama 4's temperature tuning (see [`AttentionConfig::temperature`]).
    pub fn with_temperature(self, t: TemperatureTuning) -> Result<Self> {
        self.validated_with(|c| c.temperature = Some(t))
    }

    /// ALiBi position biases with `max_bias` (8 in BLOOM, MPT and Falcon): after the scale
    /// (and soft-cap), head h's score of key j for the query at position i′ gains
    /// `slope(h) · (j − i′)` (see [`alibi_slope`]), generated in the shader. Softmax ignores a
    /// constant per row, so this equals BLOOM's `slope · j` and MPT's `−slope · |j − i′|` on the
    /// keys a causal query sees, and keeps the biases of the keys that matter small (exact in
    /// f32 near the query, however long the context).
    pub fn with_alibi(self, max_bias: f32) -> Result<Self> {
        self.validated_with(|c| c.alibi = Some(max_bias))
    }

    /// `add_bias_kv` and `add_zero_attn` as `nn.MultiheadAttention` takes them: keys (and
    /// values) every query sees, appended after the input's own (see [`Self::appended_keys`]).
    pub fn with_appended_keys(mut self, add_bias_kv: bool, add_zero_attn: bool) -> Self {
        self.add_bias_kv = add_bias_kv;
        self.add_zero_attn = add_zero_attn;
        self
    }

    /// Normalises projected queries and keys before RoPE (weights in
    /// [`crate::AttentionWeights::qk_norm`]).
    pub fn with_qk_norm(self, norm: QkNorm) -> Result<Self> {
        self.validated_with(|c| c.qk_norm = Some(norm))
    }

    /// Qwen3-Next's sigmoid output gate (see [`Self::output_gate`]); needs `W_o`.
    pub fn with_output_gate(self) -> Result<Self> {
        self.validated_with(|c| c.output_gate = true)
    }

    /// BitNet's RMSNorm of the combined heads before `W_o` (see [`Self::output_norm`]).
    pub fn with_output_norm(self, eps: f32) -> Result<Self> {
        self.validated_with(|c| c.output_norm = Some(eps))
    }

    /// Clamps the projected q, k and v to `[-limit, limit]` (OLMo's `clip_qkv`).
    pub fn with_clip_qkv(self, limit: f32) -> Result<Self> {
        self.validated_with(|c| c.clip_qkv = Some(limit))
    }

    /// A `KvCache` of this module stores the keys only and reads values from them (see
    /// [`Self::values_from_keys`]; [`crate::AttentionWeights::check`] checks the weights allow it).
    pub fn with_values_from_keys(self) -> Result<Self> {
        self.validated_with(|c| c.values_from_keys = true)
    }

    /// Adds attention sinks (values in [`crate::AttentionWeights::sinks`]).
    pub fn with_sinks(self) -> Result<Self> {
        self.validated_with(|c| c.sinks = true)
    }

    /// Rotary position embeddings (see [`Rope`]).
    pub fn with_rope(self, rope: Rope) -> Result<Self> {
        self.validated_with(|c| c.rope = Some(rope))
    }

    /// How many keys the module appends after the input's: the learned `bias_k` row, then the
    /// zero row, in `nn.MultiheadAttention`'s order. They are never masked.
    pub fn appended_keys(&self) -> usize {
        self.add_bias_kv as usize + self.add_zero_attn as usize
    }

    /// Grouped-query (`kv_heads` < `heads`, dividing it) or multi-query (`kv_heads` = 1)
    /// attention: W_k and W_v project to `kv_heads` heads, each shared by
    /// `heads / kv_heads` query heads.
    pub fn with_kv_heads(self, kv_heads: usize) -> Result<Self> {
        self.validated_with(|c| c.kv_heads = kv_heads)
    }

    /// Query heads per key/value head.
    pub fn kv_group(&self) -> usize {
        self.heads / self.kv_heads.max(1)
    }

    /// Width of projected keys (`kv_heads · qk_head_dim`).
    pub fn k_width(&self) -> usize {
        self.kv_heads * self.qk_head_dim
    }

    /// Width of projected values (`kv_heads · v_head_dim`).
    pub fn kv_v_width(&self) -> usize {
        self.kv_heads * self.v_head_dim
    }

    /// Key and value input widths, as in `nn.MultiheadAttention(kdim=.., vdim=..)`.
    pub fn with_kv_dims(self, key_dim: usize, value_dim: usize) -> Result<Self> {
        self.validated_with(|c| {
            c.key_dim = key_dim;
            c.value_dim = value_dim;
        })
    }

    /// `self` changed by `set`, then checked again: what every checked `with_*` does.
    fn validated_with(mut self, set: impl FnOnce(&mut Self)) -> Result<Self> {
        set(&mut self);
        self.validated()
    }

    /// Checks every number; all constructors go through here.
    pub fn validated(self) -> Result<Self> {
        let named = [
            ("model_dim", self.model_dim),
            ("key_dim", self.key_dim),
            ("value_dim", self.value_dim),
            ("heads", self.heads),
            ("qk_head_dim", self.qk_head_dim),
            ("v_head_dim", self.v_head_dim),
        ];
        for (name, value) in named {
            if value == 0 {
                return Err(Error::Config(format!("{name} is 0; it must be at least 1")));
            }
            // Everything is indexed with u32 on the GPU; keep sizes far from overflow.
            if value > (1 << 20) {
                return Err(Error::Config(format!(
                    "{name} = {value} is larger than 2^20"
                )));
            }
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::Config(format!(
                "kv_heads = {} must divide heads = {} (each key/value head serves a whole group \
                 of query heads)",
                self.kv_heads, self.heads
            )));
        }
        // No device binds more than 4 GiB, so a projection weight past 2^30 floats can never
        // run; refusing it here also keeps `AttentionWeights::random` from huge allocations.
        let weights = [
            ("W_q", self.qk_width(), self.model_dim),
            ("W_k", self.k_width(), self.key_dim),
            ("W_v", self.kv_v_width(), self.value_dim),
            ("W_o", self.model_dim, self.v_width()),
        ];
        for (name, rows, cols) in weights {
            if name == "W_o" && !self.output_projection {
                continue;
            }
            let values = rows as u64 * cols as u64;
            if values > MAX_WEIGHT_VALUES {
                return Err(Error::Config(format!(
                    "{name} would be {rows} × {cols} = {values} values, more than the 2^30 one \
                     storage binding can hold on any device"
                )));
            }
        }
        if let Some(rope) = &self.rope {
            rope.check(self.qk_head_dim)?;
            if self.appended_keys() > 0 {
                return Err(Error::Config(
                    "RoPE with add_bias_kv/add_zero_attn: appended keys have no position".into(),
                ));
            }
        }
        if let Some(c) = self.clip_qkv.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(Error::Config(format!(
                "clip_qkv {c} is not a finite positive number"
            )));
        }
        if self.sinks && self.appended_keys() > 0 {
            return Err(Error::Config(
                "attention sinks with add_bias_kv/add_zero_attn are not available".into(),
            ));
        }
        if self.qk_norm.is_some() && self.appended_keys() > 0 {
            // nn.MultiheadAttention's appended keys never meet a q/k norm in any model.
            return Err(Error::Config(
                "a q/k norm with add_bias_kv/add_zero_attn is not available".into(),
            ));
        }
        if self.values_from_keys
            && (self.qk_head_dim != self.v_head_dim
                || self.key_dim != self.value_dim
                || self.qk_norm.is_some()
                || !self.output_projection)
        {
            return Err(Error::Config(
                "values read from the keys need qk_head_dim = v_head_dim, key_dim = value_dim, an \
                 output projection and no q/k norm"
                    .into(),
            ));
        }
        if let Some(s) = self.scale {
            if !s.is_finite() {
                return Err(Error::Config(format!("scale {s} is not finite")));
            }
        }
        if let Some(m) = self.alibi {
            if !(m.is_finite() && m > 0.0) {
                return Err(Error::Config(format!(
                    "ALiBi max_bias {m} must be finite and positive"
                )));
            }
        }
        if let Some(eps) = self.output_norm {
            if !(eps.is_finite() && eps >= 0.0 && self.output_projection) {
                return Err(Error::Config(format!(
                    "an output norm needs a finite eps ≥ 0 (got {eps}) and an output projection"
                )));
            }
        }
        if self.output_gate && !self.output_projection {
            return Err(Error::Config(
                "an output gate multiplies what W_o projects; this config has no output projection"
                    .into(),
            ));
        }
        if let Some(t) = self.temperature {
            if !(t.floor_scale.is_finite() && t.floor_scale > 0.0 && t.attn_scale.is_finite()) {
                return Err(Error::Config(format!(
                    "temperature tuning floor_scale {} must be finite and positive, attn_scale {} finite",
                    t.floor_scale, t.attn_scale
                )));
            }
        }
        if let Some(c) = self.softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(Error::Config(format!(
                    "soft-cap {c} must be finite and positive"
                )));
            }
        }
        Ok(self)
    }

    /// The score scale actually used.
    pub fn scale(&self) -> f32 {
        self.scale
            .unwrap_or_else(|| (1.0 / (self.qk_head_dim as f64).sqrt()) as f32)
    }

    /// Width of projected queries/keys (`heads · qk_head_dim`).
    pub fn qk_width(&self) -> usize {
        self.heads * self.qk_head_dim
    }

    /// Width of projected values and of the combined heads (`heads · v_head_dim`).
    pub fn v_width(&self) -> usize {
        self.heads * self.v_head_dim
    }

    /// Width of the module's output.
    pub fn output_dim(&self) -> usize {
        if self.output_projection {
            self.model_dim
        } else {
            self.v_width()
        }
    }

    /// Checks input shapes against the config: query `[B, Lq, model_dim]`, key
    /// `[B, Lk, key_dim]`, value `[B, Lk, value_dim]`.
    pub fn check_inputs(&self, query: &[usize], key: &[usize], value: &[usize]) -> Result<()> {
        let rank3 = |name: &str, s: &[usize], width: usize, what: &str| -> Result<()> {
            if s.len() != 3 || s[2] != width {
                return Err(Error::shape(name, format!("[batch, {what}, {width}]"), s));
            }
            Ok(())
        };
        rank3("query", query, self.model_dim, "Lq")?;
        rank3("key", key, self.key_dim, "Lk")?;
        rank3("value", value, self.value_dim, "Lk")?;
        if key[0] != query[0] {
            return Err(Error::shape(
                "key",
                format!("batch {} like the query", query[0]),
                key,
            ));
        }
        if value[0] != query[0] || value[1] != key[1] {
            return Err(Error::shape(
                "value",
                format!(
                    "[{}, {}, {}] (batch and Lk of the key)",
                    query[0], key[1], self.value_dim
                ),
                value,
            ));
        }
        Ok(())
    }

    /// Floating-point operations of one forward (2·M·N·K per matmul).
    pub fn flops(&self, batch: usize, lq: usize, lk: usize) -> f64 {
        let (b, lq, lk) = (batch as f64, lq as f64, lk as f64);
        let h = self.heads as f64;
        let mut f = 2.0 * b * lq * self.model_dim as f64 * self.qk_width() as f64
            + 2.0 * b * lk * self.key_dim as f64 * self.k_width() as f64
            + 2.0 * b * lk * self.value_dim as f64 * self.kv_v_width() as f64
            + 2.0 * b * h * lq * lk * self.qk_head_dim as f64
            + 2.0 * b * h * lq * lk * self.v_head_dim as f64;
        if self.output_projection {
            f += 2.0 * b * lq * self.v_width() as f64 * self.model_dim as f64;
        }
        f
    }
}

/// Head `h`'s ALiBi slope of `heads` heads (BLOOM's `build_alibi_tensor`, llama.cpp's
/// `max_bias`): with p the largest power of two ≤ heads, heads h < p get 2^(−max_bias·(h+1)/p),
/// the others 2^(−max_bias·(2(h−p)+1)/(2p)) (the odd powers of the next power of two's series).
pub fn alibi_slope(h: usize, heads: usize, max_bias: f64) -> f64 {
    let p = 1usize << heads.max(1).ilog2();
    if h < p {
        (-max_bias * (h + 1) as f64 / p as f64).exp2()
    } else {
        (-max_bias * (2 * (h - p) + 1) as f64 / (2 * p) as f64).exp2()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection_weights_are_bounded_by_one_binding() {
        // W_q of 2^10 × 2^20 values is exactly the limit; one more row is past it.
        assert!(AttentionConfig::per_head(1 << 20, 1 << 10, 1, 1).is_ok());
        let err = AttentionConfig::per_head(1 << 20, (1 << 10) + 1, 1, 1).unwrap_err();
        assert!(err.to_string().contains("W_q"), "{err}");
        // The seed shape of the issue: e = q_k = 2^20 would be a 4 TB weight.
        assert!(AttentionConfig::per_head(1 << 20, 1 << 20, 1, 1).is_err());
        // W_o counts only with an output projection.
        assert!(AttentionConfig::classic(1 << 15, 1).is_ok());
        assert!(AttentionConfig::classic((1 << 15) + 1, 1).is_err());
    }
}
