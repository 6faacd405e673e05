//! Rotary position embeddings (RoPE): each query and key row is rotated, pair by pair, by an
//! angle `position · inv_freq[k]` before attention. The frequencies (with `linear`, `llama3` or `yarn`
//! scaling) and the cos/sin of every angle are computed here in f64 — the shader only applies
//! the rotation — so the f32 answer does not carry f32 trigonometry of large angles.

use crate::error::{Error, Result};

/// How a module's rotary embedding is set up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// The base θ of the frequencies (`rope_theta`).
    pub theta: f64,
    /// Leading dimensions of each head that rotate (even; the rest pass through), e.g.
    /// `head_dim · partial_rotary_factor`.
    pub rotary_dims: usize,
    /// `false`: rotate-half pairs (d, d + rotary_dims/2), as Llama and GPT-NeoX in transformers;
    /// `true`: interleaved pairs (2k, 2k + 1), as GPT-J.
    pub interleaved: bool,
    pub scaling: RopeScaling,
}

/// `rope_scaling` / `rope_parameters` types.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// `default`.
    None,
    /// `linear`: positions divided by `factor`.
    Linear { factor: f64 },
    /// `llama3`: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_positions: f64,
    },
    /// `yarn`: frequencies blended between interpolated (÷ `factor`) and extrapolated by a
    /// linear ramp over the dimensions whose rotations in `original_max_positions` lie between
    /// `beta_slow` and `beta_fast`; cos and sin scaled by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_positions: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        /// Correction range bounds floored/ceiled (transformers' `truncate`, default true).
        truncate: bool,
    },
}

impl Rope {
    /// Plain RoPE over the first `rotary_dims` dimensions.
    pub fn new(theta: f64, rotary_dims: usize) -> Self {
        Rope {
            theta,
            rotary_dims,
            interleaved: false,
            scaling: RopeScaling::None,
        }
    }

