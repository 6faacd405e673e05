//! Rotary position embeddings (RoPE): each query and key row is rotated, pair by pair, by an
//! angle `position · inv_freq[k]` before attention. The frequencies (with `linear`, `llama3`,
//! `yarn`, `dynamic` or `longrope` scaling) and the cos/sin of every angle are computed here in
//! f64 — the shader only applies the rotation — so the f32 answer does not carry f32
//! trigonometry of large angles.
//!
//! `dynamic` and `longrope` frequencies depend on the sequence length a call sees: as
//! transformers' `dynamic_rope_update`, the longest position of the call (every sequence of
//! the batch) + 1, passed as `seq_len`.

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
    /// How the frequencies are scaled (`rope_scaling`); [`RopeScaling::None`] for plain RoPE.
    pub scaling: RopeScaling,
}

/// `rope_scaling` / `rope_parameters` types.
// longrope's factor lists are inline (1 KiB) so that a Rope, and the AttentionConfig holding
// it, stay Copy.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// `default`.
    None,
    /// `linear`: positions divided by `factor`.
    Linear {
        /// What the frequencies are divided by (the same as dividing the positions).
        factor: f64,
    },
    /// `llama3`: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 {
        /// What the long wavelengths are divided by.
        factor: f64,
        /// Wavelengths longer than `original_max_positions / low_freq_factor` are divided by
        /// `factor`.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original_max_positions / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length before scaling (`original_max_position_embeddings`).
        original_max_positions: f64,
    },
    /// `yarn`: frequencies blended between interpolated (÷ `factor`) and extrapolated by a
    /// linear ramp over the dimensions whose rotations in `original_max_positions` lie between
    /// `beta_slow` and `beta_fast`; cos and sin scaled by `attention_factor`.
    Yarn {
        /// What the interpolated frequencies are divided by.
        factor: f64,
        /// The context length before scaling (`original_max_position_embeddings`).
        original_max_positions: f64,
        /// Where the ramp starts: dimensions that turn more than this many times in
        /// `original_max_positions` keep their frequency.
        beta_fast: f64,
        /// Where the ramp ends: dimensions that turn fewer than this many times in
        /// `original_max_positions` are divided by `factor`.
        beta_slow: f64,
        /// What cos and sin are multiplied by.
        attention_factor: f64,
        /// Correction range bounds floored/ceiled (transformers' `truncate`, default true).
        truncate: bool,
    },
    /// `dynamic` (dynamic NTK): for a call whose `seq_len` exceeds `max_positions`
    /// (`max_position_embeddings`), θ becomes θ·(factor·seq_len/max − (factor − 1))^(d/(d−2));
    /// shorter calls keep the plain frequencies.
    Dynamic {
        /// The `factor` of the formula above.
        factor: f64,
        /// `max_position_embeddings`: calls up to this `seq_len` keep the plain frequencies.
        max_positions: f64,
    },
    /// `longrope` (Phi-3): frequency k divided by its short factor, or by its long one for a
    /// call whose `seq_len` exceeds `original_max_positions`; cos and sin scaled by
    /// `attention_factor`.
    LongRope {
        /// The short and long factor of each rotating pair.
        factors: Factors,
        /// `original_max_position_embeddings`: calls whose `seq_len` exceeds it use the long
        /// factors.
        original_max_positions: f64,
        /// What cos and sin are multiplied by.
        attention_factor: f64,
    },
}

