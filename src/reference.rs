//! The CPU reference: the seeds' math in f64, written plainly (no tiling, no fusion), so the GPU
//! passes have something independent to be checked against.

use crate::error::Result;
use crate::model::config::{alibi_slope, AttentionConfig, TemperatureTuning};
use crate::model::mask::{broadcast_index, Mask, MASKED_SCORE};
use crate::model::tensor::Tensor;
use crate::model::weights::{AttentionWeights, Linear};

/// The reference result: output `[B, Lq, out]` and probabilities `[B, H, Lq, Lk]`, in f64.
#[derive(Debug, Clone)]
pub struct ReferenceOutput {
    /// The output's shape, `[B, Lq, out]`.
    pub shape: Vec<usize>,
    /// The output, row-major in `shape`.
    pub output: Vec<f64>,
    /// The attention probabilities `[B, H, Lq, Lk]`, row-major (`Lk` counts appended keys).
    pub probs: Vec<f64>,
}

impl ReferenceOutput {
    /// The output rounded to f32.
    pub fn output_f32(&self) -> Vec<f32> {
        self.output.iter().map(|&v| v as f32).collect()
    }
    /// The largest |value| of the output (0 when empty).
    pub fn max_abs(&self) -> f64 {
        self.output.iter().fold(0.0, |m, v| m.max(v.abs()))
    }
}

/// Full forward of either seed module. Inputs are `[B, L, width]`; validation is the GPU
/// module's job, this function assumes consistent shapes (it is checked by `forward`). A
/// module with RoPE rotates keys at positions `0..Lk` and queries at the last `Lq` of them.
pub fn forward(
    config: &AttentionConfig,
    weights: &AttentionWeights,
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    mask: &Mask,
) -> Result<ReferenceOutput> {
    forward_at(config, weights, query, key, value, mask, None)
}

/// [`forward`] with the keys' RoPE positions (`[B, Lk]` row-major; the queries take the last
/// `Lq` of them), as [`crate::ForwardOptions::positions`].
pub fn forward_at(
    config: &AttentionConfig,
    weights: &AttentionWeights,
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    mask: &Mask,
    positions: Option<&[usize]>,
) -> Result<ReferenceOutput> {
    config.check_inputs(query.shape(), key.shape(), value.shape())?;
    let (b, lq, lk_in) = (query.shape()[0], query.shape()[1], key.shape()[1]);
    let (h, dk, dv) = (config.heads, config.qk_head_dim, config.v_head_dim);
    let dims = crate::model::mask::AttnDims {
        batch: b,
        heads: h,
        lq,
        lk: lk_in,
    };
    mask.check(dims)?; // same validation as the GPU path
                       // Keys nn.MultiheadAttention appends (bias_k, a zero key) are seen by every query.
    let mask = &mask.with_appended_keys(config.appended_keys(), dims)?;
    let lk = lk_in + config.appended_keys();
    let (k_rows, v_rows) = weights.appended_kv(config);
    let mut q = linear(&widen(query.data()), b * lq, &weights.q); // [B, Lq, H·dk]
    let mut k = linear(&widen(key.data()), b * lk_in, &weights.k); // [B, Lk_in, H_kv·dk]
                                                                   // OLMo's clip_qkv: the projections clamped before anything else.
    let clip = |x: &mut Vec<f64>| {
        if let Some(c) = config.clip_qkv {
            x.iter_mut()
                .for_each(|v| *v = v.clamp(-(c as f64), c as f64));
        }
    };
    clip(&mut q);
    clip(&mut k);
    // Q, K = q_norm(Q), k_norm(K): each token's projection, before RoPE (or after it).
    let norms = |q: &mut Vec<f64>, k: &mut Vec<f64>| {
        if let (Some(norm), Some(w)) = (&config.qk_norm, &weights.qk_norm) {
            for x in q.chunks_mut(h * dk) {
                norm.apply_with_bias(x, &w.q, &w.q_bias, dk);
            }
            for x in k.chunks_mut(config.kv_heads * dk) {
                norm.apply_with_bias(x, &w.k, &w.k_bias, dk);
            }
        }
    };
    let after_rope = config.qk_norm.is_some_and(|n| n.after_rope);
    if !after_rope {
        norms(&mut q, &mut k);
    }
    if let Some(rope) = &config.rope {
        // Rotate every head row of Q and K by its position.
        let default: Vec<usize> = (0..b).flat_map(|_| 0..lk_in).collect();
        let pos = positions.unwrap_or(&default);
        let seq_len = crate::model::rope::seq_len(pos);
        for (row, x) in q.chunks_mut(h * dk).enumerate() {
            let (bi, i) = (row / lq, row % lq);
            for head in x.chunks_mut(dk) {
                rope.rotate(head, pos[bi * lk_in + lk_in - lq + i], seq_len);
            }
        }
        for (row, x) in k.chunks_mut(config.kv_heads * dk).enumerate() {
            for head in x.chunks_mut(dk) {
                rope.rotate(head, pos[row], seq_len);
            }
        }
    }
    if after_rope {
        norms(&mut q, &mut k);
    }
    let mut v = linear(&widen(value.data()), b * lk_in, &weights.v); // [B, Lk_in, H_kv·dv]
    clip(&mut v);
    let k = append_rows(&k, b, &k_rows); // [B, Lk, H_kv·dk]
    let v = append_rows(&v, b, &v_rows); // [B, Lk, H_kv·dv]
    let core = Core {
        batch: b,
        heads: h,
        kv_heads: config.kv_heads,
        lq,
        lk,
        dk,
        dv,
        scale: config.scale() as f64,
        softcap: config.softcap,
        alibi_max_bias: config.alibi,
        temperature: config.temperature,
        sinks: weights.sinks.as_deref(),
        mask,
        top_left: false,
    };
    let (mut combined, probs) = core.run(&q, &k, &v);
    // BitNet: combined = rms_norm(combined) · w, each token's H·dv values.
    if let (Some(eps), Some(w)) = (config.output_norm, &weights.output_norm) {
        let norm = crate::model::qk_norm::QkNorm {
            kind: crate::model::qk_norm::NormKind::Rms,
            scope: crate::model::qk_norm::NormScope::PerHead,
            eps,
            weight_offset: 0.0,
            after_rope: false,
        };
        for x in combined.chunks_mut(h * dv) {
            norm.apply(x, w, h * dv);
        }
    }
    // Qwen3-Next: combined ·= sigmoid(W_g(query)).
    if let Some(gate) = weights.gate.as_ref().filter(|_| config.output_gate) {
        let g = linear(&widen(query.data()), b * lq, gate);
        for (x, g) in combined.iter_mut().zip(&g) {
            *x /= 1.0 + (-g).exp();
        }
    }
    let output = match &weights.o {
        Some(o) => linear(&combined, b * lq, o),
        None => combined,
    };
    Ok(ReferenceOutput {
        shape: vec![b, lq, config.output_dim()],
        output,
        probs,
    })
}

