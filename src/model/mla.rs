//! Multi-head latent attention (DeepSeek-V2/V3) as the crate's attention core runs it: the
//! low-rank pre-stage ([`MlaInputs`]) turns the hidden states into a query input and a per-token
//! latent `[k_pe | c]` (the shared RoPE key and the normalised compressed latent), and the
//! per-head expansion `kv_b_proj` is absorbed into the query and output projections
//! ([`MlaWeights::absorbed`]), so that the core is multi-query attention over the latent itself:
//! one key/value head of width `dr + r`, the values being the keys. A `KvCache` of that module
//! holds `dr + r` floats per token — the latent and the RoPE key, nothing per head.
//!
//! With `q_h = [q_nope | q_pe]` of head h, `k_h = [W_UK_h·c | k_pe]`, `v_h = W_UV_h·c`:
//! `q_h·k_h = (W_UK_hᵀ·q_nope)·c + q_pe·k_pe` and `o_proj(⊕_h Σ p·v_h) = o_proj(⊕_h W_UV_h·Σ p·c)`,
//! so the query head `[q_pe | W_UK_hᵀ·q_nope]` against the key `[k_pe | c]`, and the output
//! projection `o_proj · diag(W_UV_h)` (zero on the `k_pe` part of each value), compute transformers'
//! answer. The products of the absorbed weights are formed in f64.

use crate::error::{Error, Result};
use crate::model::config::AttentionConfig;
use crate::model::rope::Rope;
use crate::model::tensor::Tensor;
use crate::model::weights::{AttentionWeights, Linear};

/// DeepseekV2RMSNorm / DeepseekV3RMSNorm: built without an epsilon, so transformers' default.
pub const MLA_NORM_EPS: f64 = 1e-6;

/// The sizes of one MLA module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    /// `hidden_size` (E): width of the hidden states.
    pub hidden: usize,
    /// `num_attention_heads` (H).
    pub heads: usize,
    /// `q_lora_rank` (None: a plain `q_proj`).
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank` (r): width of the compressed latent `c`.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim` (dn): per-head width of the query and key part without RoPE.
    pub qk_nope_head_dim: usize,
    /// `qk_rope_head_dim` (dr): per-head width of the rotated part (`q_pe`, the shared `k_pe`).
    pub qk_rope_head_dim: usize,
    /// `v_head_dim` (dv): per-head width of the values.
    pub v_head_dim: usize,
}

impl MlaDims {
    /// Width of the per-token latent the core sees as its key (and value): `dr + r`.
    pub fn latent_width(&self) -> usize {
        self.qk_rope_head_dim + self.kv_lora_rank
    }

    /// transformers' `qk_head_dim`: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// `(H, dn, dr, dv, r)`: the sizes by the letters the docs and the products use.
    pub(crate) fn letters(&self) -> (usize, usize, usize, usize, usize) {
        (
            self.heads,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
            self.kv_lora_rank,
        )
    }

    /// `[B, L]` of hidden states `x [B, L, E]`; an error for any other shape.
    pub(crate) fn batch_and_length(&self, x: &Tensor) -> Result<[usize; 2]> {
        let s = x.shape();
        if s.len() != 3 || s[2] != self.hidden {
            return Err(Error::shape(
                "hidden_states",
                format!("[batch, L, {}]", self.hidden),
                s,
            ));
        }
        Ok([s[0], s[1]])
    }
}

/// The module's weights as saved.
#[derive(Debug, Clone)]
pub struct MlaWeights {
    /// The module's sizes, which [`MlaWeights::check`] checks the tensors against.
    pub dims: MlaDims,
    /// `q_a_proj`, `q_a_layernorm.weight` (q LoRA) — or none, `q` being `q_proj`.
    pub q_a: Option<(Linear, Vec<f32>)>,
    /// `q_b_proj` or `q_proj`: `[H·(dn + dr), q input]`.
    pub q_b: Linear,
    /// `kv_a_proj_with_mqa`: `[r + dr, E]`.
    pub kv_a: Linear,
    /// `kv_a_layernorm.weight`: `[r]`.
    pub kv_norm: Vec<f32>,
    /// `kv_b_proj`: `[H·(dn + dv), r]`.
    pub kv_b: Linear,
    /// `o_proj`: `[E, H·dv]`.
    pub o: Linear,
}

