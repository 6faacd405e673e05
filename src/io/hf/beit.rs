//! BEiT's relative position bias (beit, data2vec-vision): a learned table of
//! `(2·Wh − 1)(2·Ww − 1) + 3` rows × heads, indexed by the 2-D offset between two patches of
//! the config's `Wh × Ww` grid (and three rows for [CLS] to patch, patch to [CLS], [CLS] to
//! itself), added to the scores as an `[1, H, N, N]` bias, N = Wh·Ww + 1. Per layer
//! (`use_relative_position_bias`) or one for the stack (`use_shared_relative_position_bias`);
//! both: their sum, as transformers adds them.

use serde_json::Value;

use super::config::HfConfig;
use super::HfCheckpoint;
use crate::error::{Error, Result};
use crate::model::tensor::Tensor;

/// Where a layer's own table sits under its module's prefix.
pub(super) const LAYER_TABLE: &str =
    "attention.relative_position_bias.relative_position_bias_table";

impl HfCheckpoint {
    /// The bias of the module at `prefix`, or `None` when the config switches neither on.
    pub(super) fn beit_position_bias(
        &self,
        prefix: &str,
        c: &HfConfig,
        heads: usize,
    ) -> Result<Option<Tensor>> {
        let own = c.flag("use_relative_position_bias")? == Some(true);
        let shared = c.flag("use_shared_relative_position_bias")? == Some(true);
        let stack = prefix.split(".layer.").next().unwrap_or_default();
        let mut names = Vec::new();
        if own {
            names.push(format!("{prefix}{LAYER_TABLE}"));
        }
        if shared {
            names.push(format!(
                "{stack}.relative_position_bias.relative_position_bias_table"
            ));
        }
        if names.is_empty() {
            return Ok(None);
        }
        let (wh, ww) = grid(c)?;
        let rows = (2 * wh - 1) * (2 * ww - 1) + 3;
        let n = wh * ww + 1;
        let mut values = vec![0f32; heads * n * n];
        for name in names {
            let (shape, table) = self.read(&name)?;
            if shape != [rows, heads] {
                return Err(Error::weight(
                    name,
                    format!(
                        "has shape {shape:?}, expected [{rows}, {heads}]: the relative distances \
                         of the config's {wh}×{ww} patch grid and the 3 [CLS] rows, per head"
                    ),
                ));
            }
            for i in 0..n {
                for j in 0..n {
                    let row = index(i, j, wh, ww, rows);
                    for h in 0..heads {
                        values[(h * n + i) * n + j] += table[row * heads + h];
                    }
                }
            }
        }
        Ok(Some(Tensor::new([1, heads, n, n], values)?))
    }
}

/// The table row of query token `i` and key token `j` (0 = [CLS]), as transformers'
/// `generate_relative_position_index`.
fn index(i: usize, j: usize, wh: usize, ww: usize, rows: usize) -> usize {
    match (i, j) {
        (0, 0) => rows - 1,
        (0, _) => rows - 3,
        (_, 0) => rows - 2,
        _ => {
            let (ri, ci) = ((i - 1) / ww, (i - 1) % ww);
            let (rj, cj) = ((j - 1) / ww, (j - 1) % ww);
            (ri + wh - 1 - rj) * (2 * ww - 1) + (ci + ww - 1 - cj)
        }
    }
}

/// The patch grid `(image_size / patch_size)` per side (defaults 224 and 16).
fn grid(c: &HfConfig) -> Result<(usize, usize)> {
    let patch = c.usize("patch_size")?.unwrap_or(16);
    let bad = |v: &Value| {
        Error::file(
            c.source(),
            format!("config.json `image_size` = {v} is not a positive integer or a pair of them"),
        )
    };
    let side = |v: &Value| v.as_u64().filter(|&s| s >= 1).map(|s| s as usize);
    let (h, w) = match c.get("image_size") {
        None | Some(Value::Null) => (224, 224),
        Some(v) => match (side(v), v.as_array().map(Vec::as_slice)) {
            (Some(s), _) => (s, s),
            (None, Some([a, b])) => (
                side(a).ok_or_else(|| bad(v))?,
                side(b).ok_or_else(|| bad(v))?,
            ),
            _ => return Err(bad(v)),
        },
    };
    let (wh, ww) = (h / patch, w / patch);
    if wh == 0 || ww == 0 || wh.checked_mul(ww).is_none_or(|a| a > 1 << 16) {
        return Err(Error::file(
            c.source(),
            format!(
                "config.json image_size {h}×{w} with patch_size {patch} is no usable patch grid"
            ),
        ));
    }
    Ok((wh, ww))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_transformers_relative_position_index() {
        // 2×2 grid: 9 offsets + 3 [CLS] rows.
        let (wh, ww, rows) = (2, 2, 12);
        assert_eq!(index(0, 0, wh, ww, rows), 11);
        assert_eq!(index(0, 3, wh, ww, rows), 9);
        assert_eq!(index(2, 0, wh, ww, rows), 10);
        // A patch to itself: offset (0, 0) = (wh − 1)·(2ww − 1) + (ww − 1).
        assert_eq!(index(1, 1, wh, ww, rows), 4);
        assert_eq!(index(4, 4, wh, ww, rows), 4);
        // Patch (0, 0) to patch (1, 1): offset (−1, −1).
        assert_eq!(index(1, 4, wh, ww, rows), 0);
        assert_eq!(index(4, 1, wh, ww, rows), 8);
    }
}
