//! [`KvDtype`]: the element type of cached keys and values — f32, f16, or llama.cpp's q8_0 and
//! q4_0 blocks — and the CPU side of the block formats (quantize, dequantize), which the tests
//! and benches check the device's against.
//!
//! **The blocks** are llama.cpp's, along the head dimension: 32 consecutive values share one f16
//! scale `d`; q8_0 keeps `q = round(x / d)` in 8 bits (`d = amax / 127`), q4_0 keeps
//! `q = min(15, floor(x / d + 8.5))` in 4 bits (`d = max / −8`, `max` the value of largest
//! magnitude, with its sign) and reads `(q − 8)·d`. Both divide by the scale as stored (f16), not
//! as computed, so a q8_0 value round-trips within `|d|/2`, and so does every q4_0 value but
//! those at the clamp (`x/d ≥ 7.5`, within `|d|` and the f16 rounding of the scale, a 2⁻⁸ part of it). 34 and 18 bytes per block.
//!
//! **On the device** a quantized buffer is two planes of u32 words, so that every load is an
//! aligned word (WGSL has no 16-bit or byte loads, and a 34-byte block is not word-aligned): the
//! quants of logical elements `0..E` (element `e` in byte `e` — q8_0, two's complement — or in
//! nibble `e` — q4_0, low nibble first, stored `q`), then the scales, element `e`'s at f16 half
//! `2·scales + e/32` (`scales` = [`KvDtype::scales_word`] of `E`). "Logical element" is what an
//! f32 buffer of the same shape would index: the passes find rows as before, only the load
//! changes. The bytes are the blocks' (8.5 or 4.5 bits per value), rounded up to a word.

use crate::error::{Error, Result};

/// Values per block of a quantized type.
pub const BLOCK: usize = 32;

/// The element type of a KV cache or a page pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    /// Plain f32 values (the default).
    #[default]
    F32,
    /// Needs the device's `SHADER_F16`.
    F16,
    /// llama.cpp's q8_0: 32 values, an f16 scale, 8-bit values (34 bytes).
    Q8_0,
    /// llama.cpp's q4_0: 32 values, an f16 scale, 4-bit values (18 bytes).
    Q4_0,
}

