//! T5's bucketed relative position bias: a learned `[buckets, heads]` table indexed by the
//! bucket of `key position − query position`, added to the scores (T5 has no 1/√d scale).
//! Encoder buckets are bidirectional, decoder buckets one-way (only keys at or before the
//! query are told apart).

use crate::error::{Error, Result};
use crate::model::mask::{AttnDims, Mask};
use crate::model::tensor::Tensor;

/// One T5 stack's relative attention bias.
#[derive(Debug, Clone, PartialEq)]
pub struct RelativeBias {
    /// `relative_attention_bias.weight`: `[buckets, heads]`, row-major.
    pub table: Vec<f32>,
    /// `relative_attention_num_buckets`: rows of the table (at least 2).
    pub buckets: usize,
    /// Attention heads: columns of the table.
    pub heads: usize,
    /// `relative_attention_max_distance`: distances at or past it fall in the last bucket (of
    /// their direction).
    pub max_distance: usize,
    /// Encoder (true) or decoder (false) buckets.
    pub bidirectional: bool,
}

impl RelativeBias {
    /// A bias from its table `[buckets, heads]`; `Err(Config)` when the table is not that size
    /// or `buckets < 2`.
    pub fn new(
        table: Vec<f32>,
        buckets: usize,
        heads: usize,
        max_distance: usize,
        bidirectional: bool,
    ) -> Result<Self> {
        if buckets.checked_mul(heads) != Some(table.len()) || buckets < 2 {
            return Err(Error::Config(format!(
                "a relative attention bias table of {} values is not [buckets, heads] = [{buckets}, {heads}]",
                table.len()
            )));
        }
        Ok(RelativeBias {
            table,
            buckets,
            heads,
            max_distance,
            bidirectional,
        })
    }

    /// The bucket of `relative = key − query`, as transformers' `_relative_position_bucket`
    /// computes it (its logarithm in f32, truncated).
    /// `None` where transformers' bucket is out of the table (its embedding lookup raises):
    /// a `relative_attention_max_distance` at or below the exact range makes the logarithm's
    /// share negative or infinite.
    pub fn bucket(&self, relative: i64) -> Option<usize> {
        let (mut buckets, mut offset) = (self.buckets as i64, 0);
        let distance = if self.bidirectional {
            buckets /= 2;
            if relative > 0 {
                offset = buckets;
            }
            relative.unsigned_abs() as i64
        } else {
            -relative.min(0)
        };
        let max_exact = buckets / 2;
        if distance < max_exact {
            return usize::try_from(offset + distance).ok();
        }
        let share = (distance as f32 / max_exact as f32).ln()
            / ((self.max_distance as f64 / max_exact as f64).ln() as f32)
            * (buckets - max_exact) as f32;
        if !share.is_finite() {
            return None;
        }
        // torch's `.to(torch.long)` truncates toward zero, negative shares included.
        let large = (max_exact + share as i64).min(buckets - 1);
        usize::try_from(offset + large).ok().filter(|_| large >= 0)
    }

    /// The bias of `dims` (queries at positions `lk − lq ..`, as a decoder's last queries), as an
    /// additive mask `[1, H, Lq, Lk]`, with −inf where `causal` hides a key.
    pub fn mask(&self, dims: AttnDims, causal: bool) -> Result<Mask> {
        if dims.heads != self.heads {
            return Err(Error::Config(format!(
                "the relative attention bias has {} heads, the module {}",
                self.heads, dims.heads
            )));
        }
        let (h, lq, lk) = (self.heads, dims.lq, dims.lk);
        let first_query = lk as i64 - lq as i64;
        let mut values = Vec::with_capacity(h * lq * lk);
        for head in 0..h {
            for i in 0..lq {
                let query = first_query + i as i64;
                for j in 0..lk {
                    values.push(match causal && j as i64 > query {
                        true => f32::NEG_INFINITY,
                        false => match self.bucket(j as i64 - query) {
                            Some(bucket) => self.table[bucket * h + head],
                            None => return Err(self.out_of_table(j as i64 - query)),
                        },
                    });
                }
            }
        }
        Ok(Mask::Bias(Tensor::new([1, h, lq, lk], values)?))
    }

    fn out_of_table(&self, relative: i64) -> Error {
        Error::Config(format!(
            "T5's relative position bucket of distance {relative} falls outside the table of {} \
             buckets: relative_attention_max_distance = {} is not beyond the exact range \
             (transformers' lookup fails there too)",
            self.buckets, self.max_distance
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bias(bidirectional: bool) -> RelativeBias {
        RelativeBias::new(vec![0.0; 32], 32, 1, 128, bidirectional).unwrap()
    }

    #[test]
    fn buckets_match_t5_rules() {
        let enc = bias(true);
        // 16 buckets per direction, 8 exact: distances 0..8 are their own bucket.
        assert_eq!(enc.bucket(0), Some(0));
        assert_eq!(enc.bucket(-7), Some(7));
        assert_eq!(enc.bucket(7), Some(16 + 7));
        // log-spaced beyond: 8 + floor(ln(d/8)/ln(16)·8), capped at 15.
        assert_eq!(enc.bucket(-8), Some(8));
        assert_eq!(enc.bucket(-16), Some(8 + 2));
        assert_eq!(enc.bucket(-1000), Some(15));
        assert_eq!(enc.bucket(1000), Some(31));
        let dec = bias(false);
        // One-way: keys after the query share bucket 0; 16 exact distances.
        assert_eq!(dec.bucket(5), Some(0));
        assert_eq!(dec.bucket(-15), Some(15));
        assert_eq!(dec.bucket(-16), Some(16));
        assert_eq!(dec.bucket(-10_000), Some(31));
        // max_distance 4 below the exact range (8): torch truncates the negative share toward
        // zero (8 + trunc(ln(11/8)/ln(0.5)·8) = 8 − 3), and far keys fall off the table.
        let short = RelativeBias::new(vec![0.0; 32], 32, 1, 4, true).unwrap();
        assert_eq!(short.bucket(-11), Some(5));
        assert_eq!(short.bucket(11), Some(16 + 5));
        assert_eq!(short.bucket(-100), None);
        // max_distance equal to it: ln(1) = 0 divides.
        let flat = RelativeBias::new(vec![0.0; 32], 32, 1, 8, true).unwrap();
        assert_eq!(flat.bucket(-9), None);
        assert_eq!(flat.bucket(-7), Some(7));
    }

    #[test]
    fn the_mask_is_the_table_by_bucket_with_causal_infinity() {
        let table: Vec<f32> = (0..8).map(|v| v as f32).collect(); // 4 buckets, 2 heads
        let b = RelativeBias::new(table, 4, 2, 8, false).unwrap();
        let dims = AttnDims {
            batch: 1,
            heads: 2,
            lq: 2,
            lk: 2,
        };
        match b.mask(dims, true).unwrap() {
            Mask::Bias(t) => {
                // head 0: row 0 sees key 0 (bucket 0 → 0); row 1: keys 0 (distance 1 → bucket 1 → 2), 1 (→ 0)
                let inf = f32::NEG_INFINITY;
                assert_eq!(t.data(), [0.0, inf, 2.0, 0.0, 1.0, inf, 3.0, 1.0]);
            }
            other => panic!("{other:?}"),
        }
        assert!(b.mask(AttnDims { heads: 3, ..dims }, false).is_err());
    }
}
