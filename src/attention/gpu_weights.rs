//! A module's weights on the GPU: `[W_q | W_k | W_v]` and their biases packed so that the rows
//! of a fused QKV (or KV) projection are consecutive, and `W_o` on its own.

use crate::error::Result;
use crate::gpu::Gpu;
use crate::model::config::AttentionConfig;
use crate::model::weights::{AttentionWeights, Linear};

pub(crate) struct GpuWeights {
    pub w_qkv: wgpu::Buffer,
    /// `[b_q | b_k | b_v]`, or `None` for a module without biases.
    pub b_qkv: Option<wgpu::Buffer>,
    /// `W_o` and its bias, for a module with an output projection.
    pub w_o: Option<(wgpu::Buffer, Option<wgpu::Buffer>)>,
    /// Element offsets of W_k, W_v in `w_qkv` and of b_k, b_v in `b_qkv`.
    pub w_k_offset: u32,
    pub w_v_offset: u32,
    pub b_k_offset: u32,
    pub b_v_offset: u32,
    /// The output gate's `W_g` and its bias, for a module with `output_gate`.
    pub gate: Option<(wgpu::Buffer, Option<wgpu::Buffer>)>,
    /// The output norm's weights (f32), for a module with `output_norm`.
    pub output_norm: Option<wgpu::Buffer>,
    /// Host copy of `W_o.bias`: the whole answer when there are no keys.
    pub output_bias: Option<Vec<f32>>,
    /// The appended key and value rows (`AttentionWeights::appended_kv`), which each
    /// workspace writes into its K/V buffers once.
    pub appended_kv: (Vec<f32>, Vec<f32>),
    /// The q and k norms' weights (f32), their lengths and their biases if any, for a module
    /// with `qk_norm`.
    pub qk_norm: Option<[(wgpu::Buffer, usize, Option<wgpu::Buffer>); 2]>,
    /// One sink logit per query head (zeros, unread, for a module without sinks): bound by
    /// every pass that finishes a softmax.
    pub sinks: wgpu::Buffer,
    /// Host copy of the sink logits (module with sinks): the flash pass reads them from the
    /// end of its carry buffer (see `flash_attention::carry_buffer`).
    pub sink_logits: Option<Vec<f32>>,
}

impl GpuWeights {
    /// Uploads checked weights; projection weights as f16 when `half`. `Err(TooLarge)` when a
    /// packed weight buffer exceeds one storage binding.
    pub fn upload(
        gpu: &Gpu,
        config: &AttentionConfig,
        w: &AttentionWeights,
        half: bool,
    ) -> Result<Self> {
        let elem = if half { 2 } else { 4 };
        let qkv_len = w.q.weight.len() + w.k.weight.len() + w.v.weight.len();
        gpu.check_fits("the Q/K/V projection weights", elem * qkv_len as u64)?;
        if let Some(o) = &w.o {
            gpu.check_fits("the output projection weight", elem * o.weight.len() as u64)?;
        }
        if let Some(g) = &w.gate {
            gpu.check_fits("the output gate weight", elem * g.weight.len() as u64)?;
        }
        gpu.scoped("uploading weights", || {
            let mut w_qkv = Vec::with_capacity(qkv_len);
            for layer in [&w.q, &w.k, &w.v] {
                w_qkv.extend_from_slice(&layer.weight);
            }
            let biases: Vec<&[f32]> = [&w.q, &w.k, &w.v]
                .iter()
                .filter_map(|l| l.bias.as_deref())
                .collect();
            let bias_of = |l: &Linear| {
                l.bias
                    .as_ref()
                    .map(|b| gpu.upload("bias", b, wgpu::BufferUsages::empty()))
            };
            GpuWeights {
                w_qkv: gpu.upload_f32_as("W_qkv", &w_qkv, half),
                b_qkv: (biases.len() == 3)
                    .then(|| gpu.upload("b_qkv", &biases.concat(), wgpu::BufferUsages::empty())),
                w_o: w
                    .o
                    .as_ref()
                    .map(|o| (gpu.upload_f32_as("W_o", &o.weight, half), bias_of(o))),
                gate: w
                    .gate
                    .as_ref()
                    .map(|g| (gpu.upload_f32_as("W_g", &g.weight, half), bias_of(g))),
                output_norm: w
                    .output_norm
                    .as_ref()
                    .map(|n| gpu.upload("output norm weight", n, wgpu::BufferUsages::empty())),
                w_k_offset: w.q.weight.len() as u32,
                w_v_offset: (w.q.weight.len() + w.k.weight.len()) as u32,
                b_k_offset: w.q.bias.as_ref().map_or(0, Vec::len) as u32,
                b_v_offset: (w.q.bias.as_ref().map_or(0, Vec::len)
                    + w.k.bias.as_ref().map_or(0, Vec::len)) as u32,
                output_bias: w.o.as_ref().and_then(|o| o.bias.clone()),
                appended_kv: w.appended_kv(config),
                sinks: {
                    let zeros = vec![0.0; config.heads.max(4)];
                    let values = w.sinks.as_deref().unwrap_or(&zeros);
                    gpu.upload("sinks", values, wgpu::BufferUsages::empty())
                },
                sink_logits: w.sinks.clone().filter(|_| config.sinks),
                qk_norm: w.qk_norm.as_ref().map(|n| {
                    [(&n.q, &n.q_bias), (&n.k, &n.k_bias)].map(|(v, b)| {
                        let buffer = gpu.upload("qk_norm weight", v, wgpu::BufferUsages::empty());
                        let bias = (!b.is_empty())
                            .then(|| gpu.upload("qk_norm bias", b, wgpu::BufferUsages::empty()));
                        (buffer, v.len(), bias)
                    })
                }),
            }
        })
    }
}
