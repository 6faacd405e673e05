//! One `scaled_dot_product_attention` call: its arguments checked into a [`Problem`] (nothing
//! touches the device), then its passes recorded — the same kernels as the module's core,
//! pointed at the caller's buffers through their row strides.

use crate::attention::gpu_tensor::GpuTensor;
use crate::attention::AttentionPath;
use crate::error::{Error, Result};
use crate::gpu::pass::Dispatch;
use crate::gpu::Gpu;
use crate::kernels::flash_attention::{self, Flash, FlashBuffers};
use crate::kernels::mask::{EncodedMask, MaskBuffers};
use crate::kernels::{
    av_combine, decode, head_cap, scores, softmax, BoundRanges, CoreDims, CoreLayout, CoreProblem,
    KvFormat, QkvBuffers,
};
use crate::model::mask::AttnDims;

use super::{misuse, CausalAlignment, DeviceTensor, Elem, SdpaOptions, SdpaOutput};

/// Which core runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Nothing to compute (no batch, head or query).
    Empty,
    /// Few query rows: key ranges in parallel, then their reduce.
    Decode,
    Flash,
    /// Scores, softmax, `P·V` (keeps the probabilities).
    MultiPass,
}

/// A checked call.
pub(super) struct Problem<'a> {
    q: DeviceTensor<'a>,
    k: DeviceTensor<'a>,
    v: DeviceTensor<'a>,
    out: DeviceTensor<'a>,
    core: CoreProblem,
    mask: EncodedMask,
    sinks: Option<Vec<f32>>,
    route: Route,
}

fn shape_error(what: &str, expected: String, got: [usize; 4]) -> Error {
    Error::Shape {
        what: what.into(),
        expected,
        got: got.to_vec(),
    }
}

