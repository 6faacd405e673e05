//! How a `KvCache` stores its keys and values: in one buffer, or — when they would exceed one
//! storage binding — in chunks, each its own K and V buffers, sized so that no key range an
//! attention pass reads in one dispatch crosses a chunk's end.

use crate::attention::MultiHeadAttention;
use crate::error::{Error, Result};

/// How a cache stores its keys and values.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Chunks {
    /// In one buffer when that fits a storage binding, else in the largest chunks that do.
    Auto,
    /// In chunks of (at least) this many tokens.
    Keys(usize),
}

/// Tokens per chunk are a multiple of this: of the decode pass's largest split and of the
/// flash pass's key tile, so neither pass reads across a chunk's end.
pub(crate) fn chunk_unit(mha: &MultiHeadAttention) -> usize {
    let tile = mha.flash.as_ref().map_or(1, |f| f.kv_tile() as usize);
    let split = crate::kernels::decode::MAX_KEYS_PER_SPLIT;
    split / gcd(split, tile) * tile
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The most tokens per chunk whose keys or values fit one binding of `limit` bytes.
pub(crate) fn largest_chunk(
    mha: &MultiHeadAttention,
    batch: usize,
    limit: u64,
    dtype: crate::KvDtype,
) -> Result<usize> {
    let c = &mha.config;
    let values = batch * c.kv_heads * c.qk_head_dim.max(c.v_head_dim);
    // A float cache stores the module's type; a quantized one its blocks (plus a word of
    // rounding per plane).
    let per_token = match dtype.quantized() {
        true => dtype.bytes_per(values) + 1,
        false => mha.qkv_elem_bytes() * values as u64,
    };
    let unit = chunk_unit(mha) as u64;
    let units = limit / (per_token * unit).max(1);
    if units == 0 {
        return Err(Error::TooLarge {
            what: format!(
                "a KV cache chunk of {unit} tokens (the smallest the attention passes read)"
            ),
            needed: per_token * unit,
            limit,
        });
    }
    Ok((units * unit) as usize)
}

#[cfg(test)]
mod tests {
    use super::gcd;

    #[test]
    fn gcd_of_split_and_tile_sizes() {
        assert_eq!(gcd(512, 32), 32);
        assert_eq!(gcd(512, 24), 8);
        assert_eq!(gcd(7, 0), 7);
        // The unit is then 512 for a 32-key tile and 1,536 for a 24-key one.
        assert_eq!(512 / gcd(512, 24) * 24, 1536);
    }
}