/// One attention core in f64: `softmax(mask(cap(scale·q·kᵀ) + alibi), sinks)·v` per (batch,
/// query head), what [`crate::scaled_dot_product_attention`] computes. Tensors are in the
/// combined-heads layouts: q `[B, Lq, H·dk]`, k `[B, Lk, H_kv·dk]`, v `[B, Lk, H_kv·dv]`; query
/// head `h` reads key/value head `h / (H / H_kv)`.
pub struct Core<'a> {
    /// Batch size `B`.
    pub batch: usize,
    /// Query heads `H`.
    pub heads: usize,
    /// Key/value heads `H_kv` (divides `H`).
    pub kv_heads: usize,
    /// Queries per sequence `Lq`.
    pub lq: usize,
    /// Keys per sequence `Lk`.
    pub lk: usize,
    /// Per-head width of queries and keys.
    pub dk: usize,
    /// Per-head width of values.
    pub dv: usize,
    /// What each `q·k` is multiplied by.
    pub scale: f64,
    /// Gemma 2's soft-cap `c`: a scaled score `s` becomes `c · tanh(s / c)`, before the mask.
    pub softcap: Option<f32>,
    /// ALiBi's `max_bias` (see [`alibi_slope`]); `None`: no ALiBi.
    pub alibi_max_bias: Option<f32>,
    /// Llama 4's temperature tuning: the scaled score of the query at position p times its
    /// factor (an f32, as transformers computes it).
    pub temperature: Option<TemperatureTuning>,
    /// One logit per query head, in each softmax's denominator only.
    pub sinks: Option<&'a [f32]>,
    /// The mask applied to the scores, over `[B, H, Lq, Lk]`.
    pub mask: &'a Mask,
    /// The causal diagonal through key 0 of query 0 (PyTorch's `is_causal`), instead of
    /// through key `Lk − Lq` of it.
    pub top_left: bool,
}

