//! `run`'s PyTorch input layouts: batch-first `[B, L, E]` (the engine's), sequence-first
//! `[L, B, E]` (`--seq-first`: `nn.MultiheadAttention`'s default, `batch_first=False`) and
//! unbatched `[L, E]`. Inputs are brought to batch-first, outputs back to the caller's layout,
//! and the attention weights are shaped as PyTorch returns them.

use wgpu_mha::{Error, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputLayout {
    BatchFirst,
    SeqFirst,
    Unbatched,
}

impl InputLayout {
    /// The layout of a query of `rank` dimensions.
    pub fn of(rank: usize, seq_first: bool) -> Result<Self, Error> {
        match (rank, seq_first) {
            (3, false) => Ok(InputLayout::BatchFirst),
            (3, true) => Ok(InputLayout::SeqFirst),
            (2, _) => Ok(InputLayout::Unbatched),
            _ => Err(Error::Misuse(format!(
                "inputs of rank {rank}: expected [B, L, E], [L, B, E] with --seq-first, or \
                 unbatched [L, E]"
            ))),
        }
    }

    /// An input tensor in the engine's `[B, L, E]`.
    pub fn to_batch_first(self, t: Tensor, name: &str) -> Result<Tensor, Error> {
        let want = if self == InputLayout::Unbatched { 2 } else { 3 };
        if t.shape().len() != want {
            return Err(Error::Misuse(format!(
                "input `{name}` has shape {:?}, but the query's layout ({self:?}) needs rank {want}",
                t.shape()
            )));
        }
        match self {
            InputLayout::BatchFirst => Ok(t),
            InputLayout::SeqFirst => swap_first_two(&t),
            InputLayout::Unbatched => {
                let shape = [&[1], t.shape()].concat();
                Tensor::new(shape, t.into_data())
            }
        }
    }

    /// The module's `[B, Lq, E_out]` output in the caller's layout.
    pub fn output(self, t: Tensor) -> Result<Tensor, Error> {
        match self {
            InputLayout::BatchFirst => Ok(t),
            InputLayout::SeqFirst => swap_first_two(&t),
            InputLayout::Unbatched => {
                let shape = t.shape()[1..].to_vec();
                Tensor::new(shape, t.into_data())
            }
        }
    }

    /// Attention weights `[B, H, Lq, Lk]` as PyTorch returns them: averaged over heads with
    /// `average` (`average_attn_weights=True`: `[B, Lq, Lk]`), without the batch when unbatched.
    pub fn weights(self, probs: Tensor, average: bool) -> Result<Tensor, Error> {
        let [b, h, lq, lk] = match *probs.shape() {
            [b, h, lq, lk] => [b, h, lq, lk],
            _ => {
                return Err(Error::Misuse(
                    "attention weights must be [B, H, Lq, Lk]".into(),
                ))
            }
        };
        let probs = if average {
            let mut mean = vec![0.0f32; b * lq * lk];
            for (n, p) in probs.data().iter().enumerate() {
                let (bi, rest) = (n / (h * lq * lk), n % (lq * lk));
                mean[bi * lq * lk + rest] += p / h as f32;
            }
            Tensor::new([b, lq, lk], mean)?
        } else {
            probs
        };
        match self {
            InputLayout::Unbatched => {
                let shape = probs.shape()[1..].to_vec();
                Tensor::new(shape, probs.into_data())
            }
            _ => Ok(probs),
        }
    }
}

/// `[X, Y, Z] -> [Y, X, Z]`.
fn swap_first_two(t: &Tensor) -> Result<Tensor, Error> {
    let [x, y, z] = match *t.shape() {
        [x, y, z] => [x, y, z],
        _ => {
            return Err(Error::Misuse(format!(
                "expected rank 3, got {:?}",
                t.shape()
            )))
        }
    };
    let d = t.data();
    let mut out = Vec::with_capacity(d.len());
    for j in 0..y {
        for i in 0..x {
            out.extend_from_slice(&d[(i * y + j) * z..(i * y + j + 1) * z]);
        }
    }
    Tensor::new([y, x, z], out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_first_round_trips_and_moves_the_batch() {
        let t = Tensor::new([2, 3, 2], (0..12).map(|v| v as f32).collect()).unwrap();
        let b = InputLayout::SeqFirst
            .to_batch_first(t.clone(), "q")
            .unwrap();
        assert_eq!(b.shape(), [3, 2, 2]);
        // Batch 1, position 0 is sequence position 0 of batch 1 in [L, B, E].
        assert_eq!(&b.data()[4..6], &[2.0, 3.0]);
        assert_eq!(InputLayout::SeqFirst.output(b).unwrap(), t);
    }

    #[test]
    fn unbatched_gains_and_loses_a_batch_of_one() {
        let t = Tensor::new([3, 2], vec![1.0; 6]).unwrap();
        let b = InputLayout::Unbatched
            .to_batch_first(t.clone(), "q")
            .unwrap();
        assert_eq!(b.shape(), [1, 3, 2]);
        assert_eq!(InputLayout::Unbatched.output(b).unwrap(), t);
        assert!(InputLayout::of(4, false).is_err());
        assert!(InputLayout::Unbatched
            .to_batch_first(Tensor::zeros([1, 3, 2]), "k")
            .is_err());
    }

    #[test]
    fn averaged_weights_are_the_mean_over_heads() {
        let p = Tensor::new([1, 2, 1, 2], vec![0.2, 0.8, 0.6, 0.4]).unwrap();
        let avg = InputLayout::BatchFirst.weights(p.clone(), true).unwrap();
        assert_eq!(avg.shape(), [1, 1, 2]);
        assert!((avg.data()[0] - 0.4).abs() < 1e-6 && (avg.data()[1] - 0.6).abs() < 1e-6);
        assert_eq!(
            InputLayout::Unbatched.weights(p, false).unwrap().shape(),
            [2, 1, 2]
        );
    }
}
