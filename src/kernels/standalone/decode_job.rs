//! [`Job::decode`] and [`Job::decode_kv`]: the decode pass (and its reduce) alone, over keys
//! and values stored as f32, f16 or quantized blocks — what `bench --only decode --kv …` times.

use super::{expect_len, Job};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::kernels::mask::{EncodedMask, MaskBuffers};
use crate::kernels::{decode, softmax, CoreDims, CoreProblem, KvFormat, QkvBuffers, QkvLayout};
use crate::kv_dtype::{self, KvDtype};
use crate::model::mask::Mask;

/// What a decode job's K and V hold: the values the pass reads (rounded through f16, or the
/// blocks decoded), for checking its output.
#[derive(Debug, Clone)]
pub struct StoredKv {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl Job {
    /// The decode pass (and its reduce) on `q [B, H, Lq, dk]` and `k`, `v` of `kv_heads`
    /// heads (`[B, H_kv, Lk, d]`, each in its own buffer), no mask → combined heads.
    pub fn decode(
        gpu: &Gpu,
        qkv: (&[f32], &[f32], &[f32]),
        dims: CoreDims,
        kv_heads: usize,
        scale: f32,
    ) -> Result<Self> {
        Ok(Self::decode_kv(gpu, qkv, dims, kv_heads, scale, KvDtype::F32)?.0)
    }

    /// [`decode`](Self::decode) with K and V stored as `kv`: f16 (Q too, the f16 module's
    /// decode), or q8_0 / q4_0 blocks (Q f32, a quantized cache's decode). Also returns the
    /// values the pass reads.
    pub fn decode_kv(
        gpu: &Gpu,
        (q, k, v): (&[f32], &[f32], &[f32]),
        dims: CoreDims,
        kv_heads: usize,
        scale: f32,
        kv: KvDtype,
    ) -> Result<(Self, StoredKv)> {
        dims.check()?;
        let group = dims.heads / kv_heads.max(1);
        if kv_heads == 0 || !dims.heads.is_multiple_of(kv_heads) {
            return Err(Error::Config(format!(
                "kv_heads {kv_heads} does not divide heads {}",
                dims.heads
            )));
        }
        let kv_rows = dims.batch * kv_heads * dims.lk;
        expect_len("q", q.len(), dims.q_len())?;
        expect_len("k", k.len(), kv_rows * dims.qk_head_dim)?;
        expect_len("v", v.len(), kv_rows * dims.v_head_dim)?;
        kv.check_head_dim("the key head size", dims.qk_head_dim)?;
        kv.check_head_dim("the value head size", dims.v_head_dim)?;
        if kv == KvDtype::F16 && !gpu.has_f16() {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: "f16 keys and values (no SHADER_F16)".into(),
            });
        }
        let mut c = CoreProblem::head_split(
            dims,
            scale,
            QkvLayout {
                q_offset: 0,
                k_offset: 0,
                v_offset: 0,
                kv_stride: dims.lk as u32,
                kv_group: group as u32,
            },
        );
        c.layout.kv = KvFormat {
            dtype: kv,
            k_scales: kv.scales_word(k.len()) as u32,
            v_scales: kv.scales_word(v.len()) as u32,
        };
        if !decode::serves(group, dims.lq, dims.qk_head_dim, dims.v_head_dim) {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: format!(
                    "the decode pass for {} rows per key/value head",
                    group * dims.lq
                ),
            });
        }
        let q_bytes = if kv == KvDtype::F16 { 2 } else { 4 };
        gpu.check_fits("q", q_bytes * q.len() as u64)?;
        gpu.check_fits("k", kv.bytes_for(k.len()))?;
        gpu.check_fits("v", kv.bytes_for(v.len()))?;
        let half = |x: &[f32]| -> Vec<f32> {
            x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
        };
        gpu.scoped("standalone decode", || -> Result<(Self, StoredKv)> {
            let none = wgpu::BufferUsages::empty();
            let f16 = kv == KvDtype::F16;
            let (qb, kb, vb, stored) = match kv {
                KvDtype::F32 | KvDtype::F16 => (
                    gpu.upload_f32_as("q", q, f16),
                    gpu.upload_f32_as("k", k, f16),
                    gpu.upload_f32_as("v", v, f16),
                    match f16 {
                        true => StoredKv {
                            q: half(q),
                            k: half(k),
                            v: half(v),
                        },
                        false => StoredKv {
                            q: q.to_vec(),
                            k: k.to_vec(),
                            v: v.to_vec(),
                        },
                    },
                ),
                quant => {
                    let (kw, vw) = (kv_dtype::quantize(quant, k)?, kv_dtype::quantize(quant, v)?);
                    let stored = StoredKv {
                        q: q.to_vec(),
                        k: kv_dtype::dequantize(quant, &kw, k.len())?,
                        v: kv_dtype::dequantize(quant, &vw, v.len())?,
                    };
                    (
                        gpu.upload("q", q, none),
                        gpu.upload("k", &kw, none),
                        gpu.upload("v", &vw, none),
                        stored,
                    )
                }
            };
            let partials = gpu.storage("partials", 4 * decode::partials_len(gpu, &c) as u64, none);
            let out_len = c.combined_len();
            let out = gpu.storage("combined", 4 * out_len as u64, wgpu::BufferUsages::COPY_SRC);
            let mask = MaskBuffers::new(gpu, 0);
            mask.write(
                gpu.queue(),
                &[],
                &EncodedMask::new(&Mask::None, dims.attn())?.params,
            );
            let no_sinks = softmax::no_sinks(gpu);
            let buffers = decode::DecodeBuffers {
                qkv: QkvBuffers {
                    q: &qb,
                    k: &kb,
                    v: &vb,
                },
                partials: &partials,
                out: &out,
                mask: &mask,
                chunks: None,
                sinks: (&no_sinks, false),
            };
            let steps = decode::dispatches(gpu, &c, f16, &buffers)?;
            let keep = vec![qb, kb, vb, partials, mask.words, mask.params];
            Ok((Job::new(gpu, steps, keep, out, out_len), stored))
        })?
    }
}
