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
    /// A mask of `shape` over row-major `data`; `Err(DataLength)` when their sizes differ.
    pub fn new(shape: impl Into<Vec<usize>>, data: Vec<u8>) -> Result<Self> {
        let shape = crate::model::tensor::checked_shape("mask", shape.into(), data.len())?;
        Ok(MaskTensor { shape, data })
    }
    /// [`MaskTensor::new`] from bools: `true` becomes 1, `false` 0.
    pub fn from_bools(shape: impl Into<Vec<usize>>, data: &[bool]) -> Result<Self> {
        Self::new(shape, data.iter().map(|&b| b as u8).collect())
    }
    /// The mask's shape (rank 1 to 4, see the module's broadcasting rules).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The bytes, row-major in `shape`; what a nonzero byte means depends on the [`Mask`].
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
    /// Causal and at most `w` keys back (Mistral's `sliding_window`): query `i` sees key `j`
    /// iff `i + (Lk − Lq) − w < j ≤ i + (Lk − Lq)`. Generated in the shader, never stored.
    SlidingWindow(usize),
    /// Per batch, the number of valid keys; keys at `j >= len[b]` are masked.
    KeyPadding(Vec<usize>),
    /// Nonzero = attend, zero = masked (seed 000's polarity).
    Attend(MaskTensor),
    /// Nonzero = masked, zero = attend (seed 001's polarity, `attn_mask` of bools).
    Block(MaskTensor),
    /// Added to the scaled scores before the softmax (no replacement).
    Bias(Tensor),
    /// Causal (bottom-right aligned), at most `window` keys back when one is given, and only the
    /// keys `keep` marks (`[B, Lk]`, or `[Lk]` for a batch of one; nonzero = a real token): a
    /// decoder's mask over a padded batch. The causal rule is generated in the shader and the
    /// padding read per key, so it takes O(B·Lk) memory where the materialised
    /// `[B, 1, Lq, Lk]` mask took O(B·Lq·Lk) (2.4 GB at 32k tokens).
    CausalKeep {
        /// At most this many keys back (as [`Mask::SlidingWindow`]); `None`: plain causal.
        window: Option<usize>,
        /// Which keys are real tokens (nonzero) or padding (zero), `[B, Lk]` or `[Lk]`.
        keep: MaskTensor,
    },
    /// Llama 4's chunked local attention: causal (bottom-right aligned, query `i` at position
    /// `p = i + Lk − Lq`), and only the keys of its own chunk of `chunk` positions
    /// (`j / chunk == p / chunk`); with `keep` (`[B, Lk]`, or `[Lk]` for a batch of one;
    /// nonzero = a real token), only those keys too. Generated in the shader.
    Chunked {
        /// Positions per chunk (`attention_chunk_size`).
        chunk: usize,
        /// Which keys are real tokens (nonzero) or padding (zero), `[B, Lk]` or `[Lk]`;
        /// `None`: all are real.
        keep: Option<MaskTensor>,
    },
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
            Mask::SlidingWindow(_) => "sliding_window",
            Mask::KeyPadding(_) => "key_padding",
            Mask::Attend(_) => "attend",
            Mask::Block(_) => "block",
            Mask::Bias(_) => "bias",
            Mask::CausalKeep { .. } => "causal_padded",
            Mask::Chunked { .. } => "chunked",
        }
    }

    /// Checks the mask against a problem: tensor masks must broadcast to `[B, H, Lq, Lk]`,
    /// key padding needs one length per batch, none longer than `Lk`.
    pub fn check(&self, dims: AttnDims) -> Result<()> {
        match self {
            Mask::None | Mask::Causal => Ok(()),
            Mask::SlidingWindow(0) => Err(Error::Mask(
                "a sliding window of 0 keys hides every key; it must be at least 1".into(),
            )),
            Mask::SlidingWindow(_) => Ok(()),
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
            Mask::CausalKeep {
                window: Some(0), ..
            } => Err(Error::Mask(
                "a sliding window of 0 keys hides every key; it must be at least 1".into(),
            )),
            Mask::Chunked { chunk: 0, .. } => Err(Error::Mask(
                "a chunk of 0 keys hides every key; it must be at least 1".into(),
            )),
            Mask::Chunked { keep: None, .. } => Ok(()),
            Mask::CausalKeep { keep, .. }
            | Mask::Chunked {
                keep: Some(keep), ..
            } => {
                let (b, lk) = (dims.batch, dims.lk);
                if keep.shape() != [b, lk] && !(b == 1 && keep.shape() == [lk]) {
                    return Err(Error::Mask(format!(
                        "a key padding mask must be [B, Lk] = [{b}, {lk}], got {:?}",
                        keep.shape()
                    )));
                }
                // The shaders index the keep bytes in u32.
                if b.saturating_mul(lk) > u32::MAX as usize {
                    return Err(Error::Mask(format!(
                        "a key padding mask of [{b}, {lk}] has more than 2^32 elements"
                    )));
                }
                Ok(())
            }
        }
    }

    /// The compact padded causal mask of a Hugging Face decoder: causal (or `window` keys
    /// back), and the keys `attention_mask` marks real (`[B, Lk]`, 1 = a real token).
    pub fn causal_with_padding(window: Option<usize>, attention_mask: &MaskTensor) -> Mask {
        Mask::CausalKeep {
            window,
            keep: attention_mask.clone(),
        }
    }
}