    /// Checks the settings against a head of `head_dim`.
    pub fn check(&self, head_dim: usize) -> Result<()> {
        if self.rotary_dims < 2
            || !self.rotary_dims.is_multiple_of(2)
            || self.rotary_dims > head_dim
        {
            return Err(Error::Config(format!(
                "RoPE rotary_dims = {} must be even, at least 2 and at most the head size {head_dim}",
                self.rotary_dims
            )));
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let scaling_ok = match self.scaling {
            RopeScaling::None => true,
            RopeScaling::Linear { factor } => positive(factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_positions,
            } => {
                [
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_positions,
                ]
                .into_iter()
                .all(positive)
                    && high_freq_factor > low_freq_factor
            }
            RopeScaling::Yarn {
                factor,
                original_max_positions,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate: _,
            } => [
                factor,
                original_max_positions,
                beta_fast,
                beta_slow,
                attention_factor,
            ]
            .into_iter()
            .all(positive),
        };
        if !positive(self.theta) || !scaling_ok {
            return Err(Error::Config(format!(
                "RoPE settings {self:?} are not all finite and positive (llama3 needs \
                 high_freq_factor > low_freq_factor)"
            )));
        }
        Ok(())
    }

    /// The `rotary_dims / 2` frequencies, scaled as transformers' rope initialisers do.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.rotary_dims as f64;
        let base = (0..self.rotary_dims / 2).map(|k| 1.0 / self.theta.powf(2.0 * k as f64 / d));
        match self.scaling {
            RopeScaling::None => base.collect(),
            RopeScaling::Linear { factor } => base.map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_positions,
            } => base
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let (low_wavelen, high_wavelen) = (
                        original_max_positions / low_freq_factor,
                        original_max_positions / high_freq_factor,
                    );
                    if wavelen > low_wavelen {
                        f / factor
                    } else if wavelen < high_wavelen {
                        f
                    } else {
                        let smooth = (original_max_positions / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect(),
            RopeScaling::Yarn {
                factor,
                original_max_positions,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                // transformers' _compute_yarn_parameters: the dimension whose frequency turns
                // `rotations` times over the original context.
                let correction = |rotations: f64| {
                    d * (original_max_positions / (rotations * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001; // transformers' guard against a zero-width ramp
                }
                base.enumerate()
                    .map(|(k, f)| {
                        let ramp = ((k as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolated = 1.0 - ramp;
                        f / factor * (1.0 - extrapolated) + f * extrapolated
                    })
                    .collect()
            }
        }
    }

    /// What cos and sin are multiplied by (yarn's `attention_factor`; 1 otherwise).
    pub fn cos_sin_scale(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// `(cos, sin)` of every angle of `positions`, as the shader reads them:
    /// `[positions.len(), rotary_dims / 2, 2]`, computed in f64.
    pub fn table(&self, positions: &[usize]) -> Vec<f32> {
        let (inv_freq, scale) = (self.inv_freq(), self.cos_sin_scale());
        let mut table = Vec::with_capacity(positions.len() * inv_freq.len() * 2);
        for &p in positions {
            for f in &inv_freq {
                let angle = p as f64 * f;
                table.push((angle.cos() * scale) as f32);
                table.push((angle.sin() * scale) as f32);
            }
        }
        table
    }

    /// The index pairs `(a, b)` that rotate together within a head (`x_a' = x_a·cos − x_b·sin`,
    /// `x_b' = x_b·cos + x_a·sin`), one per frequency.
    pub fn pair(&self, k: usize) -> (usize, usize) {
        match self.interleaved {
            false => (k, k + self.rotary_dims / 2),
            true => (2 * k, 2 * k + 1),
        }
    }

    /// Rotates one head row `x` (f64, the reference's) to `position`.
    pub fn rotate(&self, x: &mut [f64], position: usize) {
        let scale = self.cos_sin_scale();
        for (k, f) in self.inv_freq().into_iter().enumerate() {
            let angle = position as f64 * f;
            let (c, s) = (angle.cos() * scale, angle.sin() * scale);
            let (a, b) = self.pair(k);
            let (xa, xb) = (x[a], x[b]);
            x[a] = xa * c - xb * s;
            x[b] = xb * c + xa * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequencies_follow_theta_and_scaling() {
        let plain = Rope::new(10_000.0, 8);
        let f = plain.inv_freq();
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 10_000f64.powf(-0.25)).abs() < 1e-15);
        let linear = Rope {
            scaling: RopeScaling::Linear { factor: 4.0 },
            ..plain
        };
        assert_eq!(linear.inv_freq()[1], f[1] / 4.0);
        // llama3 with a short original context: the longest wavelengths are divided by the
        // factor, the shortest kept.
        let llama3 = Rope {
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_positions: 64.0,
            },
            ..Rope::new(10_000.0, 16)
        };
        let (base, scaled) = (Rope::new(10_000.0, 16).inv_freq(), llama3.inv_freq());
        assert_eq!(scaled[0], base[0]); // wavelength 2π < 64/4
        assert_eq!(scaled[7], base[7] / 8.0); // wavelength ≈ 2π·3162 > 64
        assert!(scaled[2] < base[2] && scaled[2] > base[2] / 8.0, "blended"); // 2π·10 ∈ [16, 64]
    }

    #[test]
    fn rotation_is_a_rotation_of_each_pair() {
        let rope = Rope::new(10_000.0, 4);
        let mut x = [1.0, 0.0, 0.0, 0.0, 7.0];
        rope.rotate(&mut x, 1);
        // Pair (0, 2) at frequency 1: (cos 1, sin 1); the unrotated tail is untouched.
        assert!((x[0] - 1f64.cos()).abs() < 1e-15 && (x[2] - 1f64.sin()).abs() < 1e-15);
        assert_eq!(x[4], 7.0);
        let table = rope.table(&[0, 3]);
        assert_eq!(&table[..4], &[1.0, 0.0, 1.0, 0.0]);
        assert_eq!(table[4], 3f64.cos() as f32);
        let interleaved = Rope {
            interleaved: true,
            ..rope
        };
        assert_eq!(interleaved.pair(1), (2, 3));
        assert!(Rope::new(10_000.0, 6).check(4).is_err());
        assert!(Rope::new(10_000.0, 3).check(4).is_err());
        assert!(Rope::new(0.0, 4).check(4).is_err());
    }
}