/// The pre-stage: hidden states to the core's query input and latent input.
#[derive(Debug, Clone)]
pub struct MlaInputs {
    pub(crate) dims: MlaDims,
    pub(crate) q_a: Option<(Linear, Vec<f32>)>,
    pub(crate) kv_a: Linear,
    pub(crate) kv_norm: Vec<f32>,
}

impl MlaWeights {
    /// Checks every shape against `dims`; errors name the tensor (`name(stored)`).
    pub fn check(&self, name: &dyn Fn(&str) -> String) -> Result<()> {
        let d = &self.dims;
        let h = d.heads;
        let shape = |l: &Linear, stored: &str, rows: usize, cols: usize| -> Result<()> {
            if l.out_features != rows || l.in_features != cols {
                return Err(Error::weight(
                    format!("{}.weight", name(stored)),
                    format!(
                        "has shape [{}, {}], expected [{rows}, {cols}] from the config's MLA sizes",
                        l.out_features, l.in_features
                    ),
                ));
            }
            Ok(())
        };
        let q_in = match (&self.q_a, d.q_lora_rank) {
            (Some((a, norm)), Some(rank)) => {
                shape(a, "q_a_proj", rank, d.hidden)?;
                if norm.len() != rank {
                    return Err(Error::weight(
                        format!("{}.weight", name("q_a_layernorm")),
                        format!("has {} values, expected q_lora_rank = {rank}", norm.len()),
                    ));
                }
                if rank > d.hidden {
                    return Err(Error::Config(format!(
                        "`{}`: q_lora_rank = {rank} is wider than hidden_size = {}; the core's \
                         query input (the q latent, zero-padded) is hidden_size wide",
                        name(""),
                        d.hidden
                    )));
                }
                rank
            }
            (None, None) => d.hidden,
            _ => {
                return Err(Error::Config(format!(
                    "`{}`: q_lora_rank = {:?} disagrees with the tensors saved",
                    name(""),
                    d.q_lora_rank
                )))
            }
        };
        let q_name = if self.q_a.is_some() {
            "q_b_proj"
        } else {
            "q_proj"
        };
        shape(&self.q_b, q_name, h * d.qk_head_dim(), q_in)?;
        shape(&self.kv_a, "kv_a_proj_with_mqa", d.latent_width(), d.hidden)?;
        if self.kv_norm.len() != d.kv_lora_rank {
            return Err(Error::weight(
                format!("{}.weight", name("kv_a_layernorm")),
                format!(
                    "has {} values, expected kv_lora_rank = {}",
                    self.kv_norm.len(),
                    d.kv_lora_rank
                ),
            ));
        }
        shape(
            &self.kv_b,
            "kv_b_proj",
            h * (d.qk_nope_head_dim + d.v_head_dim),
            d.kv_lora_rank,
        )?;
        shape(&self.o, "o_proj", d.hidden, h * d.v_head_dim)?;
        for (l, stored) in [(&self.q_b, q_name), (&self.kv_b, "kv_b_proj")] {
            if l.bias.is_some() {
                return Err(Error::weight(
                    format!("{}.bias", name(stored)),
                    "is saved, but transformers builds this projection without a bias",
                ));
            }
        }
        Ok(())
    }