/// A key padding mask `[B, Lk]` (`[Lk]` for a batch of one) in one of the two conventions users
/// bring — never a bare bool.
#[derive(Debug, Clone, PartialEq)]
pub enum PaddingMask {
    /// PyTorch's `key_padding_mask`: nonzero (true) = padding, masked.
    TorchPadding(MaskTensor),
    /// Hugging Face's `attention_mask`: nonzero (1) = a real token, 0 = padding.
    HfAttention(MaskTensor),
}

impl PaddingMask {
    /// `padded[b·Lk + j]`: whether key `j` of batch `b` is padding.
    fn padded(&self, dims: AttnDims) -> Result<Vec<bool>> {
        let (t, padding_is) = match self {
            PaddingMask::TorchPadding(t) => (t, true),
            PaddingMask::HfAttention(t) => (t, false),
        };
        let (b, lk) = (dims.batch, dims.lk);
        if t.shape() != [b, lk] && !(b == 1 && t.shape() == [lk]) {
            return Err(Error::Mask(format!(
                "a key padding mask must be [B, Lk] = [{b}, {lk}], got {:?}",
                t.shape()
            )));
        }
        Ok(t.data().iter().map(|&v| (v != 0) == padding_is).collect())
    }
}

impl Mask {
    /// This mask combined with a key padding mask, as `nn.MultiheadAttention` combines
    /// `attn_mask` with `key_padding_mask`, materialised as one `[B, H or 1, Lq or 1, Lk]` mask:
    /// a boolean mask stays boolean (a padded key is masked; a row with every key masked keeps
    /// the seeds' −1e9 answer, the mean of V), a bias gets −inf at padded keys (a row with every
    /// key at −inf is NaN, as PyTorch's default call gives).
    pub fn with_key_padding(&self, padding: &PaddingMask, dims: AttnDims) -> Result<Mask> {
        let (b, lq, lk) = (dims.batch, dims.lq, dims.lk);
        let padding = padding.padded(dims)?;
        self.check(dims)?;
        let per_head = matches!(self, Mask::Attend(t) | Mask::Block(t) if t.shape().len() == 4 && t.shape()[1] > 1)
            || matches!(self, Mask::Bias(t) if t.shape().len() == 4 && t.shape()[1] > 1);
        let h = if per_head { dims.heads } else { 1 };
        let rows = if matches!(self, Mask::None) { 1 } else { lq };
        let shape = vec![b, h, rows, lk];
        let at = |n: usize| {
            let (j, rest) = (n % lk, n / lk);
            let (i, rest) = (rest % rows, rest / rows);
            (rest / h, rest % h, i, j)
        };
        let len = b * h * rows * lk;
        if let Mask::Bias(t) = self {
            let values = (0..len)
                .map(|n| {
                    let (bi, hi, i, j) = at(n);
                    match padding[bi * lk + j] {
                        true => f32::NEG_INFINITY,
                        false => t.data()[broadcast_index(t.shape(), (bi, hi, i, j))],
                    }
                })
                .collect();
            return Ok(Mask::Bias(Tensor::new(shape, values)?));
        }
        let masked: Vec<bool> = (0..len)
            .map(|n| {
                let (bi, hi, i, j) = at(n);
                padding[bi * lk + j] || self.hides((bi, hi, i, j), lq, lk)
            })
            .collect();
        Ok(Mask::Block(MaskTensor::from_bools(shape, &masked)?))
    }

