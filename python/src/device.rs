//! `Device` (one adapter and its queue) and `adapters()`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use wgpu_mha::{list_adapters, Error, Gpu, GpuOptions};

use crate::errors::{guard, to_py};

/// One GPU adapter with its device and queue, shared by every module made on it. Cheap to
/// share between threads: the engine serialises what must be serialised.
#[pyclass(module = "wgpu_mha._native", name = "Device", frozen)]
pub struct Device {
    pub gpu: Gpu,
}

#[pymethods]
impl Device {
    /// `backend`: "vulkan", "metal", "dx12" or "gl" (a comma-separated list allowed);
    /// `adapter`: a case-insensitive substring of the adapter's name. `None` honours the
    /// environment variables `WGPU_BACKEND` and `WGPU_ADAPTER_NAME` as the CLI does, then takes
    /// the first adapter found.
    #[new]
    #[pyo3(signature = (backend=None, adapter=None))]
    fn new(py: Python<'_>, backend: Option<String>, adapter: Option<String>) -> PyResult<Self> {
        let options = GpuOptions {
            backend,
            adapter_name: adapter,
            ..Default::default()
        };
        let gpu = guard(py, || Gpu::with_options(&options))?;
        Ok(Device { gpu })
    }

    /// The adapter's name.
    #[getter]
    fn name(&self) -> String {
        self.gpu.info().name.clone()
    }

    /// "vulkan", "metal", "dx12" or "gl".
    #[getter]
    fn backend(&self) -> String {
        self.gpu.info().backend.to_string().to_lowercase()
    }

    /// Whether float16 inputs are computed in float16 (the adapter has `SHADER_F16`); without
    /// it they are widened to float32 first.
    #[getter]
    fn shader_f16(&self) -> bool {
        self.gpu.has_f16()
    }

    /// The page layout this adapter's paged attention reads fastest, for caches whose layout
    /// is the caller's choice: "HND" on a CPU adapter (lavapipe), "NHD" (FlashInfer's
    /// default) on a GPU — the Rust `KvLayout::preferred`.
    #[getter]
    fn preferred_kv_layout(&self) -> &'static str {
        match wgpu_mha::serve::KvLayout::preferred(&self.gpu) {
            wgpu_mha::serve::KvLayout::Nhd => "NHD",
            wgpu_mha::serve::KvLayout::Hnd => "HND",
        }
    }

    /// "cpu" when the engine runs its CPU-adapter kernel shapes here (a software adapter such as
    /// lavapipe, or `WGPU_MHA_KERNELS=cpu`), else "gpu".
    #[getter]
    fn kernel_class(&self) -> &'static str {
        match self.gpu.kernel_class() {
            wgpu_mha::KernelClass::Cpu => "cpu",
            wgpu_mha::KernelClass::Gpu => "gpu",
        }
    }

    fn __repr__(&self) -> String {
        format!("Device({})", self.gpu.describe())
    }
}

/// Every adapter wgpu finds (on `backend` only, when given): dicts with `name`, `backend`,
/// `device_type`, `driver`, `shader_f16`. An unknown backend is `Device(backend=...)`'s
/// ValueError, not an empty list.
#[pyfunction]
#[pyo3(signature = (backend=None))]
pub fn adapters(py: Python<'_>, backend: Option<String>) -> PyResult<Vec<Py<PyDict>>> {
    if let Some(b) = &backend {
        if wgpu::Backends::from_comma_list(b).is_empty() {
            // The words of Gpu::with_options' own check, which Device(backend=...) raises.
            return Err(to_py(Error::Misuse(format!(
                "unknown backend `{b}`: use vulkan, metal, dx12 or gl (comma-separated for several)"
            ))));
        }
    }
    let found = py.allow_threads(|| list_adapters(backend.as_deref()));
    found
        .into_iter()
        .map(|a| {
            let d = PyDict::new(py);
            d.set_item("name", &a.info.name)?;
            d.set_item("backend", a.info.backend.to_string().to_lowercase())?;
            d.set_item("device_type", format!("{:?}", a.info.device_type))?;
            d.set_item(
                "driver",
                format!("{} {}", a.info.driver, a.info.driver_info),
            )?;
            d.set_item(
                "shader_f16",
                a.features.contains(wgpu::Features::SHADER_F16),
            )?;
            Ok(d.unbind())
        })
        .collect()
}
