//! Host-side weights in PyTorch layout (`weight [out_features, in_features]`, row-major).

use crate::error::{Error, Result};
use crate::model::config::AttentionConfig;
use crate::model::qk_norm::QkNormWeights;

/// One `nn.Linear`: `y = x · Wᵀ + b`.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    /// Width of `y`.
    pub out_features: usize,
    /// Width of `x`.
    pub in_features: usize,
    /// `[out_features, in_features]`, row-major.
    pub weight: Vec<f32>,
    /// `[out_features]`, or `None` for `bias=False`.
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    /// PyTorch's default init: weight and bias uniform in `±1/sqrt(in_features)`.
    pub fn random(
        out_features: usize,
        in_features: usize,
        bias: bool,
        rng: &mut SplitMix64,
    ) -> Self {
        let bound = 1.0 / (in_features as f32).sqrt();
        let weight = (0..out_features * in_features)
            .map(|_| rng.uniform(-bound, bound))
            .collect();
        let bias = bias.then(|| {
            (0..out_features)
                .map(|_| rng.uniform(-bound, bound))
                .collect()
        });
        Linear {
            out_features,
            in_features,
            weight,
            bias,
        }
    }

    /// Checks sizes; `name` is the state-dict prefix used in messages (`W_q`).
    pub fn check(
        &self,
        name: &str,
        out_features: usize,
        in_features: usize,
        bias: bool,
    ) -> Result<()> {
        if self.out_features != out_features || self.in_features != in_features {
            return Err(Error::weight(
                format!("{name}.weight"),
                format!(
                    "shape [{}, {}], expected [{out_features}, {in_features}]",
                    self.out_features, self.in_features
                ),
            ));
        }
        if self.weight.len() != out_features * in_features {
            return Err(Error::weight(
                format!("{name}.weight"),
                format!(
                    "has {} values, expected {}",
                    self.weight.len(),
                    out_features * in_features
                ),
            ));
        }
        match (&self.bias, bias) {
            (Some(b), true) if b.len() != out_features => Err(Error::weight(
                format!("{name}.bias"),
                format!("has {} values, expected {out_features}", b.len()),
            )),
            (None, true) => Err(Error::weight(
                format!("{name}.bias"),
                "is missing, but the config has bias on",
            )),
            (Some(_), false) => Err(Error::weight(
                format!("{name}.bias"),
                "is present, but the config has bias off",
            )),
            _ => Ok(()),
        }
    }
}

/// The projections of one attention module.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionWeights {
    /// `heads·qk_head_dim × model_dim`
    pub q: Linear,
    /// `kv_heads·qk_head_dim × key_dim`
    pub k: Linear,
    /// `kv_heads·v_head_dim × value_dim`
    pub v: Linear,
    /// `model_dim × heads·v_head_dim`, when the config has an output projection.
    pub o: Option<Linear>,
    /// `nn.MultiheadAttention`'s `bias_k`, `bias_v`, when the config has `add_bias_kv`.
    pub bias_kv: Option<BiasKv>,
    /// The q/k norms' weights, when the config has `qk_norm`.
    pub qk_norm: Option<QkNormWeights>,
    /// One sink logit per query head, when the config has `sinks`.
    pub sinks: Option<Vec<f32>>,
    /// `heads·v_head_dim × model_dim`: the output gate's projection of the query input, when
    /// the config has `output_gate`.
    pub gate: Option<Linear>,
    /// `[heads·v_head_dim]`: the output norm's weights, when the config has `output_norm`.
    pub output_norm: Option<Vec<f32>>,
}

/// The learned key and value of `nn.MultiheadAttention(add_bias_kv=True)`, in projected space:
/// head `h` owns elements `h·head_dim..(h+1)·head_dim`, as after `split_heads`.
#[derive(Debug, Clone, PartialEq)]
pub struct BiasKv {
    /// `bias_k`: `kv_heads·qk_head_dim` values.
    pub k: Vec<f32>,
    /// `bias_v`: `kv_heads·v_head_dim` values.
    pub v: Vec<f32>,
}

impl AttentionWeights {
    /// Values read from the rotated keys give the forward's answer: W_v = W_k (biases too), and
    /// W_o is zero on the rotary dimensions of each value head (where a rotated key differs from
    /// the unrotated value the forward uses).
    fn check_values_from_keys(&self, c: &AttentionConfig) -> Result<()> {
        if self.v.weight != self.k.weight || self.v.bias != self.k.bias {
            return Err(Error::weight(
                "W_v.weight",
                "differs from W_k, but the config reads values from the keys",
            ));
        }
        let (Some(o), Some(rope)) = (&self.o, &c.rope) else {
            return Ok(());
        };
        let width = c.v_width();
        let rotary = |col: usize| col % c.v_head_dim < rope.rotary_dims;
        let nonzero = o
            .weight
            .chunks(width)
            .any(|row| row.iter().enumerate().any(|(j, w)| rotary(j) && *w != 0.0));
        if nonzero {
            return Err(Error::weight(
                "W_o.weight",
                "reads the rotary dimensions of the values, which a cache reading values from \
                 the rotated keys would change",
            ));
        }
        Ok(())
    }