    /// The core's config and weights with `kv_b_proj` absorbed (see the module docs): query
    /// heads `[q_pe | W_UK_hᵀ·q_nope]`, one key/value head `[k_pe | c]` (identity projections),
    /// values read as the keys, output `o_proj · diag(W_UV_h)`. `scale`: transformers'
    /// `qk_head_dim^-0.5` (times yarn's mscale²); `rope`: over the first `dr` dimensions.
    pub fn absorbed(&self, scale: f64, rope: Rope) -> Result<(AttentionConfig, AttentionWeights)> {
        let d = self.dims;
        let (h, dn, dr, dv, r) = d.letters();
        let w = d.latent_width();
        // The core's query input is E wide (its output is too): a q LoRA latent narrower than
        // E enters padded with zeros (`MlaInputs::of`), met here by zero columns.
        let (q_in, q_used) = (d.hidden, self.q_b.in_features);
        let (qb, kvb) = (&self.q_b.weight, &self.kv_b.weight);
        // Query: per head, dr rope rows as saved, then r rows Σ_i kv_b[k-row i, c]·q_b[nope-row i].
        let mut wq = vec![0.0f32; h * w * q_in];
        for hd in 0..h {
            let q_row = |i: usize| &qb[(hd * (dn + dr) + i) * q_used..][..q_used];
            for j in 0..dr {
                wq[(hd * w + j) * q_in..][..q_used].copy_from_slice(q_row(dn + j));
            }
            for c in 0..r {
                let out = &mut wq[(hd * w + dr + c) * q_in..][..q_used];
                for (col, o) in out.iter_mut().enumerate() {
                    let s: f64 = (0..dn)
                        .map(|i| kvb[(hd * (dn + dv) + i) * r + c] as f64 * q_row(i)[col] as f64)
                        .sum();
                    *o = s as f32;
                }
            }
        }
        // Output: column hd·w + dr + c = Σ_t o[:, hd·dv + t]·kv_b[v-row t, c]; k_pe columns zero.
        let e = d.hidden;
        let ow = &self.o.weight;
        let mut wo = vec![0.0f32; e * h * w];
        for row in 0..e {
            for hd in 0..h {
                for c in 0..r {
                    let s: f64 = (0..dv)
                        .map(|t| {
                            ow[row * h * dv + hd * dv + t] as f64
                                * kvb[(hd * (dn + dv) + dn + t) * r + c] as f64
                        })
                        .sum();
                    wo[row * h * w + hd * w + dr + c] = s as f32;
                }
            }
        }
        let identity = || {
            let mut m = vec![0.0f32; w * w];
            (0..w).for_each(|i| m[i * w + i] = 1.0);
            Linear {
                out_features: w,
                in_features: w,
                weight: m,
                bias: None,
            }
        };
        let bias = self.o.bias.is_some();
        let zeros = |n: usize| bias.then(|| vec![0.0f32; n]);
        let q = Linear {
            out_features: h * w,
            in_features: q_in,
            weight: wq,
            bias: zeros(h * w),
        };
        let k = Linear {
            bias: zeros(w),
            ..identity()
        };
        let v = Linear {
            bias: zeros(w),
            ..identity()
        };
        let o = Linear {
            out_features: e,
            in_features: h * w,
            weight: wo,
            bias: self.o.bias.clone(),
        };
        let weights = AttentionWeights::projections(q, k, v, Some(o));
        let config = AttentionConfig {
            output_projection: true,
            ..AttentionConfig::per_head(e, w, w, h)?
        };
        let config = config
            .with_kv_dims(w, w)?
            .with_kv_heads(1)?
            .with_bias(bias)
            .with_scale(scale as f32)?
            .with_rope(rope)?
            .with_values_from_keys()?;
        weights.check(&config)?;
        Ok((config, weights))
    }

    /// The pre-stage of this module (copies of `q_a`, `kv_a` and `kv_norm`).
    pub fn inputs(&self) -> MlaInputs {
        MlaInputs {
            dims: self.dims,
            q_a: self.q_a.clone(),
            kv_a: self.kv_a.clone(),
            kv_norm: self.kv_norm.clone(),
        }
    }
}

impl MlaInputs {
    /// The module's sizes.
    pub fn dims(&self) -> &MlaDims {
        &self.dims
    }

