//! The attention core on host arrays: `[B, H, L, D]` q, k, v (f32 or f16) and an already
//! broadcast rank-4 mask; torch's argument rules live in python/wgpu_mha/_sdpa.py.

use numpy::PyUntypedArrayMethods;
use pyo3::prelude::*;
use wgpu::util::DeviceExt;
use wgpu_mha::{
    scaled_dot_product_attention, CausalAlignment, DeviceTensor, Gpu, GpuTensor, Layout, Mask,
    MaskTensor, SdpaOptions, Tensor,
};

use crate::arrays::{array_f32, host, host_u8, Host, HostData};
use crate::device::Device;
use crate::errors::{guard, value_error};

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

fn shape4(h: &Host, name: &str) -> PyResult<[usize; 4]> {
    <[usize; 4]>::try_from(h.shape.as_slice())
        .map_err(|_| value_error(format!("{name} must be [B, H, L, D], got {:?}", h.shape)))
}

/// A storage buffer holding `h` as f16 (when `f16`) or f32 (at least 4 bytes: wgpu binds no
/// empty buffer).
fn upload(gpu: &Gpu, h: &Host, f16: bool) -> wgpu::Buffer {
    let mut bytes: Vec<u8> = match (&h.data, f16) {
        (HostData::F16(v), true) => bytemuck::cast_slice(v).to_vec(),
        (_, _) => bytemuck::cast_slice(&h.to_f32()).to_vec(),
    };
    // Whole 4-byte words, at least one.
    bytes.resize(bytes.len().div_ceil(4).max(1) * 4, 0);
    gpu.device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("wgpu_mha python input"),
            contents: &bytes,
            usage: USAGE,
        })
}

/// `softmax(mask(scale·q·kᵀ))·v` → `(out [B, H, Lq, Dv] f32, probs [B, H, Lq, Lk] | None)`.
/// `mask`: None, a bool/uint8 array (nonzero = takes part) or a float32 array (added), rank 4
/// with each dim full or 1. `causal`: query i sees keys j ≤ i (top-left; `bottom_right`: j ≤ i +
/// Lk − Lq); `window` (with `causal`): and j > i − window. `softcap`: scores become
/// c·tanh(s/c) before the mask; `sinks`: one float32 logit per query head joining each
/// softmax's denominator. A row the mask hides wholly is the engine's (mean of V for a boolean
/// mask, NaN for −inf): the Python layer zeroes it as torch does.
#[pyfunction]
#[pyo3(signature = (device, query, key, value, mask=None, causal=false, scale=None, return_probs=false, *, window=None, bottom_right=false, softcap=None, sinks=None))]
#[allow(clippy::too_many_arguments)]
pub fn sdpa(
    py: Python<'_>,
    device: &Device,
    query: &Bound<'_, PyAny>,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    mask: Option<&Bound<'_, PyAny>>,
    causal: bool,
    scale: Option<f32>,
    return_probs: bool,
    window: Option<usize>,
    bottom_right: bool,
    softcap: Option<f32>,
    sinks: Option<&Bound<'_, PyAny>>,
) -> PyResult<(PyObject, Option<PyObject>)> {
    let (q, k, v) = (
        host(query, "query")?,
        host(key, "key")?,
        host(value, "value")?,
    );
    let (sq, sk, sv) = (
        shape4(&q, "query")?,
        shape4(&k, "key")?,
        shape4(&v, "value")?,
    );
    let mask = match mask {
        None => Mask::None,
        Some(m) if m.is_none() => Mask::None,
        Some(m) => mask_of(m)?,
    };
    if causal && !matches!(mask, Mask::None) {
        return Err(value_error(
            "an explicit mask cannot be combined with causal (as torch's is_causal)",
        ));
    }
    let mask = match (causal, window) {
        (true, Some(w)) => Mask::SlidingWindow(w),
        (true, None) => Mask::Causal,
        (false, Some(_)) => return Err(value_error("window needs causal=True")),
        (false, None) => mask,
    };
    let sinks = match sinks {
        Some(s) if !s.is_none() => Some(host(s, "sinks")?.to_f32()),
        _ => None,
    };
    let options = SdpaOptions {
        mask,
        causal_alignment: match bottom_right {
            true => CausalAlignment::BottomRight,
            false => CausalAlignment::TopLeft,
        },
        scale,
        softcap,
        sinks,
        return_probs,
        ..Default::default()
    };
    let gpu = &device.gpu;
    let out_shape = [sq[0], sq[1], sq[2], sv[3]];
    let (out, probs) = guard(py, || run(gpu, [(&q, sq), (&k, sk), (&v, sv)], options))?;
    let out = array_f32(py, &out_shape, out.into_data())?;
    let probs = probs
        .map(|p: Tensor| {
            let shape = p.shape().to_vec();
            array_f32(py, &shape, p.into_data())
        })
        .transpose()?;
    Ok((out, probs))
}

