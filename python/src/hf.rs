//! A Hugging Face attention module loaded from a saved checkpoint, its forward, and a device
//! KV cache that decodes it step by step, each call with the mask the module applies
//! (causal, sliding window, T5's relative bias) and the caller's padding.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{
    Error, ForwardOptions, KvCache, KvDtype, MaskTensor, MultiHeadAttention, Precision,
    StepOptions, Tensor,
};

use crate::arrays::{host, host_indices, host_u8, tensor_array};
use crate::device::Device;
use crate::errors::{guard, value_error};

struct Loaded {
    module: HfAttention,
    mha: MultiHeadAttention,
}

/// One attention module of a checkpoint, weights on the device.
#[pyclass(module = "wgpu_mha._native", name = "HfModule", frozen)]
pub struct HfModule {
    inner: Arc<Loaded>,
}

/// `[B, L]` padding (1 = a real token) as the engine's mask tensor.
fn padding(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<MaskTensor>> {
    match obj {
        Some(m) if !m.is_none() => {
            let (shape, data) = host_u8(m, "attention_mask")?;
            if shape.len() != 2 {
                return Err(value_error(format!(
                    "attention_mask must be [batch, keys] (1 = a real token, 0 = padding), got shape {shape:?}"
                )));
            }
            Ok(Some(
                MaskTensor::new(shape, data).map_err(crate::errors::to_py)?,
            ))
        }
        _ => Ok(None),
    }
}

fn positions(obj: Option<&Bound<'_, PyAny>>, want: [usize; 2]) -> PyResult<Option<Vec<usize>>> {
    match obj {
        Some(p) if !p.is_none() => {
            let (shape, values) = host_indices(p, "position_ids")?;
            if shape != want {
                return Err(value_error(format!(
                    "position_ids must be [batch, tokens] = {want:?}, got {shape:?}"
                )));
            }
            Ok(Some(values))
        }
        _ => Ok(None),
    }
}

fn own_dtype(mha: &MultiHeadAttention) -> KvDtype {
    match mha.precision() {
        Precision::F16 => KvDtype::F16,
        _ => KvDtype::F32,
    }
}

fn parse_dtype(name: &str) -> PyResult<KvDtype> {
    KvDtype::parse(name).map_err(|_| {
        value_error(format!(
            "kv_dtype {name:?} is not a KV cache type: expected \"f32\", \"f16\", \"q8_0\" or \"q4_0\""
        ))
    })
}

/// The canonical name of a KV cache element type (`"q8_0"` for `"Q8_0"`, `"f32"` for
/// `"float32"`); ValueError naming `name` when it is none.
#[pyfunction]
pub fn kv_dtype_name(name: &str) -> PyResult<&'static str> {
    Ok(parse_dtype(name)?.name())
}

