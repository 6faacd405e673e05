//! Attention masks.
//!
//! Polarity is never a bare bool: [`Mask::Attend`] keeps positions whose value is nonzero
//! (seed 000, `masked_fill(mask == 0, -1e9)`), [`Mask::Block`] masks positions whose value is
//! nonzero (seed 001, `masked_fill(attn_mask, -1e9)`). A masked score is *replaced* by −1e9, so a
//! query whose keys are all masked gets a uniform softmax (the mean of V), never NaN.
//!
//! Tensor masks (and the additive bias) broadcast to `[B, H, Lq, Lk]`; every dimension is either
//! the full size or 1. By rank: 4 → `[B, H, Lq, Lk]`; 3 → `[B, Lq, Lk]` (shared by all heads, as
//! seed 001 does with `unsqueeze(1)`); 2 → `[Lq, Lk]`; 1 → `[Lk]`.

use crate::error::{Error, Result};
use crate::model::tensor::Tensor;

/// The value a masked score is replaced with (the seeds' `masked_fill(.., -1e9)`).
pub const MASKED_SCORE: f32 = -1e9;

/// A u8 mask tensor (any nonzero byte counts as "set").
#[derive(Debug, Clone, PartialEq)]
pub struct MaskTensor {
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl MaskTensor {
    pub fn new(shape: impl Into<Vec<usize>>, data: Vec<u8>) -> Result<Self> {
        let shape = crate::model::tensor::checked_shape("mask", shape.into(), data.len())?;
        Ok(MaskTensor { shape, data })
    }
    pub fn from_bools(shape: impl Into<Vec<usize>>, data: &[bool]) -> Result<Self> {
        Self::new(shape, data.iter().map(|&b| b as u8).collect())
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

/// Which scores take part in the softmax.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Mask {
    /// Every query sees every key.
    #[default]
    None,
    /// Bottom-right aligned causal mask: query `i` sees key `j` iff `j <= i + (Lk − Lq)`.
    /// Generated in the shader, never stored.
    Causal,
    /// Per batch, the number of valid keys; keys at `j >= len[b]` are masked.
    KeyPadding(Vec<usize>),
    /// Nonzero = attend, zero = masked (seed 000's polarity).
    Attend(MaskTensor),
    /// Nonzero = masked, zero = attend (seed 001's polarity, `attn_mask` of bools).
    Block(MaskTensor),
    /// Added to the scaled scores before the softmax (no replacement).
    Bias(Tensor),
}

impl Mask {
    /// `Mask::Attend` from u8 data (nonzero = attend).
    pub fn attend(shape: impl Into<Vec<usize>>, data: Vec<u8>) -> Result<Self> {
        Ok(Mask::Attend(MaskTensor::new(shape, data)?))
    }
    /// `Mask::Block` from bools (true = masked), like seed 001's `attn_mask`.
    pub fn block(shape: impl Into<Vec<usize>>, data: &[bool]) -> Result<Self> {
        Ok(Mask::Block(MaskTensor::from_bools(shape, data)?))
    }
    /// An additive bias broadcastable to `[B, H, Lq, Lk]`.
    pub fn bias(tensor: Tensor) -> Self {
        Mask::Bias(tensor)
    }

    /// A short name for messages and benchmarks.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Mask::None => "none",
            Mask::Causal => "causal",
            Mask::KeyPadding(_) => "key_padding",
            Mask::Attend(_) => "attend",
            Mask::Block(_) => "block",
            Mask::Bias(_) => "bias",
        }
    }

    /// Checks the mask against a problem: tensor masks must broadcast to `[B, H, Lq, Lk]`,
    /// key padding needs one length per batch, none longer than `Lk`.
    pub fn check(&self, dims: AttnDims) -> Result<()> {
        match self {
            Mask::None | Mask::Causal => Ok(()),
            Mask::KeyPadding(lengths) => {
                if lengths.len() != dims.batch {
                    return Err(Error::Mask(format!(
                        "key padding has {} lengths, but the batch is {}",
                        lengths.len(),
                        dims.batch
                    )));
                }
                if let Some(&bad) = lengths.iter().find(|&&l| l > dims.lk) {
                    return Err(Error::Mask(format!(
                        "key padding length {bad} is longer than Lk = {}",
                        dims.lk
                    )));
                }
                Ok(())
            }
            Mask::Attend(t) | Mask::Block(t) => {
                broadcast_strides("mask", t.shape(), dims).map(drop)
            }
            Mask::Bias(t) => broadcast_strides("bias mask", t.shape(), dims).map(drop),
        }
    }
}

/// The sizes a mask is checked against: batch, heads, query and key lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    pub batch: usize,
    pub heads: usize,
    pub lq: usize,
    pub lk: usize,
}

/// Element strides of a broadcastable tensor over `(b, h, i, j)`.
pub(crate) fn broadcast_strides(what: &str, shape: &[usize], d: AttnDims) -> Result<[u32; 4]> {
    // Which of (B, H, Lq, Lk) each dimension of the given rank stands for.
    let axes: &[usize] = match shape.len() {
        4 => &[0, 1, 2, 3],
        3 => &[0, 2, 3],
        2 => &[2, 3],
        1 => &[3],
        _ => {
            return Err(Error::Mask(format!(
                "{what} has rank {} (shape {shape:?}); it must have 1 to 4 dimensions \
                 broadcastable to [B, H, Lq, Lk] = [{}, {}, {}, {}]",
                shape.len(),
                d.batch,
                d.heads,
                d.lq,
                d.lk
            )))
        }
    };
    let full = [d.batch, d.heads, d.lq, d.lk];
    let names = ["B", "H", "Lq", "Lk"];
    let mut strides = [0u32; 4];
    let mut stride = 1usize;
    for (pos, &axis) in axes.iter().enumerate().rev() {
        let n = shape[pos];
        if n != full[axis] && n != 1 {
            return Err(Error::Mask(format!(
                "{what} shape {shape:?} does not broadcast to [B, H, Lq, Lk] = {full:?}: \
                 dimension {pos} is {n}, but {} is {}",
                names[axis], full[axis]
            )));
        }
        strides[axis] = if n == 1 { 0 } else { stride as u32 };
        stride *= n;
    }
    if stride > u32::MAX as usize {
        return Err(Error::Mask(format!(
            "{what} has {stride} elements, more than 2^32"
        )));
    }
    Ok(strides)
}