impl<'a> Problem<'a> {
    /// Every check of the call, before anything is recorded.
    pub fn check(
        gpu: &Gpu,
        [q, k, v, out]: [&DeviceTensor<'a>; 4],
        o: &SdpaOptions,
    ) -> Result<Self> {
        let [batch, heads, lq, d] = q.shape;
        let [_, kv_heads, lk, _] = k.shape;
        let dv = v.shape[3];
        if k.shape[0] != batch || k.shape[3] != d || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(shape_error(
                "k",
                format!("[{batch}, H_kv, Lk, {d}] with H_kv dividing the {heads} query heads"),
                k.shape,
            ));
        }
        if v.shape[..3] != k.shape[..3] {
            return Err(shape_error(
                "v",
                format!("[{batch}, {kv_heads}, {lk}, Dv] (k's batch, heads and length)"),
                v.shape,
            ));
        }
        if out.shape != [batch, heads, lq, dv] {
            return Err(shape_error(
                "out",
                format!("[{batch}, {heads}, {lq}, {dv}]"),
                out.shape,
            ));
        }
        let empty = batch * heads * lq == 0;
        if !empty && (d == 0 || dv == 0 || lk == 0) {
            return Err(misuse(format!(
                "q/k head size {d}, v head size {dv} and key length {lk} must all be positive"
            )));
        }
        // Quantized keys and values (a quantized KvCache's views) go with f32 or f16 queries.
        let quant = k.elem.kv_dtype().quantized();
        if quant {
            if v.elem != k.elem || q.elem.kv_dtype().quantized() {
                return Err(misuse(format!(
                    "quantized k ({:?}) needs v of the same type and float q, got {:?} and {:?}",
                    k.elem, v.elem, q.elem
                )));
            }
            for (name, t) in [("k", k), ("v", v)] {
                k.elem
                    .kv_dtype()
                    .check_head_dim(&format!("{name}'s head size"), t.shape[3])?;
            }
        } else if k.elem != q.elem || v.elem != q.elem {
            return Err(misuse(format!(
                "q, k and v must share one element type, got {:?}, {:?}, {:?}",
                q.elem, k.elem, v.elem
            )));
        }
        if out.elem != Elem::F32 {
            return Err(misuse(
                "out must be f32 (accumulation and output are f32)".into(),
            ));
        }
        let f16 = q.elem == Elem::F16;
        if f16 && !gpu.has_f16() {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: "f16 q, k and v (the device has no SHADER_F16)".into(),
            });
        }
        for (name, input) in [("q", q), ("k", k), ("v", v)] {
            if input.buffer == out.buffer {
                return Err(misuse(format!(
                    "out shares its buffer with {name}: a pass cannot bind one buffer for reading and writing"
                )));
            }
        }
        let mut views = Vec::with_capacity(4);
        for (name, t) in [("q", q), ("k", k), ("v", v), ("out", out)] {
            views.push(t.check(gpu, name)?);
        }

        let dims = AttnDims {
            batch,
            heads,
            lq,
            lk,
        };
        let mut mask = EncodedMask::new(&o.mask, dims)?;
        if o.causal_alignment == CausalAlignment::TopLeft {
            mask.params.causal_offset = 0;
        }
        if let Some(c) = o.softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(misuse(format!(
                    "softcap must be positive and finite, got {c}"
                )));
            }
            mask.params.softcap = c;
        }
        if let Some(max_bias) = o.alibi_max_bias {
            if !max_bias.is_finite() {
                return Err(misuse(format!(
                    "alibi_max_bias must be finite, got {max_bias}"
                )));
            }
            mask.params.alibi_max_bias = max_bias;
            mask.params.alibi_heads = heads as u32;
        }
        gpu.check_fits("the mask", 4 * mask.words.len() as u64)?;
        if let Some(sinks) = &o.sinks {
            if sinks.len() != heads {
                return Err(misuse(format!(
                    "sinks: {} logits for {heads} query heads",
                    sinks.len()
                )));
            }
        }
        let scale = o.scale.unwrap_or(1.0 / (d.max(1) as f32).sqrt());
        if !scale.is_finite() {
            return Err(misuse(format!("scale must be finite, got {scale}")));
        }

        let kv_group = heads / kv_heads.max(1);
        let fused_only = match (f16, quant) {
            (_, true) => Some(format!("{:?} keys and values", k.elem)),
            (true, false) => Some("f16 tensors".to_string()),
            _ => None,
        };
        let route = route(gpu, o, empty, fused_only, (kv_group, lq, d, dv))?;
        if route == Route::MultiPass {
            let scores = (batch * heads * lq) as u64 * lk as u64 * 4;
            gpu.check_fits("the [B, H, Lq, Lk] probabilities", scores)?;
        }
        let core = CoreProblem {
            dims: CoreDims {
                batch,
                heads,
                lq,
                lk,
                qk_head_dim: d,
                v_head_dim: dv,
            },
            scale,
            layout: CoreLayout {
                q: views[0].strides,
                k: views[1].strides,
                v: views[2].strides,
                out: views[3].strides,
                kv_group: kv_group as u32,
                whole_vec4s: views[..3].iter().all(|v| v.whole_vec4s),
                kv: KvFormat {
                    dtype: k.elem.kv_dtype(),
                    k_scales: k.scales as u32,
                    v_scales: v.scales as u32,
                },
                ranges: BoundRanges {
                    q: Some(views[0].range),
                    k: Some(views[1].range),
                    v: Some(views[2].range),
                    out: Some(views[3].range),
                },
            },
        };
        Ok(Problem {
            q: *q,
            k: *k,
            v: *v,
            out: *out,
            core,
            mask,
            sinks: o.sinks.clone(),
            route,
        })
    }

    /// Makes everything the call records — its own buffers, pipelines and bind groups (which
    /// is where wgpu checks the caller's buffers: device, liveness, usage, ranges) — and
    /// records nothing. The caller runs this inside an error scope and pops it before the
    /// first command goes into an encoder, so that an `Err` leaves the encoder as it was.
    pub fn prepare(&self, gpu: &Gpu) -> Result<Prepared> {
        let c = &self.core;
        let probs = match self.route {
            Route::MultiPass => Some(GpuTensor::zeros(gpu, &[c.batch, c.heads, c.lq, c.lk])?),
            _ => None,
        };
        let path = match self.route {
            Route::MultiPass => AttentionPath::MultiPass,
            _ => AttentionPath::Fused,
        };
        let output = SdpaOutput { path, probs };
        if self.route == Route::Empty {
            return Ok(Prepared {
                chain: Vec::new(),
                output,
            });
        }
        // This call's own mask, sinks and scratch: nothing another recorded call writes.
        let mask = MaskBuffers::with_contents(gpu, &self.mask.words, &self.mask.params);
        let qkv = QkvBuffers {
            q: self.q.buffer,
            k: self.k.buffer,
            v: self.v.buffer,
        };
        let f16 = self.q.elem == Elem::F16;
        let none = wgpu::BufferUsages::empty();
        let sinks_buffer = || match &self.sinks {
            Some(logits) => gpu.upload("sdpa sinks", logits, none),
            None => softmax::no_sinks(gpu),
        };
        let chain: Vec<Dispatch> = match self.route {
            Route::Decode => {
                let partials = gpu.storage(
                    "sdpa partials",
                    4 * decode::partials_len(gpu, c) as u64,
                    none,
                );
                let sinks = sinks_buffer();
                let buffers = decode::DecodeBuffers {
                    qkv,
                    partials: &partials,
                    out: self.out.buffer,
                    mask: &mask,
                    chunks: None,
                    sinks: (&sinks, self.sinks.is_some()),
                };
                decode::dispatches(gpu, c, f16, &buffers)?
            }
            Route::Flash => {
                let flash = Flash::new(gpu, c.qk_head_dim, c.v_head_dim, f16)
                    .ok_or_else(|| no_fused_kernel(gpu, c.qk_head_dim, c.v_head_dim))?;
                // The sinks ride at the end of the carry buffer (the pass binds 6 buffers).
                let carry = flash_attention::carry_buffer(
                    gpu,
                    "sdpa carry",
                    flash.carry_len(c),
                    self.sinks.as_deref(),
                    none,
                );
                let buffers = FlashBuffers {
                    qkv,
                    out: self.out.buffer,
                    carry: &carry,
                    mask: &mask,
                    chunks: None,
                    sinks: self.sinks.is_some(),
                };
                gpu.check_workgroups("flash attention", [1, c.batch_heads(), 1])?;
                flash.dispatches(gpu, c, &buffers)?
            }
            Route::MultiPass => {
                let scores_buf = output
                    .probs
                    .as_ref()
                    .map(GpuTensor::buffer)
                    .ok_or_else(|| misuse("the multi-pass core lost its scores buffer".into()))?;
                let mut chain = scores::dispatches(
                    gpu,
                    c,
                    scores::ScoresBuffers {
                        qkv,
                        scores: scores_buf,
                        mask: &mask,
                    },
                )?;
                let sinks_buf = sinks_buffer();
                let sinks = softmax::Sinks {
                    logits: &sinks_buf,
                    on: self.sinks.is_some(),
                    heads: c.heads,
                    lq: c.lq,
                };
                let rows = c.batch * c.heads * c.lq;
                chain.push(softmax::dispatch(gpu, rows, c.lk, scores_buf, sinks)?);
                let buffers = av_combine::AvBuffers {
                    probs: scores_buf,
                    v: self.v.buffer,
                    out: self.out.buffer,
                };
                chain.extend(av_combine::dispatches(gpu, c, buffers)?);
                chain
            }
            Route::Empty => Vec::new(),
        };
        Ok(Prepared { chain, output })
    }
}

