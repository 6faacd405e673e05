//! `nn.MultiheadAttention` on the device: built once from its state dict (as safetensors
//! bytes), then called on batch-first host arrays. torch's forward rules (batch_first,
//! unbatched inputs, mask merging, weight averaging) live in python/wgpu_mha/_mha.py.

use pyo3::prelude::*;
use wgpu_mha::io::layouts::load_weights;
use wgpu_mha::{ForwardOptions, Mask, MultiHeadAttention, SafetensorsFile};

use crate::arrays::{host, tensor_array};
use crate::device::Device;
use crate::errors::guard;

/// A module whose weights stay on the device.
#[pyclass(module = "wgpu_mha._native", name = "Mha", frozen)]
pub struct Mha {
    mha: MultiHeadAttention,
}

#[pymethods]
impl Mha {
    /// From `state_dict` tensors serialized as safetensors (`in_proj_weight` … `out_proj.bias`,
    /// or `q_proj_weight`/`k_proj_weight`/`v_proj_weight` for kdim/vdim, `bias_k`/`bias_v`),
    /// `heads` heads, and `add_zero_attn`.
    #[new]
    #[pyo3(signature = (device, safetensors, heads, add_zero_attn=false))]
    fn new(
        py: Python<'_>,
        device: &Device,
        safetensors: Vec<u8>,
        heads: usize,
        add_zero_attn: bool,
    ) -> PyResult<Self> {
        let gpu = &device.gpu;
        let mha = guard(py, || {
            let file =
                SafetensorsFile::from_bytes("nn.MultiheadAttention state_dict", safetensors)?;
            let mut loaded = load_weights(&file, "", Some(heads))?;
            if add_zero_attn {
                loaded.config = loaded
                    .config
                    .with_appended_keys(loaded.config.add_bias_kv, true);
            }
            MultiHeadAttention::new(gpu, loaded.config, &loaded.weights)
        })?;
        Ok(Mha { mha })
    }

    #[getter]
    fn embed_dim(&self) -> usize {
        self.mha.config().model_dim
    }
    #[getter]
    fn kdim(&self) -> usize {
        self.mha.config().key_dim
    }
    #[getter]
    fn vdim(&self) -> usize {
        self.mha.config().value_dim
    }
    #[getter]
    fn num_heads(&self) -> usize {
        self.mha.config().heads
    }
    /// Keys the module appends to every input's (bias_k, a zero key).
    #[getter]
    fn appended_keys(&self) -> usize {
        self.mha.config().appended_keys()
    }

    /// `query [B, Lq, E]`, `key [B, Lk, kdim]`, `value [B, Lk, vdim]` (float32 or float16,
    /// computed in float32); `bias`: None or a float32 `[B|1, H|1, Lq|1, Lk|1]` added to the
    /// scores (−inf = not allowed) over the input's keys. Returns `(output [B, Lq, E],
    /// weights [B, H, Lq, Lk + appended] | None)`.
    #[pyo3(signature = (query, key, value, bias=None, need_weights=false))]
    fn forward(
        &self,
        py: Python<'_>,
        query: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        bias: Option<&Bound<'_, PyAny>>,
        need_weights: bool,
    ) -> PyResult<(PyObject, Option<PyObject>)> {
        let q = host(query, "query")?.tensor()?;
        let k = host(key, "key")?.tensor()?;
        let v = host(value, "value")?.tensor()?;
        let mask = match bias {
            Some(b) if !b.is_none() => Mask::Bias(host(b, "attn_mask")?.tensor()?),
            _ => Mask::None,
        };
        let options = ForwardOptions {
            return_probs: need_weights,
            ..Default::default()
        };
        let out = guard(py, || self.mha.forward_with(&q, &k, &v, &mask, &options))?;
        let probs = out.probs.map(|p| tensor_array(py, p)).transpose()?;
        Ok((tensor_array(py, out.output)?, probs))
    }
}