    /// This mask over `dims.lk` keys, widened by `appended` keys that every query sees, as
    /// `nn.MultiheadAttention` pads `attn_mask` and `key_padding_mask` with zeros when it
    /// appends `bias_k` or a zero key: a boolean mask becomes a `Block` mask whose new columns
    /// are unmasked (a causal mask is materialised, still aligned to the input's keys), a bias
    /// gets 0 there. Dimensions a tensor broadcasts over stay broadcast.
    pub fn with_appended_keys(&self, appended: usize, dims: AttnDims) -> Result<Mask> {
        if appended == 0 || matches!(self, Mask::None) {
            return Ok(self.clone());
        }
        self.check(dims)?;
        // The extents over (B, H, Lq) the widened mask keeps.
        let lead = |shape: &[usize]| match shape {
            [b, h, i, _] => [*b, *h, *i],
            [b, i, _] => [*b, 1, *i],
            [i, _] => [1, 1, *i],
            _ => [1, 1, 1],
        };
        let [b, h, rows] = match self {
            Mask::None | Mask::Causal | Mask::SlidingWindow(_) => [1, 1, dims.lq],
            Mask::KeyPadding(_) => [dims.batch, 1, 1],
            Mask::Attend(t) | Mask::Block(t) => lead(t.shape()),
            Mask::Bias(t) => lead(t.shape()),
            Mask::CausalKeep { .. } | Mask::Chunked { keep: Some(_), .. } => {
                [dims.batch, 1, dims.lq]
            }
            Mask::Chunked { keep: None, .. } => [1, 1, dims.lq],
        };
        let (lk, wide) = (dims.lk, dims.lk + appended);
        let len = b * h * rows * wide;
        let at = |n: usize| {
            let (j, rest) = (n % wide, n / wide);
            let (i, rest) = (rest % rows, rest / rows);
            (rest / h, rest % h, i, j)
        };
        let shape = vec![b, h, rows, wide];
        if let Mask::Bias(t) = self {
            let values = (0..len)
                .map(|n| match at(n) {
                    (_, _, _, j) if j >= lk => 0.0,
                    at => t.data()[broadcast_index(t.shape(), at)],
                })
                .collect();
            return Ok(Mask::Bias(Tensor::new(shape, values)?));
        }
        let masked: Vec<bool> = (0..len)
            .map(|n| match at(n) {
                (_, _, _, j) if j >= lk => false,
                at => self.hides(at, dims.lq, lk),
            })
            .collect();
        Ok(Mask::Block(MaskTensor::from_bools(shape, &masked)?))
    }

    /// Whether a boolean mask hides key `j` from query `i` of (batch, head) (`false` for a bias,
    /// which is added instead).
    pub(crate) fn hides(&self, at: (usize, usize, usize, usize), lq: usize, lk: usize) -> bool {
        let (b, _, i, j) = at;
        match self {
            Mask::None | Mask::Bias(_) => false,
            Mask::Causal => j as i64 > i as i64 + lk as i64 - lq as i64,
            Mask::SlidingWindow(w) => {
                // Saturating, not clamped to Lk: a window of usize::MAX is no window (never a
                // negative one), and one longer than Lk still hides keys from a query whose
                // diagonal lies past the last key (top-left alignment with Lq > Lk).
                let last = i as i64 + lk as i64 - lq as i64;
                let w = i64::try_from(*w).unwrap_or(i64::MAX);
                j as i64 > last || j as i64 <= last.saturating_sub(w)
            }
            Mask::KeyPadding(len) => j >= len[b],
            Mask::CausalKeep { window, keep } => {
                let hidden_by_rule = match window {
                    Some(w) => Mask::SlidingWindow(*w).hides(at, lq, lk),
                    None => Mask::Causal.hides(at, lq, lk),
                };
                hidden_by_rule || keep.data()[b * lk + j] == 0
            }
            Mask::Chunked { chunk, keep } => {
                let p = i as i64 + lk as i64 - lq as i64;
                let c = i64::try_from(*chunk).unwrap_or(i64::MAX);
                let other_chunk = p >= 0 && (j as i64).div_euclid(c) != p.div_euclid(c);
                Mask::Causal.hides(at, lq, lk)
                    || other_chunk
                    || keep.as_ref().is_some_and(|k| k.data()[b * lk + j] == 0)
            }
            Mask::Attend(t) => t.data()[broadcast_index(t.shape(), at)] == 0,
            Mask::Block(t) => t.data()[broadcast_index(t.shape(), at)] != 0,
        }
    }
}

/// Row-major index into a tensor of rank 1–4 laid over `[B, H, Lq, Lk]` by the crate's rank
/// convention (3 → `[B, Lq, Lk]`), size-1 dimensions broadcast.
pub(crate) fn broadcast_index(
    shape: &[usize],
    (b, h, i, j): (usize, usize, usize, usize),
) -> usize {
    let coords: &[usize] = match shape.len() {
        4 => &[b, h, i, j],
        3 => &[b, i, j],
        2 => &[i, j],
        _ => &[j],
    };
    coords
        .iter()
        .zip(shape)
        .fold(0, |idx, (&c, &n)| idx * n + if n == 1 { 0 } else { c })
}