#[pymethods]
impl HfModule {
    /// `path`: a model directory (config.json + safetensors, sharded or not) or one safetensors
    /// file (its metadata `hf_config` as the config). `prefix` names the module; else `layer`
    /// picks the one module of that layer; else the checkpoint must hold exactly one.
    #[new]
    #[pyo3(signature = (device, path, layer=None, prefix=None))]
    fn new(
        py: Python<'_>,
        device: &Device,
        path: std::path::PathBuf,
        layer: Option<usize>,
        prefix: Option<String>,
    ) -> PyResult<Self> {
        let gpu = &device.gpu;
        let inner = guard(py, || {
            let ckpt = HfCheckpoint::open(&path)?;
            let prefix = match (prefix, layer) {
                (Some(p), _) => p,
                (None, Some(n)) => ckpt.layer_prefix(n)?,
                (None, None) => {
                    let modules = ckpt.modules();
                    match &modules[..] {
                        [(_, one)] => one.clone(),
                        _ => {
                            return Err(Error::Misuse(format!(
                            "{} holds {} attention modules ({}); pick one with layer= or prefix=",
                            ckpt.name(),
                            modules.len(),
                            modules
                                .iter()
                                .map(|(_, p)| format!("{p:?}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )))
                        }
                    }
                }
            };
            let module = ckpt.attention(&prefix, None)?;
            let mha = MultiHeadAttention::new(gpu, module.config, &module.weights)?;
            Ok(Loaded { module, mha })
        })?;
        Ok(HfModule {
            inner: Arc::new(inner),
        })
    }

    #[getter]
    fn prefix(&self) -> String {
        self.inner.module.prefix.clone()
    }
    #[getter]
    fn family(&self) -> &'static str {
        self.inner.module.family.name()
    }
    #[getter]
    fn model_type(&self) -> Option<String> {
        self.inner.module.model_type.clone()
    }
    /// Attends to another sequence (`key_value_states`).
    #[getter]
    fn is_cross_attention(&self) -> bool {
        self.inner.module.cross
    }
    /// Query i sees keys j ≤ i.
    #[getter]
    fn is_causal(&self) -> bool {
        self.inner.module.causal
    }
    #[getter]
    fn sliding_window(&self) -> Option<usize> {
        self.inner.module.window
    }
    #[getter]
    fn hidden_size(&self) -> usize {
        self.inner.mha.config().model_dim
    }
    #[getter]
    fn num_heads(&self) -> usize {
        self.inner.mha.config().heads
    }
    #[getter]
    fn num_key_value_heads(&self) -> usize {
        self.inner.mha.config().kv_heads
    }
    #[getter]
    fn uses_rope(&self) -> bool {
        self.inner.mha.config().rope.is_some()
    }

    /// `hidden_states [B, Lq, E]`; `attention_mask [B, Lk]` (1 = a real token); `position_ids
    /// [B, Lq]` (RoPE modules; default 0..Lq); `key_value_states [B, Lk, E]` (cross-attention
    /// only). Returns `[B, Lq, E]` float32.
    #[pyo3(signature = (hidden_states, attention_mask=None, position_ids=None, key_value_states=None))]
    fn forward(
        &self,
        py: Python<'_>,
        hidden_states: &Bound<'_, PyAny>,
        attention_mask: Option<&Bound<'_, PyAny>>,
        position_ids: Option<&Bound<'_, PyAny>>,
        key_value_states: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        let m = &self.inner.module;
        let query = host(hidden_states, "hidden_states")?.tensor()?;
        let kv = match key_value_states {
            Some(k) if !k.is_none() => Some(host(k, "key_value_states")?.tensor()?),
            _ => None,
        };
        if m.cross != kv.is_some() {
            return Err(value_error(match m.cross {
                true => format!(
                    "`{}` is a cross-attention module: it needs key_value_states",
                    m.prefix
                ),
                false => format!(
                    "`{}` is a self-attention module: key_value_states must be None",
                    m.prefix
                ),
            }));
        }
        let key = kv.as_ref().unwrap_or(&query);
        let shape = |t: &Tensor, i: usize| t.shape().get(i).copied().unwrap_or(0);
        let dims = AttnDims {
            batch: shape(&query, 0),
            heads: self.inner.mha.config().heads,
            lq: shape(&query, 1),
            lk: shape(key, 1),
        };
        let keep = padding(attention_mask)?;
        let positions = match self.inner.mha.config().rope {
            Some(_) => positions(position_ids, [dims.batch, dims.lq])?,
            None => None,
        };
        let out = guard(py, || {
            self.inner
                .mha
                .config()
                .check_inputs(query.shape(), key.shape(), key.shape())?;
            let mask = m.mask_for(&query, dims, keep.as_ref())?;
            let options = ForwardOptions {
                positions,
                ..Default::default()
            };
            self.inner
                .mha
                .forward_with(&query, key, key, &mask, &options)
        })?;
        tensor_array(py, out.output)
    }

    /// A device KV cache of `batch` sequences of up to `capacity` tokens for this (causal
    /// self-attention) module, its keys and values stored as `kv_dtype` (`"f32"`, `"f16"`,
    /// `"q8_0"`, `"q4_0"`; None: the module's own type).
    #[pyo3(signature = (batch, capacity, kv_dtype=None))]
    fn kv_cache(
        &self,
        py: Python<'_>,
        batch: usize,
        capacity: usize,
        kv_dtype: Option<&str>,
    ) -> PyResult<HfKvCache> {
        let m = &self.inner.module;
        if m.cross {
            return Err(value_error(format!(
                "`{}` is a cross-attention module; a KV cache steps a self-attention",
                m.prefix
            )));
        }
        if !m.causal {
            return Err(value_error(format!(
                "`{}` is a bidirectional (encoder) self-attention: each token attends to the \
                 tokens after it, which a decoder has not seen yet; call forward over the whole sequence",
                m.prefix
            )));
        }
        let dtype = match kv_dtype {
            Some(name) => parse_dtype(name)?,
            None => own_dtype(&self.inner.mha),
        };
        let own = own_dtype(&self.inner.mha);
        if !dtype.quantized() && dtype != own {
            return Err(value_error(format!(
                "kv_dtype {dtype:?} for `{}`, whose weights run in {own}: a float cache holds the \
                 module's own type (or pick q8_0 / q4_0)",
                m.prefix,
                dtype = dtype.name()
            )));
        }
        let cache = guard(py, || {
            KvCache::new_with(&self.inner.mha, batch, capacity, dtype)
        })?;
        Ok(HfKvCache {
            inner: self.inner.clone(),
            cache: Mutex::new(cache),
        })
    }
}

/// Keys and values of the tokens decoded so far, on the device.
#[pyclass(module = "wgpu_mha._native", name = "HfKvCache", frozen)]
pub struct HfKvCache {
    inner: Arc<Loaded>,
    cache: Mutex<KvCache>,
}

fn poisoned() -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err("the KV cache was left unusable by an earlier panic")
}

#[pymethods]
impl HfKvCache {
    /// Tokens held.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.cache.lock().map_err(|_| poisoned())?.len())
    }
    #[getter]
    fn capacity(&self) -> PyResult<usize> {
        Ok(self.cache.lock().map_err(|_| poisoned())?.capacity())
    }
    #[getter]
    fn batch(&self) -> PyResult<usize> {
        Ok(self.cache.lock().map_err(|_| poisoned())?.batch())
    }
    /// The keys' and values' element type: "f32", "f16", "q8_0" or "q4_0".
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        Ok(self.cache.lock().map_err(|_| poisoned())?.dtype().name())
    }
    /// Bytes of keys and values one token of one sequence takes (34 per 32 values in q8_0,
    /// 18 in q4_0).
    #[getter]
    fn bytes_per_token(&self) -> PyResult<u64> {
        Ok(self.cache.lock().map_err(|_| poisoned())?.bytes().per_token)
    }
    /// Device bytes held: keys_values (at the full capacity), step, scores, per_token.
    fn nbytes(&self) -> PyResult<std::collections::HashMap<&'static str, u64>> {
        let b = self.cache.lock().map_err(|_| poisoned())?.bytes();
        Ok([
            ("keys_values", b.keys_values),
            ("step", b.step),
            ("scores", b.scores),
            ("per_token", b.per_token),
        ]
        .into_iter()
        .collect())
    }
    /// The cached keys `[B, H_kv, len, dk]` and values `[B, H_kv, len, dv]` (RoPE applied) as
    /// float32, a quantized cache's as its blocks decode them (what its steps attend to).
    fn read_keys_values(&self, py: Python<'_>) -> PyResult<(PyObject, PyObject)> {
        let inner = &self.inner;
        let cache = &self.cache;
        let (k, v) = guard(py, || {
            let cache = cache.lock().map_err(|_| {
                Error::Misuse("the KV cache was left unusable by an earlier panic".into())
            })?;
            cache.read_keys_values(inner.mha.gpu())
        })?;
        Ok((tensor_array(py, k)?, tensor_array(py, v)?))
    }
    /// Forgets every token (the device memory stays).
    fn reset(&self) -> PyResult<()> {
        self.cache.lock().map_err(|_| poisoned())?.reset();
        Ok(())
    }