impl KvDtype {
    /// `"f32"`, `"f16"`, `"q8_0"` or `"q4_0"` (any case; `float32`/`float16` too).
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(KvDtype::F32),
            "f16" | "float16" | "fp16" | "half" => Ok(KvDtype::F16),
            "q8_0" => Ok(KvDtype::Q8_0),
            "q4_0" => Ok(KvDtype::Q4_0),
            other => Err(Error::Misuse(format!(
                "kv dtype `{other}`: expected f32, f16, q8_0 or q4_0"
            ))),
        }
    }

    /// The lower-case name [`KvDtype::parse`] reads: `"f32"`, `"f16"`, `"q8_0"` or `"q4_0"`.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// Whether values are stored in blocks with a scale.
    pub fn quantized(self) -> bool {
        matches!(self, KvDtype::Q8_0 | KvDtype::Q4_0)
    }

    /// Bits of one value of a quant (8, 4), 0 for a float type.
    pub fn quant_bits(self) -> u32 {
        match self {
            KvDtype::Q8_0 => 8,
            KvDtype::Q4_0 => 4,
            _ => 0,
        }
    }

    /// `Err` naming the head size when it is not whole blocks (a quantized type needs a
    /// multiple of 32: a block never straddles two rows).
    pub fn check_head_dim(self, what: &str, d: usize) -> Result<()> {
        if self.quantized() && (d == 0 || !d.is_multiple_of(BLOCK)) {
            return Err(Error::Config(format!(
                "{what} {d} is not a multiple of {BLOCK}: a {} cache stores blocks of {BLOCK} \
                 values along the head",
                self.name()
            )));
        }
        Ok(())
    }

    /// The word where the scales plane of a buffer of `elements` logical elements starts
    /// (the quants' words before it); 0 for a float type.
    pub fn scales_word(self, elements: usize) -> usize {
        match self {
            KvDtype::Q8_0 => elements.div_ceil(4),
            KvDtype::Q4_0 => elements.div_ceil(8),
            _ => 0,
        }
    }

    /// Bytes a buffer of `elements` logical elements takes (a quantized one rounded up to whole
    /// words of each plane).
    pub fn bytes_for(self, elements: usize) -> u64 {
        match self {
            KvDtype::F32 => 4 * elements as u64,
            KvDtype::F16 => 2 * elements as u64,
            KvDtype::Q8_0 | KvDtype::Q4_0 => {
                4 * (self.scales_word(elements) + elements.div_ceil(2 * BLOCK)) as u64
            }
        }
    }

    /// Bytes of `values` values, exactly (34 per 32 for q8_0, 18 for q4_0): what a token costs.
    pub fn bytes_per(self, values: usize) -> u64 {
        match self {
            KvDtype::F32 => 4 * values as u64,
            KvDtype::F16 => 2 * values as u64,
            KvDtype::Q8_0 => (34 * values / BLOCK) as u64,
            KvDtype::Q4_0 => (18 * values / BLOCK) as u64,
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A block's scale as stored: f16, saturated to f16's largest finite value (a block of values
/// past ±8.3e6 in q8_0 clamps rather than becoming NaN).
fn stored_scale(d: f32) -> half::f16 {
    half::f16::from_f32(d.clamp(-65504.0, 65504.0))
}

/// One block's scale and quants (`q`, as stored: two's complement q8_0, `0..=15` q4_0).
pub fn quantize_block(dtype: KvDtype, x: &[f32]) -> (half::f16, Vec<i32>) {
    match dtype {
        KvDtype::Q8_0 => {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = stored_scale(amax / 127.0);
            let id = match d.to_f32() {
                0.0 => 0.0,
                d => 1.0 / d,
            };
            // f32::round is half away from zero, as llama.cpp's roundf.
            (
                d,
                x.iter()
                    .map(|v| (v * id).round().clamp(-127.0, 127.0) as i32)
                    .collect(),
            )
        }
        _ => {
            let max = x
                .iter()
                .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            let d = stored_scale(max / -8.0);
            let id = match d.to_f32() {
                0.0 => 0.0,
                d => 1.0 / d,
            };
            (
                d,
                x.iter()
                    .map(|v| (v * id + 8.5).floor().clamp(0.0, 15.0) as i32)
                    .collect(),
            )
        }
    }
}

/// Value of quant `q` at scale `d`.
pub fn dequantize_value(dtype: KvDtype, d: half::f16, q: i32) -> f32 {
    match dtype {
        KvDtype::Q8_0 => q as f32 * d.to_f32(),
        _ => (q - 8) as f32 * d.to_f32(),
    }
}

/// `x` (whole blocks) in the device's planes (see the module's docs).
pub fn quantize(dtype: KvDtype, x: &[f32]) -> Result<Vec<u32>> {
    if !dtype.quantized() || !x.len().is_multiple_of(BLOCK) {
        return Err(Error::Misuse(format!(
            "quantize: {} values as {dtype} (a quantized type, whole blocks of {BLOCK})",
            x.len()
        )));
    }
    let words = (dtype.bytes_for(x.len()) / 4) as usize;
    let mut out = vec![0u32; words];
    let (bits, scales) = (dtype.quant_bits() as usize, dtype.scales_word(x.len()));
    for (blk, chunk) in x.chunks(BLOCK).enumerate() {
        let (d, q) = quantize_block(dtype, chunk);
        out[scales + blk / 2] |= (d.to_bits() as u32) << (16 * (blk % 2));
        for (i, q) in q.into_iter().enumerate() {
            let e = blk * BLOCK + i;
            let mask = (1u32 << bits) - 1;
            let at = e * bits;
            out[at / 32] |= (q as u32 & mask) << (at % 32);
        }
    }
    Ok(out)
}

/// The `elements` values the planes `words` hold.
pub fn dequantize(dtype: KvDtype, words: &[u32], elements: usize) -> Result<Vec<f32>> {
    if !dtype.quantized() || (words.len() as u64) * 4 < dtype.bytes_for(elements) {
        return Err(Error::Misuse(format!(
            "dequantize: {} words as {elements} {dtype} values",
            words.len()
        )));
    }
    let (bits, scales) = (dtype.quant_bits() as usize, dtype.scales_word(elements));
    Ok((0..elements)
        .map(|e| {
            let blk = e / BLOCK;
            let d = half::f16::from_bits((words[scales + blk / 2] >> (16 * (blk % 2))) as u16);
            let at = e * bits;
            let raw = (words[at / 32] >> (at % 32)) & ((1u32 << bits) - 1);
            let q = match dtype {
                KvDtype::Q8_0 => raw as u8 as i8 as i32,
                _ => raw as i32,
            };
            dequantize_value(dtype, d, q)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..4 * BLOCK)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let v = (s % 20_001) as f32 / 10_000.0 - 1.0;
                if i % 37 == 0 {
                    v * 50.0
                } else {
                    v
                }
            })
            .collect()
    }

    #[test]
    fn blocks_round_trip_within_half_a_step() {
        for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
            for seed in 1..20 {
                let mut x = sample(seed);
                x[5] = 0.0;
                x[40..72].fill(0.0); // an all-zero block: scale 0, values 0
                let words = quantize(dtype, &x).unwrap();
                assert_eq!(words.len() as u64 * 4, dtype.bytes_for(x.len()));
                let y = dequantize(dtype, &words, x.len()).unwrap();
                for (blk, (xs, ys)) in x.chunks(BLOCK).zip(y.chunks(BLOCK)).enumerate() {
                    let (d, _) = quantize_block(dtype, xs);
                    let d = d.to_f32().abs();
                    for (i, (&a, &b)) in xs.iter().zip(ys).enumerate() {
                        let clamped = dtype == KvDtype::Q4_0
                            && a * -8.0
                                / xs.iter()
                                    .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
                                >= 7.5;
                        let bound = if clamped { d } else { d / 2.0 } * (1.0 + 1e-6);
                        assert!(
                            (a - b).abs() <= bound,
                            "{dtype} block {blk}[{i}]: {a} → {b}, d {d}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn sizes_are_the_blocks_bytes() {
        assert_eq!(KvDtype::Q8_0.bytes_per(128), 136);
        assert_eq!(KvDtype::Q4_0.bytes_per(128), 72);
        assert_eq!(KvDtype::Q8_0.bytes_for(32 * 64), 34 * 64);
        assert_eq!(KvDtype::Q4_0.bytes_for(32 * 64), 18 * 64);
        // One block: its scale's word is a whole word.
        assert_eq!(KvDtype::Q8_0.bytes_for(32), 36);
        assert!(KvDtype::Q8_0.check_head_dim("head_dim", 96).is_ok());
        assert!(KvDtype::Q4_0.check_head_dim("head_dim", 80).is_err());
        assert!(KvDtype::F16.check_head_dim("head_dim", 3).is_ok());
        assert_eq!(KvDtype::parse("Q8_0").unwrap(), KvDtype::Q8_0);
        assert!(KvDtype::parse("q5_1").is_err());
    }
}