impl Core<'_> {
    /// `(combined [B, Lq, H·dv], probs [B, H, Lq, Lk])`.
    pub fn run(&self, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let Core {
            batch: b,
            heads: h,
            kv_heads: kv_h,
            lq,
            lk,
            dk,
            dv,
            ..
        } = *self;
        let group = h / kv_h.max(1);
        // The rows the causal rules are aligned by: Lq, or Lk to put the diagonal through 0.
        let diagonal_rows = if self.top_left { lk } else { lq };
        // Gemma 2: c·tanh(s / c) of the scaled score, before the mask.
        let cap = |s: f64| match self.softcap {
            Some(c) => c as f64 * (s / c as f64).tanh(),
            None => s,
        };
        let mut probs = vec![0.0f64; b * h * lq * lk];
        let mut combined = vec![0.0f64; b * lq * h * dv];
        let mut row = vec![0.0f64; lk];
        for bi in 0..b {
            for hi in 0..h {
                for i in 0..lq {
                    let tuned = self.temperature.map_or(1.0, |t| {
                        t.factor((i + lk).saturating_sub(diagonal_rows)) as f64
                    });
                    for (j, s) in row.iter_mut().enumerate() {
                        let mut dot = 0.0;
                        for d in 0..dk {
                            dot += q[(bi * lq + i) * h * dk + hi * dk + d]
                                * k[(bi * lk + j) * kv_h * dk + (hi / group) * dk + d];
                        }
                        let alibi = self.alibi_max_bias.map_or(0.0, |m| {
                            let position = i as f64 + lk as f64 - diagonal_rows as f64;
                            alibi_slope(hi, h, m as f64) * (j as f64 - position)
                        });
                        let at = (bi, hi, i, j);
                        *s = mask_score(
                            self.mask,
                            cap(dot * self.scale * tuned) + alibi,
                            diagonal_rows,
                            lk,
                            at,
                        );
                    }
                    // A sink joins the denominator only: a key of value zero every query sees.
                    let sink = self.sinks.map(|s| s[hi] as f64);
                    let max = row
                        .iter()
                        .cloned()
                        .chain(sink)
                        .fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = row
                        .iter()
                        .chain(sink.as_ref())
                        .map(|s| (s - max).exp())
                        .sum();
                    let p = &mut probs[((bi * h + hi) * lq + i) * lk..][..lk];
                    for (pj, s) in p.iter_mut().zip(&row) {
                        *pj = (s - max).exp() / sum;
                    }
                    for d in 0..dv {
                        let mut acc = 0.0;
                        for (j, pj) in p.iter().enumerate() {
                            acc += pj * v[(bi * lk + j) * kv_h * dv + (hi / group) * dv + d];
                        }
                        combined[(bi * lq + i) * h * dv + hi * dv + d] = acc;
                    }
                }
            }
        }
        (combined, probs)
    }
}

/// Each of the `batch` equal blocks of `x`, followed by `rows`.
fn append_rows(x: &[f64], batch: usize, rows: &[f32]) -> Vec<f64> {
    let block = x.len() / batch.max(1);
    (0..batch)
        .flat_map(|bi| {
            let own = x[bi * block..(bi + 1) * block].iter().copied();
            own.chain(rows.iter().map(|&r| r as f64))
        })
        .collect()
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// `y[m, n] = Σ_k x[m, k]·W[n, k] + b[n]` in f64.
pub fn linear(x: &[f64], rows: usize, layer: &Linear) -> Vec<f64> {
    let (n_out, n_in) = (layer.out_features, layer.in_features);
    let mut y = vec![0.0f64; rows * n_out];
    for m in 0..rows {
        for n in 0..n_out {
            let mut acc = layer.bias.as_ref().map_or(0.0, |b| b[n] as f64);
            for k in 0..n_in {
                acc += x[m * n_in + k] * layer.weight[n * n_in + k] as f64;
            }
            y[m * n_out + n] = acc;
        }
    }
    y
}

/// The seeds' masking rule for one score: a hidden score is replaced by −1e9, a bias is added.
/// The biased score is rounded to f32, as PyTorch (and the engine) add an f32 mask to f32
/// scores: next to a bias of about 1e8 times the scores' spread or more (−1e10, and on to
/// `torch.finfo(float32).min`) their differences vanish in the rounding, so such a row is
/// uniform, where f64 addition keeps them up to a bias of about 1e16 times the spread; a sum
/// past −f32::MAX is −inf, as in f32. For ordinary values the rounding moves a score by at most
/// 6e-8 of itself.
fn mask_score(
    mask: &Mask,
    score: f64,
    lq: usize,
    lk: usize,
    at: (usize, usize, usize, usize),
) -> f64 {
    match mask {
        Mask::Bias(t) => {
            let biased = score + t.data()[broadcast_index(t.shape(), at)] as f64;
            biased as f32 as f64
        }
        _ if mask.hides(at, lq, lk) => MASKED_SCORE as f64,
        _ => score,
    }
}