    /// The four projections alone (no appended keys, norms, sinks, gate or output norm): what a
    /// checkpoint of plain attention holds.
    pub fn projections(q: Linear, k: Linear, v: Linear, o: Option<Linear>) -> Self {
        AttentionWeights {
            q,
            k,
            v,
            o,
            bias_kv: None,
            qk_norm: None,
            sinks: None,
            gate: None,
            output_norm: None,
        }
    }

    /// Seeded random weights with `nn.Linear`'s default distribution.
    pub fn random(config: &AttentionConfig, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let c = config;
        let q = Linear::random(c.qk_width(), c.model_dim, c.bias, &mut rng);
        let k = Linear::random(c.k_width(), c.key_dim, c.bias, &mut rng);
        let v = Linear::random(c.kv_v_width(), c.value_dim, c.bias, &mut rng);
        let o = c
            .output_projection
            .then(|| Linear::random(c.model_dim, c.v_width(), c.bias, &mut rng));
        // One norm weight per head and element: the general case of every scope.
        let qk_norm = c.qk_norm.map(|_| {
            QkNormWeights::new(
                (0..c.qk_width()).map(|_| rng.uniform(0.5, 1.5)).collect(),
                (0..c.k_width()).map(|_| rng.uniform(0.5, 1.5)).collect(),
            )
        });
        // Sink logits around the scores' scale, so that they matter.
        let sinks = c
            .sinks
            .then(|| (0..c.heads).map(|_| rng.uniform(-2.0, 2.0)).collect());
        let bias_kv = c.add_bias_kv.then(|| BiasKv {
            k: (0..c.k_width()).map(|_| rng.uniform(-1.0, 1.0)).collect(),
            v: (0..c.kv_v_width())
                .map(|_| rng.uniform(-1.0, 1.0))
                .collect(),
        });
        let gate = c
            .output_gate
            .then(|| Linear::random(c.v_width(), c.model_dim, c.bias, &mut rng));
        let output_norm = c
            .output_norm
            .map(|_| (0..c.v_width()).map(|_| rng.uniform(0.5, 1.5)).collect());
        AttentionWeights {
            q,
            k,
            v,
            o,
            bias_kv,
            qk_norm,
            sinks,
            gate,
            output_norm,
        }
    }

    /// The config these projections imply with `heads` query heads and `kv_heads` key/value
    /// heads: sizes from their shapes (the caller has checked that they split into the heads),
    /// bias on when they have biases, an output projection when there is one; validated.
    pub fn implied_config(&self, heads: usize, kv_heads: usize) -> Result<AttentionConfig> {
        AttentionConfig {
            model_dim: self.q.in_features,
            key_dim: self.k.in_features,
            value_dim: self.v.in_features,
            heads,
            kv_heads,
            qk_head_dim: self.q.out_features / heads.max(1),
            v_head_dim: self.v.out_features / kv_heads.max(1),
            output_projection: self.o.is_some(),
            softcap: None,
            alibi: None,
            bias: self.q.bias.is_some(),
            values_from_keys: false,
            temperature: None,
            chunked: None,
            output_gate: false,
            output_norm: None,
            scale: None,
            add_bias_kv: self.bias_kv.is_some(),
            add_zero_attn: false,
            rope: None,
            qk_norm: None,
            sinks: false,
            clip_qkv: None,
        }
        .validated()
    }

    /// The key and value rows appended after the projected input's (see
    /// [`AttentionConfig::appended_keys`]): `bias_k`/`bias_v`, then a zero row, each
    /// `[appended, kv_heads·head_dim]` row-major.
    pub fn appended_kv(&self, config: &AttentionConfig) -> (Vec<f32>, Vec<f32>) {
        let mut k = Vec::new();
        let mut v = Vec::new();
        if let Some(b) = &self.bias_kv {
            k.extend_from_slice(&b.k);
            v.extend_from_slice(&b.v);
        }
        if config.add_zero_attn {
            k.extend(std::iter::repeat_n(0.0, config.k_width()));
            v.extend(std::iter::repeat_n(0.0, config.kv_v_width()));
        }
        (k, v)
    }