/// `longrope`'s short and long factor lists (one per rotating pair each), as one slice: the
/// short, then the long. Interned (one leaked copy per distinct pair of lists in the process)
/// so that a [`Rope`], and the `AttentionConfig` holding it, stay small and `Copy`. Stored as
/// f32: transformers makes them a float32 tensor before dividing.
#[derive(Clone, Copy, PartialEq)]
pub struct Factors(&'static [f32]);

impl Factors {
    /// `None` when the lists differ in length.
    pub fn new(short: &[f64], long: &[f64]) -> Option<Self> {
        static INTERNED: std::sync::Mutex<Vec<&'static [f32]>> = std::sync::Mutex::new(Vec::new());
        if short.len() != long.len() {
            return None;
        }
        let values: Vec<f32> = short.iter().chain(long).map(|&v| v as f32).collect();
        let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&known) = interned.iter().find(|&&k| k == values.as_slice()) {
            return Some(Factors(known));
        }
        let leaked: &'static [f32] = Box::leak(values.into_boxed_slice());
        interned.push(leaked);
        Some(Factors(leaked))
    }

    /// The short factors, one per rotating pair.
    pub fn short(&self) -> &[f32] {
        &self.0[..self.0.len() / 2]
    }

    /// The long factors, one per rotating pair.
    pub fn long(&self) -> &[f32] {
        &self.0[self.0.len() / 2..]
    }
}

impl std::fmt::Debug for Factors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "short {:?} long {:?}", self.short(), self.long())
    }
}