    /// `x [B, L, E]` → (query input `[B, L, E]`: `q_a_layernorm(q_a_proj(x))` padded with zeros
    /// to E, or `x`; latent `[B, L, dr + r]`: `[k_pe | kv_a_layernorm(c)]` of `kv_a_proj_with_mqa(x)`,
    /// k_pe before RoPE — the core rotates it). Computed on the host, in f64 then f32.
    pub fn of(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let d = &self.dims;
        let [b, l] = d.batch_and_length(x)?;
        let rows = b * l;
        let query = match &self.q_a {
            None => x.clone(),
            Some((a, norm)) => {
                let q = linear(a, x.data(), rows);
                let mut padded = vec![0.0f32; rows * d.hidden];
                for (row, out) in q.chunks(a.out_features).zip(padded.chunks_mut(d.hidden)) {
                    out[..row.len()].copy_from_slice(row);
                    rms_norm(&mut out[..row.len()], norm);
                }
                Tensor::new([b, l, d.hidden], padded)?
            }
        };
        let (r, dr) = (d.kv_lora_rank, d.qk_rope_head_dim);
        let ckv = linear(&self.kv_a, x.data(), rows);
        let mut latent = Vec::with_capacity(rows * (r + dr));
        for row in ckv.chunks(r + dr) {
            let mut c = row[..r].to_vec();
            rms_norm(&mut c, &self.kv_norm);
            latent.extend_from_slice(&row[r..]);
            latent.extend_from_slice(&c);
        }
        Ok((query, Tensor::new([b, l, r + dr], latent)?))
    }
}

/// `x [rows, in] · Wᵀ + b`, accumulated in f64.
fn linear(l: &Linear, x: &[f32], rows: usize) -> Vec<f32> {
    let (n, k) = (l.out_features, l.in_features);
    let mut y = Vec::with_capacity(rows * n);
    for xr in x.chunks(k).take(rows) {
        for o in 0..n {
            let wr = &l.weight[o * k..(o + 1) * k];
            let s: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let b = l.bias.as_ref().map_or(0.0, |b| b[o] as f64);
            y.push((s + b) as f32);
        }
    }
    y
}