    /// State-dict names of the four projections for this config (`W_q` / `w_q`).
    pub fn names(config: &AttentionConfig) -> [&'static str; 4] {
        if config.output_projection {
            ["W_q", "W_k", "W_v", "W_o"]
        } else {
            ["w_q", "w_k", "w_v", "w_o"]
        }
    }

    /// Checks every weight against the config; the error names the weight.
    pub fn check(&self, config: &AttentionConfig) -> Result<()> {
        let c = config;
        let [nq, nk, nv, no] = Self::names(c);
        self.q.check(nq, c.qk_width(), c.model_dim, c.bias)?;
        self.k.check(nk, c.k_width(), c.key_dim, c.bias)?;
        self.v.check(nv, c.kv_v_width(), c.value_dim, c.bias)?;
        match (&self.o, c.output_projection) {
            (Some(o), true) => o.check(no, c.model_dim, c.v_width(), c.bias)?,
            (None, true) => return Err(Error::weight(format!("{no}.weight"), "is missing")),
            (Some(_), false) => {
                return Err(Error::weight(
                    format!("{no}.weight"),
                    "is present, but the config has no output projection",
                ))
            }
            (None, false) => {}
        }
        if c.values_from_keys {
            self.check_values_from_keys(c)?;
        }
        match (&self.output_norm, c.output_norm) {
            (Some(w), Some(_)) if w.len() != c.v_width() => {
                return Err(Error::weight(
                    "output_norm.weight",
                    format!(
                        "has {} values, expected heads·v_head_dim = {}",
                        w.len(),
                        c.v_width()
                    ),
                ))
            }
            (None, Some(_)) => {
                return Err(Error::weight(
                    "output_norm.weight",
                    "is missing, but the config normalises the combined heads",
                ))
            }
            (Some(_), None) => {
                return Err(Error::weight(
                    "output_norm.weight",
                    "is present, but the config has no output norm",
                ))
            }
            _ => {}
        }
        match (&self.gate, c.output_gate) {
            (Some(g), true) => g.check("W_g", c.v_width(), c.model_dim, c.bias)?,
            (None, true) => {
                return Err(Error::weight(
                    "W_g.weight",
                    "is missing, but the config has an output gate",
                ))
            }
            (Some(_), false) => {
                return Err(Error::weight(
                    "W_g.weight",
                    "is present, but the config has no output gate",
                ))
            }
            (None, false) => {}
        }
        match (&self.qk_norm, &c.qk_norm) {
            (Some(w), Some(n)) => {
                n.check_with_bias("q", &w.q, &w.q_bias, c.heads, c.qk_head_dim)?;
                n.check_with_bias("k", &w.k, &w.k_bias, c.kv_heads, c.qk_head_dim)?;
            }
            (None, Some(_)) => {
                return Err(Error::weight(
                    "q_norm.weight",
                    "is missing, but the config normalises q and k",
                ))
            }
            (Some(_), None) => {
                return Err(Error::weight(
                    "q_norm.weight",
                    "is present, but the config has no q/k norm",
                ))
            }
            (None, None) => {}
        }
        match (&self.sinks, c.sinks) {
            (Some(s), true) if s.len() != c.heads => {
                return Err(Error::weight(
                    "sinks",
                    format!(
                        "has {} values, expected one per query head ({})",
                        s.len(),
                        c.heads
                    ),
                ))
            }
            (Some(s), true) if s.iter().any(|v| !v.is_finite()) => {
                return Err(Error::weight("sinks", "holds a value that is not finite"))
            }
            (None, true) => {
                return Err(Error::weight(
                    "sinks",
                    "is missing, but the config has sinks",
                ))
            }
            (Some(_), false) => {
                return Err(Error::weight(
                    "sinks",
                    "is present, but the config has no sinks",
                ))
            }
            _ => {}
        }
        match (&self.bias_kv, c.add_bias_kv) {
            (Some(b), true) => {
                for (name, values, want) in [
                    ("bias_k", &b.k, c.k_width()),
                    ("bias_v", &b.v, c.kv_v_width()),
                ] {
                    if values.len() != want {
                        return Err(Error::weight(
                            name,
                            format!(
                                "has {} values, expected heads·head_dim = {want}",
                                values.len()
                            ),
                        ));
                    }
                }
                Ok(())
            }
            (None, true) => Err(Error::weight(
                "bias_k",
                "is missing, but the config has add_bias_kv",
            )),
            (Some(_), false) => Err(Error::weight(
                "bias_k",
                "is present, but the config has add_bias_kv off",
            )),
            (None, false) => Ok(()),
        }
    }
}

/// A tiny deterministic generator (SplitMix64), so seeded weights need no extra crate.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }
}