type Input<'a> = (&'a Host, [usize; 4]);

/// Uploads q, k, v, runs the core and reads the output (and probabilities) back: the whole
/// host-to-host call, without Python.
fn run(
    gpu: &Gpu,
    [(q, sq), (k, sk), (v, sv)]: [Input<'_>; 3],
    options: SdpaOptions,
) -> wgpu_mha::Result<(Tensor, Option<Tensor>)> {
    // f16 stays f16 where the adapter computes it, and when all three are f16.
    let f16 = gpu.has_f16() && q.is_f16() && k.is_f16() && v.is_f16() && !options.return_probs;
    let out_shape = [sq[0], sq[1], sq[2], sv[3]];
    let (bq, bk, bv) = (
        upload(gpu, q, f16),
        upload(gpu, k, f16),
        upload(gpu, v, f16),
    );
    let out = GpuTensor::zeros(gpu, &out_shape)?;
    let tensor = |b, s| {
        let t = DeviceTensor::new(b, s, Layout::Bhld);
        if f16 {
            t.f16()
        } else {
            t
        }
    };
    let result = scaled_dot_product_attention(
        gpu,
        &tensor(&bq, sq),
        &tensor(&bk, sk),
        &tensor(&bv, sv),
        &DeviceTensor::new(out.buffer(), out_shape, Layout::Bhld),
        &options,
    )?;
    let probs = result.probs.map(|p| p.read(gpu)).transpose()?;
    Ok((out.read(gpu)?, probs))
}

/// The Rust side of python/bench.py: the median milliseconds of `iters` host-to-host calls of
/// [`run`] on random f32 `[b, h, l, d]` q and `[b, kv_heads, s, d]` k, v (causal), after one
/// untimed call, all in Rust.
#[pyfunction]
#[pyo3(signature = (device, b, h, kv_heads, l, s, d, iters))]
#[allow(clippy::too_many_arguments)]
pub fn bench_rust_sdpa(
    py: Python<'_>,
    device: &Device,
    b: usize,
    h: usize,
    kv_heads: usize,
    l: usize,
    s: usize,
    d: usize,
    iters: usize,
) -> PyResult<f64> {
    let host = |shape: [usize; 4], seed| Host {
        shape: shape.to_vec(),
        data: HostData::F32(Tensor::random(shape, seed).into_data()),
    };
    let (sq, sk) = ([b, h, l, d], [b, kv_heads, s, d]);
    let (q, k, v) = (host(sq, 1), host(sk, 2), host(sk, 3));
    let gpu = &device.gpu;
    guard(py, || {
        let options = SdpaOptions {
            mask: Mask::Causal,
            causal_alignment: CausalAlignment::TopLeft,
            ..Default::default()
        };
        let call = || run(gpu, [(&q, sq), (&k, sk), (&v, sk)], options.clone());
        call()?;
        let mut ms: Vec<f64> = (0..iters.max(1))
            .map(|_| {
                let t = std::time::Instant::now();
                call().map(|_| t.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<wgpu_mha::Result<_>>()?;
        ms.sort_by(f64::total_cmp);
        Ok(ms[ms.len() / 2])
    })
}

fn mask_of(m: &Bound<'_, PyAny>) -> PyResult<Mask> {
    let dtype = m
        .downcast::<numpy::PyUntypedArray>()
        .map(|a| a.dtype().to_string())
        .unwrap_or_default();
    if dtype == "bool" || dtype == "uint8" {
        let (shape, data) = host_u8(m, "mask")?;
        return Ok(Mask::Attend(
            MaskTensor::new(shape, data).map_err(crate::errors::to_py)?,
        ));
    }
    let h = host(m, "mask")?;
    Ok(Mask::Bias(h.tensor()?))
}
