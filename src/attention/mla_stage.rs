//! Multi-head latent attention's pre-stage on the GPU ([`MlaStage`]): the hidden states to the
//! absorbed core's query input and latent, as [`MlaInputs::of`] computes them on the host —
//! `kv_a_proj_with_mqa` (and `q_a_proj`) by the forward's `linear` pass, then `mla_rows`
//! passes: `kv_a_layernorm` of the latent into `[k_pe | c]` beside the copied RoPE key, and
//! `q_a_layernorm` of the q latent into the first columns of a zero-padded `[.., E]` query.

use crate::error::Result;
use crate::gpu::pass::Dispatch;
use crate::gpu::Gpu;
use crate::kernels::linear::{self, LinearBuffers, LinearElems, LinearParams, Segment};
use crate::kernels::mla_rows;
use crate::model::mla::{MlaInputs, MLA_NORM_EPS};
use crate::model::tensor::Tensor;
use crate::model::weights::Linear;

/// One projection's weights on the device.
struct DeviceLinear {
    out: usize,
    input: usize,
    w: wgpu::Buffer,
    b: Option<wgpu::Buffer>,
}

impl DeviceLinear {
    fn upload(gpu: &Gpu, l: &Linear, label: &str) -> Self {
        let none = wgpu::BufferUsages::empty();
        DeviceLinear {
            out: l.out_features,
            input: l.in_features,
            w: gpu.upload(label, &l.weight, none),
            b: l.bias.as_ref().map(|b| gpu.upload(label, b, none)),
        }
    }

    /// `y [rows, out] = x [rows, in] · Wᵀ + b`.
    fn dispatch(
        &self,
        gpu: &Gpu,
        rows: usize,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Vec<Dispatch>> {
        let seg = Segment {
            heads: 1,
            head_dim: self.out as u32,
            dst: 0,
        };
        let p = LinearParams::new(rows as u32, self.input as u32, rows as u32, &[seg]).weights_at(
            0,
            0,
            self.b.is_some(),
        );
        let buffers = LinearBuffers {
            x,
            w: &self.w,
            bias: self.b.as_ref(),
            y,
        };
        Ok(linear::dispatch(gpu, LinearElems::F32, None, &p, buffers)?.0)
    }
}

/// The pre-stage's weights on one device (see the module docs).
pub struct MlaStage {
    gpu: Gpu,
    inputs: MlaInputs,
    kv_a: DeviceLinear,
    kv_norm: wgpu::Buffer,
    q_a: Option<(DeviceLinear, wgpu::Buffer)>,
}

impl MlaStage {
    /// Uploads the pre-stage's projections (`kv_a_proj_with_mqa`, `q_a_proj`) and norm
    /// weights to `gpu`.
    pub fn new(gpu: &Gpu, inputs: &MlaInputs) -> Self {
        let none = wgpu::BufferUsages::empty();
        MlaStage {
            gpu: gpu.clone(),
            inputs: inputs.clone(),
            kv_a: DeviceLinear::upload(gpu, &inputs.kv_a, "kv_a_proj_with_mqa"),
            kv_norm: gpu.upload("kv_a_layernorm", &inputs.kv_norm, none),
            q_a: inputs.q_a.as_ref().map(|(a, norm)| {
                (
                    DeviceLinear::upload(gpu, a, "q_a_proj"),
                    gpu.upload("q_a_layernorm", norm, none),
                )
            }),
        }
    }

    /// `x [B, L, E]` → (query input `[B, L, E]`, latent `[B, L, dr + r]`), as
    /// [`MlaInputs::of`] gives them, computed on the device and read back.
    pub fn of(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let d = self.inputs.dims;
        let [b, l] = d.batch_and_length(x)?;
        let rows = b * l;
        if rows == 0 {
            return self.inputs.of(x);
        }
        let (e, r, dr) = (d.hidden, d.kv_lora_rank, d.qk_rope_head_dim);
        let w = r + dr;
        let gpu = &self.gpu;
        let q_width = self.q_a.as_ref().map_or(0, |(a, _)| a.out);
        for (what, elems) in [
            ("the MLA pre-stage's input", rows * e),
            ("the MLA pre-stage's query input", rows * e),
            ("the MLA pre-stage's latent", rows * w),
            ("the MLA pre-stage's q latent", rows * q_width),
        ] {
            gpu.check_fits(what, 4 * elems as u64)?;
        }
        let eps = MLA_NORM_EPS as f32;
        let values = gpu.scoped("MLA pre-stage", || -> Result<(Vec<f32>, Vec<f32>)> {
            let none = wgpu::BufferUsages::empty();
            let src = wgpu::BufferUsages::COPY_SRC;
            let xb = gpu.upload("hidden states", x.data(), none);
            let ckv = gpu.storage("compressed kv", 4 * (rows * w) as u64, none);
            let latent = gpu.storage("latent", 4 * (rows * w) as u64, src);
            let mut chain = self.kv_a.dispatch(gpu, rows, &xb, &ckv)?;
            // [c | k_pe] → [k_pe | kv_a_layernorm(c)]
            chain.push(mla_rows::dispatch(
                gpu,
                rows,
                r,
                (&ckv, w, 0),
                (&latent, w, dr),
                Some((&self.kv_norm, eps)),
            )?);
            chain.push(mla_rows::dispatch(
                gpu,
                rows,
                dr,
                (&ckv, w, r),
                (&latent, w, 0),
                None,
            )?);
            let query = match &self.q_a {
                Some((a, norm)) => {
                    let qa = gpu.storage("q latent", 4 * (rows * a.out) as u64, none);
                    // Zero-filled: the columns past q_lora_rank stay 0.
                    let q = gpu.storage("query input", 4 * (rows * e) as u64, src);
                    chain.extend(a.dispatch(gpu, rows, &xb, &qa)?);
                    chain.push(mla_rows::dispatch(
                        gpu,
                        rows,
                        a.out,
                        (&qa, a.out, 0),
                        (&q, e, 0),
                        Some((norm, eps)),
                    )?);
                    Some(q)
                }
                None => None,
            };
            let staging_latent = gpu.staging("latent readback", 4 * (rows * w) as u64);
            let staging_q = query
                .as_ref()
                .map(|_| gpu.staging("query readback", 4 * (rows * e) as u64));
            let mut encoder = gpu.encoder("MLA pre-stage");
            for step in &chain {
                step.record(&mut encoder, None);
            }
            encoder.copy_buffer_to_buffer(&latent, 0, &staging_latent, 0, 4 * (rows * w) as u64);
            if let (Some(q), Some(st)) = (&query, &staging_q) {
                encoder.copy_buffer_to_buffer(q, 0, st, 0, 4 * (rows * e) as u64);
            }
            gpu.queue().submit([encoder.finish()]);
            let latent = gpu.read_f32(&staging_latent, rows * w)?;
            let query = match &staging_q {
                Some(st) => gpu.read_f32(st, rows * e)?,
                None => x.data().to_vec(),
            };
            Ok((query, latent))
        })??;
        let (query, latent) = values;
        Ok((
            Tensor::new([b, l, e], query)?,
            Tensor::new([b, l, w], latent)?,
        ))
    }
}
