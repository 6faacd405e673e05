//! Masks as the seeds and PyTorch store them in a safetensors file (DESIGN, "Real checkpoints"):
//!
//! * `mask` (U8/BOOL, 0 = masked: seed 000) or `attn_mask` (U8/BOOL, true = masked: seed 001 and
//!   `nn.MultiheadAttention`; F32/F16/BF16: added to the scaled scores, −inf included);
//! * `key_padding_mask [B, Lk]` (`[Lk]` for one sequence; U8/BOOL, true = padding, PyTorch's
//!   polarity), alone or combined
//!   with either of the above as `nn.MultiheadAttention` combines them
//!   ([`Mask::with_key_padding`]).
//!
//! Ranks follow the crate's convention (4 → `[B, H, Lq, Lk]`, 3 → `[B, Lq, Lk]`, 2 → `[Lq, Lk]`).

use safetensors::Dtype;

use crate::error::{Error, Result};
use crate::io::safetensors::SafetensorsFile;
use crate::model::mask::{AttnDims, Mask, PaddingMask};

/// The file's mask for a problem of `dims` (checked against it), [`Mask::None`] without one.
pub fn read_mask(file: &SafetensorsFile, dims: AttnDims) -> Result<Mask> {
    let mask = match (file.contains("mask"), file.contains("attn_mask")) {
        (true, true) => {
            return Err(Error::file(
                file.name(),
                "has both `mask` (0 = masked) and `attn_mask` (true = masked); give one",
            ))
        }
        (true, false) => Mask::Attend(file.mask_tensor("mask")?),
        (false, true) => match file.dtype("attn_mask") {
            Some(Dtype::F32 | Dtype::F16 | Dtype::BF16) => {
                Mask::Bias(file.tensor_f32("attn_mask")?)
            }
            _ => Mask::Block(file.mask_tensor("attn_mask")?),
        },
        (false, false) => Mask::None,
    };
    mask.check(dims)?;
    if !file.contains("key_padding_mask") {
        return Ok(mask);
    }
    let padding = PaddingMask::TorchPadding(file.mask_tensor("key_padding_mask")?);
    mask.with_key_padding(&padding, dims)
        .map_err(|e| file.tensor_error("key_padding_mask", e))
}