/// The sizes a mask is checked against: batch, heads, query and key lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    /// Batch size `B`.
    pub batch: usize,
    /// Query heads `H`.
    pub heads: usize,
    /// Queries per sequence `Lq`.
    pub lq: usize,
    /// Keys per sequence `Lk`.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn torch(shape: &[usize], padded: &[bool]) -> PaddingMask {
        PaddingMask::TorchPadding(MaskTensor::from_bools(shape, padded).unwrap())
    }

    fn dims(batch: usize, heads: usize, lq: usize, lk: usize) -> AttnDims {
        AttnDims {
            batch,
            heads,
            lq,
            lk,
        }
    }

    #[test]
    fn key_padding_alone_is_one_row_per_batch_in_either_convention() {
        let pad = [false, true, false, false];
        let m = Mask::None
            .with_key_padding(&torch(&[2, 2], &pad), dims(2, 3, 4, 2))
            .unwrap();
        assert_eq!(m, Mask::block([2, 1, 1, 2], &pad).unwrap());
        // Hugging Face's polarity: 1 = a real token.
        let hf = PaddingMask::HfAttention(MaskTensor::new([2, 2], vec![1, 0, 1, 1]).unwrap());
        assert_eq!(
            Mask::None.with_key_padding(&hf, dims(2, 3, 4, 2)).unwrap(),
            m
        );
        // A shape other than [B, Lk] is an error, not a guess; [Lk] only for one sequence.
        let flat = torch(&[4], &pad);
        assert!(Mask::None
            .with_key_padding(&flat, dims(2, 3, 4, 2))
            .is_err());
        assert!(Mask::None.with_key_padding(&flat, dims(1, 3, 4, 4)).is_ok());
    }

    #[test]
    fn key_padding_joins_causal_and_keeps_per_head_masks_per_head() {
        let m = Mask::Causal
            .with_key_padding(&torch(&[1, 3], &[false, false, true]), dims(1, 2, 2, 3))
            .unwrap();
        // Bottom-right causal: row 0 sees keys 0..=1, row 1 all; key 2 is padding.
        let want = [false, false, true, false, false, true];
        assert_eq!(m, Mask::block([1, 1, 2, 3], &want).unwrap());
        let per_head = Mask::block([1, 2, 1, 2], &[true, false, false, false]).unwrap();
        let m = per_head
            .with_key_padding(&torch(&[1, 2], &[false, true]), dims(1, 2, 1, 2))
            .unwrap();
        assert_eq!(
            m,
            Mask::block([1, 2, 1, 2], &[true, true, false, true]).unwrap()
        );
    }

    #[test]
    fn appended_keys_are_never_masked() {
        let d = dims(2, 3, 2, 2);
        assert_eq!(Mask::None.with_appended_keys(2, d).unwrap(), Mask::None);
        assert_eq!(Mask::Causal.with_appended_keys(0, d).unwrap(), Mask::Causal);
        // Causal stays aligned to the input's two keys; the appended one is seen by all.
        let want = [false, true, false, false, false, false];
        assert_eq!(
            Mask::Causal.with_appended_keys(1, d).unwrap(),
            Mask::block([1, 1, 2, 3], &want).unwrap()
        );
        // Key padding keeps its batch dimension; a length no longer hides what follows it.
        let want = [false, true, false, false, false, false];
        assert_eq!(
            Mask::KeyPadding(vec![1, 2])
                .with_appended_keys(1, d)
                .unwrap(),
            Mask::block([2, 1, 1, 3], &want).unwrap()
        );
        // Attend polarity turns into Block; a broadcast key dimension is expanded first.
        let attend = Mask::attend([1, 1], vec![0]).unwrap();
        assert_eq!(
            attend.with_appended_keys(2, d).unwrap(),
            Mask::block([1, 1, 1, 4], &[true, true, false, false]).unwrap()
        );
        let bias = Mask::Bias(Tensor::new([2], vec![f32::NEG_INFINITY, 0.5]).unwrap());
        match bias.with_appended_keys(1, d).unwrap() {
            Mask::Bias(t) => {
                assert_eq!(t.shape(), [1, 1, 1, 3]);
                assert_eq!(t.data(), [f32::NEG_INFINITY, 0.5, 0.0]);
            }
            other => panic!("{other:?}"),
        }
        // A mask that does not fit the input's keys is still an error.
        assert!(Mask::block([3], &[false; 3])
            .unwrap()
            .with_appended_keys(1, d)
            .is_err());
    }

    #[test]
    fn key_padding_on_a_bias_is_minus_infinity() {
        let bias = Mask::Bias(Tensor::new([1, 2], vec![0.5, -1.0]).unwrap());
        let padding = torch(&[1, 2], &[true, false]);
        match bias.with_key_padding(&padding, dims(1, 1, 1, 2)).unwrap() {
            Mask::Bias(t) => assert_eq!(t.data(), [f32::NEG_INFINITY, -1.0]),
            other => panic!("{other:?}"),
        }
    }
}
