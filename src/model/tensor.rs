//! A plain host tensor: a shape and row-major `f32` data.

use crate::error::{Error, Result};

/// A row-major host tensor of `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Tensor {
    /// Builds a tensor, checking that `data.len()` is the product of `shape`.
    pub fn new(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Self> {
        let shape = checked_shape("tensor", shape.into(), data.len())?;
        Ok(Tensor { shape, data })
    }

    /// Internal constructor for data whose length the caller derived from `shape`.
    pub(crate) fn from_parts(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Self {
        let shape = shape.into();
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
    }

    /// A tensor of zeros.
    pub fn zeros(shape: impl Into<Vec<usize>>) -> Self {
        let shape = shape.into();
        let n = shape.iter().product();
        Tensor {
            shape,
            data: vec![0.0; n],
        }
    }

    /// Uniform random values in `[-1, 1)` from a small deterministic generator.
    pub fn random(shape: impl Into<Vec<usize>>, seed: u64) -> Self {
        let shape = shape.into();
        let n: usize = shape.iter().product();
        let mut rng = crate::model::weights::SplitMix64::new(seed);
        let data = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        Tensor { shape, data }
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The values, row-major in `shape`.
    pub fn data(&self) -> &[f32] {
        &self.data
    }
    /// The values, row-major in `shape`, to change in place.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
    /// The values, row-major, without the shape.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }
    /// The number of values (the product of `shape`).
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Whether the tensor holds no values (some dimension is 0).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Multiplies every value by `factor` (handy for stress inputs).
    pub fn scaled(mut self, factor: f32) -> Self {
        self.data.iter_mut().for_each(|v| *v *= factor);
        self
    }

    /// Largest absolute difference to `other` (NaN if either holds NaN at the same place).
    pub fn max_abs_diff(&self, other: &[f32]) -> f32 {
        max_abs_diff(&self.data, other)
    }
}

/// `shape` when its element count is `len`, else `Err(DataLength)` naming `what`.
pub(crate) fn checked_shape(what: &str, shape: Vec<usize>, len: usize) -> Result<Vec<usize>> {
    let expected: usize = shape.iter().product();
    if expected != len {
        return Err(Error::DataLength {
            what: what.into(),
            shape,
            expected,
            got: len,
        });
    }
    Ok(shape)
}

/// Largest |a − b| over two equally long f32 slices, as f32; see [`max_abs_error`].
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    max_abs_error(a, b) as f32
}

/// Largest |a − b| in f64, the one error measure of the crate: NaN when either side holds NaN
/// at any position or the lengths differ, so a NaN output never passes a `<=` bound.
pub fn max_abs_error<A: Copy + Into<f64>, B: Copy + Into<f64>>(a: &[A], b: &[B]) -> f64 {
    if a.len() != b.len() {
        return f64::NAN;
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x.into() - y.into()).abs())
        .fold(0.0f64, |m, d| {
            if d.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(d)
            }
        })
}

#[cfg(test)]
mod tests {
    use super::{max_abs_diff, max_abs_error};

    #[test]
    fn nan_anywhere_or_a_length_mismatch_is_nan() {
        assert_eq!(max_abs_error(&[1.0f32, 2.0], &[1.5f64, 1.0]), 1.0);
        assert!(max_abs_error(&[f32::NAN, 2.0], &[1.0f64, 2.0]).is_nan());
        assert!(max_abs_error(&[1.0f32, 2.0], &[1.0f64, f64::NAN]).is_nan());
        // NaN after a larger difference still wins (a plain max would drop it).
        assert!(max_abs_diff(&[9.0, f32::NAN], &[0.0, 0.0]).is_nan());
        assert!(max_abs_error(&[1.0f32], &[1.0f64, 2.0]).is_nan());
        assert_eq!(max_abs_diff(&[], &[]), 0.0);
    }
}
