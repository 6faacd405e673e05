//! Normalisation of the projected queries and keys before RoPE (or after it: Hunyuan):
//! per-head RMSNorm (Qwen3, Gemma 3), RMSNorm over the whole projection (OLMo 2) and per-head
//! LayerNorm (StableLM, Cohere; with a bias: Persimmon). The CPU side here (settings, weights, the f64 rule the reference uses); the
//! GPU pass is `kernels::qk_norm`.

use crate::error::{Error, Result};

/// What is subtracted and divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// `x / sqrt(mean(x²) + eps)`.
    Rms,
    /// `(x − mean(x)) / sqrt(var(x) + eps)` (biased variance, as `nn.LayerNorm`).
    Layer,
}

/// Which values are normalised together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormScope {
    /// Each head's `head_dim` values of a token.
    PerHead,
    /// All `heads · head_dim` values of a token's projection (OLMo 2's `q_norm`/`k_norm`).
    Whole,
}

/// q/k normalisation settings; the weights are [`QkNormWeights`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QkNorm {
    /// RMSNorm or LayerNorm.
    pub kind: NormKind,
    /// Per head or over the whole projection.
    pub scope: NormScope,
    /// Added to the mean square (or variance) before the square root.
    pub eps: f32,
    /// Added to every weight: Gemma's RMSNorm multiplies by `1 + w`.
    pub weight_offset: f32,
    /// Applied to the rotated q and k (Hunyuan) instead of before RoPE (every other model).
    pub after_rope: bool,
}

/// The norms' weights, one value per normalised element: `[head_dim]` (one weight shared by
/// every head), or `[heads · head_dim]` (one per head, or OLMo 2's whole projection) — for q
/// over the query heads, for k over the key/value heads.
#[derive(Debug, Clone, PartialEq)]
pub struct QkNormWeights {
    /// The query norm's weight.
    pub q: Vec<f32>,
    /// The key norm's weight.
    pub k: Vec<f32>,
    /// The norms' biases (Persimmon's `nn.LayerNorm`), each as long as its weight; empty:
    /// none.
    pub q_bias: Vec<f32>,
    /// The key norm's bias, as long as `k`; empty: none.
    pub k_bias: Vec<f32>,
}

impl QkNormWeights {
    /// Weights without biases.
    pub fn new(q: Vec<f32>, k: Vec<f32>) -> Self {
        QkNormWeights {
            q,
            k,
            q_bias: Vec::new(),
            k_bias: Vec::new(),
        }
    }
}

impl QkNorm {
    /// RMSNorm of each head with one weight `[head_dim]` (Qwen3; Gemma 3 with offset 1).
    pub fn rms_per_head(eps: f32) -> Self {
        QkNorm {
            kind: NormKind::Rms,
            scope: NormScope::PerHead,
            eps,
            weight_offset: 0.0,
            after_rope: false,
        }
    }

    /// Checks eps, the weights' lengths for `heads` heads of `head_dim` (`what`: q or k), and
    /// that a bias, if any, is as long as its weight.
    pub fn check_with_bias(
        &self,
        what: &str,
        weight: &[f32],
        bias: &[f32],
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        self.check(what, weight, heads, head_dim)?;
        if !bias.is_empty() && bias.len() != weight.len() {
            return Err(Error::weight(
                format!("{what}_norm.bias"),
                format!("has {} values; its weight has {}", bias.len(), weight.len()),
            ));
        }
        Ok(())
    }

    /// Checks eps and the weights' lengths for `heads` heads of `head_dim` (`what`: q or k).
    pub fn check(&self, what: &str, weight: &[f32], heads: usize, head_dim: usize) -> Result<()> {
        if !(self.eps.is_finite() && self.eps >= 0.0 && self.weight_offset.is_finite()) {
            return Err(Error::Config(format!(
                "q/k norm eps {} and weight offset {} must be finite, eps ≥ 0",
                self.eps, self.weight_offset
            )));
        }
        let all = heads * head_dim;
        let ok = match self.scope {
            NormScope::PerHead => weight.len() == head_dim || weight.len() == all,
            NormScope::Whole => weight.len() == all,
        };
        if !ok {
            return Err(Error::weight(
                format!("{what}_norm.weight"),
                format!(
                    "has {} values; a {:?} norm over {heads} heads of {head_dim} takes {}",
                    weight.len(),
                    self.scope,
                    match self.scope {
                        NormScope::PerHead => format!("{head_dim} or {all}"),
                        NormScope::Whole => all.to_string(),
                    }
                ),
            ));
        }
        Ok(())
    }

    /// Normalises one token's projection `x` (`heads · head_dim` values) in place, in f64.
    pub fn apply(&self, x: &mut [f64], weight: &[f32], head_dim: usize) {
        self.apply_with_bias(x, weight, &[], head_dim);
    }

    /// [`Self::apply`], then `+ bias` (indexed as the weight; empty: none).
    pub fn apply_with_bias(&self, x: &mut [f64], weight: &[f32], bias: &[f32], head_dim: usize) {
        let group = match self.scope {
            NormScope::PerHead => head_dim,
            NormScope::Whole => x.len(),
        };
        let wrap = weight.len();
        for (g, values) in x.chunks_mut(group).enumerate() {
            let n = values.len() as f64;
            let mean = match self.kind {
                NormKind::Rms => 0.0,
                NormKind::Layer => values.iter().sum::<f64>() / n,
            };
            let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            let inv = 1.0 / (var + self.eps as f64).sqrt();
            for (e, v) in values.iter_mut().enumerate() {
                let at = (g * group + e) % wrap;
                let w = weight[at] as f64 + self.weight_offset as f64;
                let b = bias.get(at).map_or(0.0, |&b| b as f64);
                *v = (*v - mean) * inv * w + b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_and_layer_norms_follow_their_definitions() {
        let rms = QkNorm::rms_per_head(0.0);
        let mut x = vec![3.0, 4.0, 0.0, 2.0];
        rms.apply(&mut x, &[1.0, 2.0], 2);
        // Head 0: rms 5/√2; head 1: rms √2.
        let r0 = (12.5f64).sqrt();
        let want = [3.0 / r0, 8.0 / r0, 0.0, 2.0 * 2.0 / 2f64.sqrt()];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{x:?}");
        }
        let layer = QkNorm {
            kind: NormKind::Layer,
            scope: NormScope::Whole,
            eps: 0.0,
            weight_offset: 1.0,
            after_rope: false,
        };
        let mut y = vec![1.0, 3.0];
        layer.apply(&mut y, &[0.0, 1.0], 2);
        // mean 2, var 1: (−1, 1) · (1 + w).
        assert_eq!(y, [-1.0, 2.0]);
        // With a bias (Persimmon): + b after the weight.
        let mut z = vec![1.0, 3.0];
        layer.apply_with_bias(&mut z, &[0.0, 1.0], &[0.5, -0.5], 2);
        assert_eq!(z, [-0.5, 1.5]);
        assert!(layer
            .check_with_bias("q", &[0.0; 2], &[0.0; 3], 1, 2)
            .is_err());
        assert!(layer.check("q", &[0.0; 3], 1, 2).is_err());
        assert!(rms.check("k", &[0.0; 4], 2, 2).is_ok());
    }
}