/// transformers' RMSNorm: `w · x / sqrt(mean(x²) + eps)`, in place.
fn rms_norm(x: &mut [f32], w: &[f32]) {
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + MLA_NORM_EPS).sqrt();
    for (v, g) in x.iter_mut().zip(w) {
        *v = (*g as f64 * (*v as f64 * inv)) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mask::Mask;
    use crate::model::weights::SplitMix64;

    fn matvec(l: &Linear, x: &[f64]) -> Vec<f64> {
        (0..l.out_features)
            .map(|o| {
                let row = &l.weight[o * l.in_features..(o + 1) * l.in_features];
                let s: f64 = row.iter().zip(x).map(|(w, v)| *w as f64 * v).sum();
                s + l.bias.as_ref().map_or(0.0, |b| b[o] as f64)
            })
            .collect()
    }

    fn rms(x: &[f64], w: &[f32]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + MLA_NORM_EPS).sqrt();
        x.iter().zip(w).map(|(v, g)| *g as f64 * v * inv).collect()
    }

    /// transformers' MLA as written, every head expanded, in f64: q (LoRA), the latent and
    /// its norm, kv_b_proj per head, interleaved RoPE on the dr = 2 rope dims (one pair, one
    /// frequency: angle = position), causal softmax, o_proj.
    fn expanded(w: &MlaWeights, x: &Tensor, scale: f64) -> Vec<f64> {
        let d = w.dims;
        let (h, dn, dr, dv, r) = d.letters();
        assert_eq!(dr, 2);
        let [b, l, e] = x.shape()[..] else { panic!() };
        let rotate = |v: &mut [f64], pos: usize| {
            let (c, s) = ((pos as f64).cos(), (pos as f64).sin());
            let (a, bb) = (v[0], v[1]);
            v[0] = a * c - bb * s;
            v[1] = a * s + bb * c;
        };
        let mut out = Vec::new();
        for bi in 0..b {
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for t in 0..l {
                let xr: Vec<f64> = x.data()[(bi * l + t) * e..][..e]
                    .iter()
                    .map(|v| *v as f64)
                    .collect();
                let q_in = match &w.q_a {
                    Some((a, norm)) => rms(&matvec(a, &xr), norm),
                    None => xr.clone(),
                };
                let mut q = matvec(&w.q_b, &q_in);
                let ckv = matvec(&w.kv_a, &xr);
                let c = rms(&ckv[..r], &w.kv_norm);
                let mut k_pe = ckv[r..].to_vec();
                rotate(&mut k_pe, t);
                let kv = matvec(&w.kv_b, &c);
                let mut k = Vec::new();
                let mut v = Vec::new();
                for hd in 0..h {
                    rotate(&mut q[hd * (dn + dr) + dn..][..dr], t);
                    k.extend_from_slice(&kv[hd * (dn + dv)..][..dn]);
                    k.extend_from_slice(&k_pe);
                    v.extend_from_slice(&kv[hd * (dn + dv) + dn..][..dv]);
                }
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            for (i, qi) in qs.iter().enumerate() {
                let mut heads = vec![0.0; h * dv];
                for hd in 0..h {
                    let dot = |j: usize| -> f64 {
                        let (q, k) = (&qi[hd * (dn + dr)..], &ks[j][hd * (dn + dr)..]);
                        (0..dn + dr).map(|t| q[t] * k[t]).sum::<f64>() * scale
                    };
                    let s: Vec<f64> = (0..=i).map(dot).collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let p: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = p.iter().sum();
                    for (j, pj) in p.iter().enumerate() {
                        for t in 0..dv {
                            heads[hd * dv + t] += pj / z * vs[j][hd * dv + t];
                        }
                    }
                }
                out.extend(matvec(&w.o, &heads));
            }
        }
        out
    }

    #[test]
    fn absorbing_kv_b_proj_computes_the_expanded_attention() {
        // dn ≠ dv ≠ dr and q LoRA narrower than E, so that no index can stand for another.
        for q_lora_rank in [Some(5), None] {
            let dims = MlaDims {
                hidden: 12,
                heads: 3,
                q_lora_rank,
                kv_lora_rank: 6,
                qk_nope_head_dim: 4,
                qk_rope_head_dim: 2,
                v_head_dim: 3,
            };
            let mut rng = SplitMix64::new(7);
            let q_a = q_lora_rank.map(|rank| {
                let a = Linear::random(rank, 12, true, &mut rng);
                (a, (0..rank).map(|_| rng.uniform(0.5, 1.5)).collect())
            });
            let q_b = Linear::random(3 * 6, q_lora_rank.unwrap_or(12), false, &mut rng);
            let w = MlaWeights {
                dims,
                q_a,
                q_b,
                kv_a: Linear::random(8, 12, true, &mut rng),
                kv_norm: (0..6).map(|_| rng.uniform(0.5, 1.5)).collect(),
                kv_b: Linear::random(3 * 7, 6, false, &mut rng),
                o: Linear::random(12, 9, true, &mut rng),
            };
            w.check(&|s| s.to_string()).expect("shapes");
            let rope = Rope {
                interleaved: true,
                ..Rope::new(10_000.0, 2)
            };
            let scale = 6f64.powf(-0.5) * 1.3;
            let (config, weights) = w.absorbed(scale, rope).expect("absorbed");
            let x = Tensor::random([2, 5, 12], 3);
            let (q, kv) = w.inputs().of(&x).expect("inputs");
            let got = crate::reference::forward(&config, &weights, &q, &kv, &kv, &Mask::Causal)
                .expect("reference")
                .output;
            let want = expanded(&w, &x, scale);
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            let size = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
            assert!(err < 1e-5 * (1.0 + size), "{q_lora_rank:?}: {err:e}");
        }
    }
}
