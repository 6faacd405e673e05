//! [`KvCache::read_keys_values`]: the cached keys and values back on the host, as f32 (a
//! quantized cache's dequantized), e.g. to check what a cache holds or to measure what its
//! quantization costs.

use super::KvCache;
use crate::error::Result;
use crate::kv_dtype::{self, KvDtype};
use crate::model::tensor::Tensor;
use crate::sdpa::DeviceTensor;

impl KvCache {
    /// The first [`len`](Self::len) tokens' keys `[B, H_kv, len, dk]` and values
    /// `[B, H_kv, len, dv]` (RoPE applied), read back as f32: a quantized cache's values as its
    /// blocks decode them, exactly what its steps attend to. Waits for the GPU.
    pub fn read_keys_values(&self, gpu: &crate::Gpu) -> Result<(Tensor, Tensor)> {
        let [kv_heads, dk, dv] = self.kv_dims;
        let keys = self.read_views(gpu, &self.keys(), dk)?;
        let values = self.read_views(gpu, &self.values(), dv)?;
        Ok((
            Tensor::new([self.batch, kv_heads, self.len, dk], keys)?,
            Tensor::new([self.batch, kv_heads, self.len, dv], values)?,
        ))
    }

    /// Rows of `d` values of every view, gathered into `[B, H_kv, len, d]`.
    fn read_views(
        &self,
        gpu: &crate::Gpu,
        views: &[super::KvView<'_>],
        d: usize,
    ) -> Result<Vec<f32>> {
        let [kv_heads, _, _] = self.kv_dims;
        let blocks = self.batch * kv_heads;
        let mut out = vec![0f32; blocks * self.len * d];
        for view in views {
            let values = read_tensor(gpu, &view.tensor, self.format.dtype)?;
            let t = &view.tensor;
            let row = t.shape[3].max(d);
            for blk in 0..blocks {
                for (i, tok) in view.tokens.clone().enumerate() {
                    // The view's rows: offset + block·capacity·row + i·row (Bhld).
                    let from = t.offset + (blk * t.capacity + i) * row;
                    let to = (blk * self.len + tok) * d;
                    out[to..to + d].copy_from_slice(&values[from..from + d]);
                }
            }
        }
        Ok(out)
    }
}

/// A cache buffer's every logical element as f32.
fn read_tensor(gpu: &crate::Gpu, t: &DeviceTensor, dtype: KvDtype) -> Result<Vec<f32>> {
    let bytes = t.buffer.size();
    let staging = gpu.staging("KV cache readback", bytes);
    gpu.scoped("reading a KV cache", || {
        let mut encoder = gpu.encoder("KV cache readback");
        encoder.copy_buffer_to_buffer(t.buffer, 0, &staging, 0, bytes);
        gpu.queue().submit([encoder.finish()]);
    })?;
    let raw = gpu.read_bytes(&staging, bytes)?;
    Ok(match dtype {
        KvDtype::F32 => bytemuck::pod_collect_to_vec(&raw),
        KvDtype::F16 => raw
            .chunks_exact(2)
            .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
            .collect(),
        quant => {
            let words: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
            // The elements the quants plane holds: all of its words' (up to the scales).
            let elements = t.scales * 32 / quant.quant_bits() as usize;
            kv_dtype::dequantize(quant, &words, elements)?
        }
    })
}