/// The sequence length transformers' `dynamic_rope_update` sees for a call at `positions`:
/// the longest position + 1 (0 for none).
pub fn seq_len(positions: &[usize]) -> usize {
    positions.iter().max().map_or(0, |p| p + 1)
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
            // d/(d − 2) needs more than one pair.
            RopeScaling::Dynamic {
                factor,
                max_positions,
            } => positive(factor) && positive(max_positions) && self.rotary_dims > 2,
            RopeScaling::LongRope {
                factors,
                original_max_positions,
                attention_factor,
            } => {
                let pairs = self.rotary_dims / 2;
                if factors.short().len() != pairs {
                    return Err(Error::Config(format!(
                        "longrope short_factor and long_factor hold {} values each; the {} \
                         rotating dimensions need one per pair, {pairs}",
                        factors.short().len(),
                        self.rotary_dims
                    )));
                }
                [original_max_positions, attention_factor]
                    .into_iter()
                    .chain(factors.0.iter().map(|&f| f as f64))
                    .all(positive)
            }
        };
        if !positive(self.theta) || !scaling_ok {
            return Err(Error::Config(format!(
                "RoPE settings {self:?} are not all finite and positive (llama3 needs \
                 high_freq_factor > low_freq_factor, dynamic more than 2 rotating dimensions)"
            )));
        }
        Ok(())
    }

    /// The `rotary_dims / 2` frequencies as transformers' rope initialisers make them (for
    /// `dynamic` and `longrope`: those of a short call).
    pub fn inv_freq(&self) -> Vec<f64> {
        self.inv_freq_at(0)
    }

    /// The frequencies of a call whose longest position is `seq_len − 1` (see [`seq_len`]).
    pub fn inv_freq_at(&self, seq_len: usize) -> Vec<f64> {
        let d = self.rotary_dims as f64;
        let theta = match self.scaling {
            RopeScaling::Dynamic {
                factor,
                max_positions,
            } if seq_len as f64 > max_positions => {
                self.theta
                    * (factor * seq_len as f64 / max_positions - (factor - 1.0)).powf(d / (d - 2.0))
            }
            _ => self.theta,
        };
        let base = (0..self.rotary_dims / 2).map(move |k| 1.0 / theta.powf(2.0 * k as f64 / d));
        match self.scaling {
            RopeScaling::None | RopeScaling::Dynamic { .. } => base.collect(),
            RopeScaling::LongRope {
                factors,
                original_max_positions,
                ..
            } => {
                let ext = match seq_len as f64 > original_max_positions {
                    true => factors.long(),
                    false => factors.short(),
                };
                base.zip(ext).map(|(f, &e)| f / e as f64).collect()
            }
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

    /// Whether a `KvCache` step over positions below `seq_len` computes what transformers'
    /// cached decoding does. `longrope` does: transformers picks the factors by each call's
    /// longest position and keeps cached keys as they were rotated, as the cache does.
    /// `dynamic` past `max_position_embeddings` does not: transformers' rotary module keeps the
    /// longest sequence it has ever seen (across calls and caches) and rotates by it, so the
    /// step is refused rather than answered differently.
    pub fn check_cached_step(&self, seq_len: usize) -> Result<()> {
        match self.scaling {
            RopeScaling::Dynamic {
                factor,
                max_positions,
            } if seq_len as f64 > max_positions => Err(Error::UnsupportedModule {
                module: format!(
                    "RoPE `dynamic` (factor {factor}, max_position_embeddings {max_positions})"
                ),
                what: format!("a KvCache step at position {}", seq_len - 1),
                why: "past max_position_embeddings transformers recomputes the frequencies from \
                      the longest sequence its rotary module has seen in any call, and the keys \
                      already cached keep their earlier rotation; a full forward runs, as a \
                      freshly loaded module computes it"
                    .into(),
            }),
            _ => Ok(()),
        }
    }

    /// What cos and sin are multiplied by (yarn's and longrope's `attention_factor`; 1
    /// otherwise).
    pub fn cos_sin_scale(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            }
            | RopeScaling::LongRope {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// `(cos, sin)` of every angle of `positions`, as the shader reads them:
    /// `[positions.len(), rotary_dims / 2, 2]`, computed in f64, for a call of `seq_len`.
    pub fn table(&self, positions: &[usize], seq_len: usize) -> Vec<f32> {
        let (inv_freq, scale) = (self.inv_freq_at(seq_len), self.cos_sin_scale());
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

    /// Rotates one head row `x` (f64, the reference's) to `position`, in a call of `seq_len`.
    pub fn rotate(&self, x: &mut [f64], position: usize, seq_len: usize) {
        let scale = self.cos_sin_scale();
        for (k, f) in self.inv_freq_at(seq_len).into_iter().enumerate() {
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
    fn dynamic_and_longrope_follow_the_calls_length() {
        let plain = Rope::new(10_000.0, 8);
        let dynamic = Rope {
            scaling: RopeScaling::Dynamic {
                factor: 2.0,
                max_positions: 4.0,
            },
            ..plain
        };
        // Up to max_position_embeddings: the plain frequencies.
        assert_eq!(dynamic.inv_freq_at(4), plain.inv_freq());
        // 7 > 4: θ·(2·7/4 − 1)^(8/6).
        let theta = 10_000.0 * 2.5f64.powf(8.0 / 6.0);
        let f = dynamic.inv_freq_at(7);
        assert!((f[1] - theta.powf(-0.25)).abs() < 1e-15 && f[0] == 1.0);
        assert!(dynamic.check_cached_step(4).is_ok());
        assert!(matches!(
            dynamic.check_cached_step(5),
            Err(Error::UnsupportedModule { what, .. }) if what.contains("position 4")
        ));
        let longrope = Rope {
            scaling: RopeScaling::LongRope {
                factors: Factors::new(&[1.0, 2.0, 1.0, 1.0], &[4.0, 4.0, 4.0, 8.0])
                    .expect("equal lengths"),
                original_max_positions: 4.0,
                attention_factor: 1.5,
            },
            ..plain
        };
        let base = plain.inv_freq();
        assert_eq!(longrope.inv_freq_at(4)[1], base[1] / 2.0);
        assert_eq!(longrope.inv_freq_at(5)[3], base[3] / 8.0);
        assert!(longrope.check_cached_step(100).is_ok());
        assert_eq!(longrope.table(&[0], 5)[0], 1.5);
        assert!(Rope {
            rotary_dims: 6,
            ..longrope
        }
        .check(8)
        .is_err());
    }

    #[test]
    fn rotation_is_a_rotation_of_each_pair() {
        let rope = Rope::new(10_000.0, 4);
        let mut x = [1.0, 0.0, 0.0, 0.0, 7.0];
        rope.rotate(&mut x, 1, 2);
        // Pair (0, 2) at frequency 1: (cos 1, sin 1); the unrotated tail is untouched.
        assert!((x[0] - 1f64.cos()).abs() < 1e-15 && (x[2] - 1f64.sin()).abs() < 1e-15);
        assert_eq!(x[4], 7.0);
        let table = rope.table(&[0, 3], 4);
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