/// A call whose every object exists and passed wgpu's checks: recording it cannot fail.
pub(super) struct Prepared {
    chain: Vec<Dispatch>,
    output: SdpaOutput,
}

impl Prepared {
    /// Records the passes into `encoder` (a recorded command holds its own references to the
    /// buffers and bind groups it uses: see `crate::gpu::record`).
    pub fn record(self, encoder: &mut wgpu::CommandEncoder) -> SdpaOutput {
        for d in &self.chain {
            d.record(encoder, None);
        }
        self.output
    }
}

/// The core a call runs, as the module picks it: fused unless probabilities (or the
/// multi-pass path) are asked for; decode for a few query rows; multi-pass where no fused tile
/// fits (f32 only: `fused_only` names the tensors that need a fused core).
fn route(
    gpu: &Gpu,
    o: &SdpaOptions,
    empty: bool,
    fused_only: Option<String>,
    (kv_group, lq, d, dv): (usize, usize, usize, usize),
) -> Result<Route> {
    if empty {
        return Ok(Route::Empty);
    }
    let multi_pass = o.return_probs || o.path == AttentionPath::MultiPass;
    if let (true, Some(what)) = (multi_pass, &fused_only) {
        return Err(Error::Unsupported {
            adapter: gpu.describe(),
            what: format!("the multi-pass core (probabilities) on {what}; it runs on f32 tensors"),
        });
    }
    if o.return_probs && o.path == AttentionPath::Fused {
        return Err(misuse(
            "return_probs with path Fused: the fused core never forms the probabilities".into(),
        ));
    }
    if multi_pass {
        return Ok(Route::MultiPass);
    }
    if decode::serves(kv_group, lq, d, dv) {
        return Ok(Route::Decode);
    }
    let workgroup_bytes = gpu.limits().max_compute_workgroup_storage_size;
    if flash_attention::kv_tile(head_cap(d), head_cap(dv), workgroup_bytes).is_some() {
        return Ok(Route::Flash);
    }
    match (o.path, fused_only) {
        (AttentionPath::Auto, None) => Ok(Route::MultiPass),
        _ => Err(no_fused_kernel(gpu, d, dv)),
    }
}

fn no_fused_kernel(gpu: &Gpu, d: usize, dv: usize) -> Error {
    Error::Unsupported {
        adapter: gpu.describe(),
        what: format!(
            "fused attention with head sizes q/k {d} + v {dv} (a tile of {} K/V rows must fit the {} bytes of workgroup memory)",
            flash_attention::KEY_GROUP,
            gpu.limits().max_compute_workgroup_storage_size
        ),
    }
}