    /// The module's output for the next `n` tokens of each sequence, `hidden_states [B, n, E]`,
    /// their keys and values appended. `attention_mask [B, len + n]`: the padding of every token
    /// so far and these (1 = real); `position_ids [B, n]` (RoPE; default len..len + n).
    #[pyo3(signature = (hidden_states, attention_mask=None, position_ids=None))]
    fn step(
        &self,
        py: Python<'_>,
        hidden_states: &Bound<'_, PyAny>,
        attention_mask: Option<&Bound<'_, PyAny>>,
        position_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        let x = host(hidden_states, "hidden_states")?.tensor()?;
        let keep = padding(attention_mask)?;
        let (b, n) = (
            x.shape().first().copied().unwrap_or(0),
            x.shape().get(1).copied().unwrap_or(0),
        );
        let positions = match self.inner.mha.config().rope {
            Some(_) => positions(position_ids, [b, n])?,
            None => None,
        };
        let inner = &self.inner;
        let cache = &self.cache;
        let out = guard(py, || {
            let mut cache = cache.lock().map_err(|_| {
                Error::Misuse("the KV cache was left unusable by an earlier panic".into())
            })?;
            let dims = AttnDims {
                batch: cache.batch(),
                heads: inner.mha.config().heads,
                lq: n,
                lk: cache.len() + n,
            };
            let mask = inner.module.mask(dims, keep.as_ref())?;
            let options = StepOptions {
                mask: Some(&mask),
                positions: positions.as_deref(),
                ..Default::default()
            };
            inner.mha.forward_step_with(&mut cache, &x, &options)
        })?;
        tensor_array(py, out)
    }
}
