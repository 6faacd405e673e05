//! Serving many sequences from Python: a page pool on the device ([`PagedPool`]) and a batch
//! plan ([`BatchPlan`]) over `wgpu_mha::serve`. FlashInfer's names, argument rules and the
//! slot arithmetic of appends live in python/wgpu_mha/_serve.py; this side takes arrays the
//! Python layer has already checked and converted (uint32 tables, int64 slots, float32 data).

use numpy::{PyArrayDyn, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use wgpu_mha::serve::{
    BatchAttention, BatchOptions, KvLayout, PageTable, PagedKvPool, PlanInputs, PoolConfig,
    WarmPasses,
};
use wgpu_mha::{Error, Gpu, GpuTensor, KvDtype};

use crate::arrays::{array_f32, host};
use crate::device::Device;
use crate::errors::{guard, to_py, value_error};

/// A C-ordered copy of a numpy array of `T` (the Python layer converts before calling).
fn host_vec<T: numpy::Element + Copy>(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<T>> {
    let a = obj.downcast::<PyArrayDyn<T>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a numpy array of {}",
            std::any::type_name::<T>()
        ))
    })?;
    let a = a.readonly();
    Ok(a.as_array().iter().copied().collect())
}

fn layout(name: &str) -> PyResult<KvLayout> {
    KvLayout::parse(name).map_err(to_py)
}

fn layout_name(layout: KvLayout) -> &'static str {
    match layout {
        KvLayout::Nhd => "NHD",
        KvLayout::Hnd => "HND",
    }
}

/// One layer's keys and values in pages on the device: f32, f16, or q8_0 / q4_0 blocks.
#[pyclass(module = "wgpu_mha._native", name = "PagedPool", frozen)]
pub struct PagedPool {
    gpu: Gpu,
    pool: PagedKvPool,
}

#[pymethods]
impl PagedPool {
    /// A pool of zeros, or holding `data` (float32 or float16, in the pool's layout: `[max_pages,
    /// 2, page_size, kv_heads, head_dim]` for NHD, `[max_pages, 2, kv_heads, page_size,
    /// head_dim]` for HND), of `kv_dtype` elements ("f32", "f16", "q8_0", "q4_0"; a quantized
    /// pool quantizes `data`).
    #[new]
    #[pyo3(signature = (device, max_pages, page_size, kv_heads, head_dim, kv_layout, kv_dtype, data=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: &Device,
        max_pages: usize,
        page_size: usize,
        kv_heads: usize,
        head_dim: usize,
        kv_layout: &str,
        kv_dtype: &str,
        data: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config = PoolConfig {
            max_pages,
            page_size,
            kv_heads,
            head_dim,
            layout: layout(kv_layout)?,
            dtype: KvDtype::parse(kv_dtype).map_err(to_py)?,
        };
        let data = match data {
            Some(d) if !d.is_none() => Some(host(d, "paged_kv_cache")?.to_f32()),
            _ => None,
        };
        let gpu = device.gpu.clone();
        let pool = guard(py, || match data {
            Some(d) => PagedKvPool::upload(&gpu, config, &d),
            None => PagedKvPool::new(&gpu, config),
        })?;
        Ok(PagedPool { gpu, pool })
    }

    /// The whole pool as a new float32 array in its layout (blocking).
    fn read(&self, py: Python<'_>) -> PyResult<PyObject> {
        let data = guard(py, || self.pool.read(&self.gpu))?;
        array_f32(py, &self.shape(), data)
    }

    /// Writes `keys`, `values` (float32 `[n, kv_heads, head_dim]`) into `slots` (int64 `[n]`,
    /// `page · page_size + offset`; negative skips the token).
    fn append(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let keys = host(keys, "append_key")?.tensor()?;
        let vals = host(values, "append_value")?.tensor()?;
        let slots = host_vec::<i64>(slots, "slots")?;
        let gpu = &self.gpu;
        guard(py, || {
            let k = GpuTensor::upload(gpu, &keys)?;
            let v = GpuTensor::upload(gpu, &vals)?;
            self.pool.append(gpu, &k, &v, &slots)
        })
    }

    /// `[max_pages, 2, page_size, kv_heads, head_dim]` (NHD) or `[.., kv_heads, page_size, ..]`.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        let c = self.pool.config();
        match c.layout {
            KvLayout::Nhd => vec![c.max_pages, 2, c.page_size, c.kv_heads, c.head_dim],
            KvLayout::Hnd => vec![c.max_pages, 2, c.kv_heads, c.page_size, c.head_dim],
        }
    }
    #[getter]
    fn kv_layout(&self) -> &'static str {
        layout_name(self.pool.config().layout)
    }
    /// "f32", "f16", "q8_0" or "q4_0".
    #[getter]
    fn kv_dtype(&self) -> &'static str {
        self.pool.config().dtype.name()
    }

    /// Bytes one token takes in this pool (its keys and values, the blocks' real bytes).
    #[getter]
    fn bytes_per_token(&self) -> u64 {
        self.pool.config().bytes_per_token()
    }
}

/// Every paged attention pass a plan of these heads can pick, compiled and held (the Rust
/// `BatchAttention::warm_up`): no plan of them compiles while this lives.
#[pyclass(module = "wgpu_mha._native", name = "WarmPasses", frozen)]
pub struct PyWarmPasses {
    passes: WarmPasses,
}

#[pymethods]
impl PyWarmPasses {
    #[new]
    fn new(
        py: Python<'_>,
        device: &Device,
        num_qo_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        kv_dtype: &str,
    ) -> PyResult<Self> {
        let dtype = KvDtype::parse(kv_dtype).map_err(to_py)?;
        let gpu = device.gpu.clone();
        let passes = guard(py, || {
            BatchAttention::warm_up(&gpu, num_qo_heads, num_kv_heads, head_dim, dtype)
        })?;
        Ok(PyWarmPasses { passes })
    }

    fn __len__(&self) -> usize {
        self.passes.len()
    }
}

/// One step's batched attention over a page pool: the table checked and the keys split once,
/// run for every layer (always with the log-sum-exp; the Python layer drops it unless asked).
#[pyclass(module = "wgpu_mha._native", name = "BatchPlan", frozen)]
pub struct BatchPlan {
    gpu: Gpu,
    plan: BatchAttention,
    heads: usize,
    head_dim: usize,
}

#[pymethods]
impl BatchPlan {
    /// The four tables are uint32 numpy arrays; `window_left` None = no window, `softcap` None
    /// = none, `scale` None = 1/√head_dim.
    #[new]
    #[pyo3(signature = (device, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, kv_layout, kv_dtype, causal, window_left=None, softcap=None, scale=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: &Device,
        qo_indptr: &Bound<'_, PyAny>,
        kv_indptr: &Bound<'_, PyAny>,
        kv_indices: &Bound<'_, PyAny>,
        kv_last_page_len: &Bound<'_, PyAny>,
        num_qo_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        page_size: usize,
        kv_layout: &str,
        kv_dtype: &str,
        causal: bool,
        window_left: Option<usize>,
        softcap: Option<f32>,
        scale: Option<f32>,
    ) -> PyResult<Self> {
        let qo_indptr = host_vec::<u32>(qo_indptr, "qo_indptr")?;
        let table = PageTable {
            kv_indptr: host_vec::<u32>(kv_indptr, "kv_indptr")?,
            kv_indices: host_vec::<u32>(kv_indices, "kv_indices")?,
            kv_last_page_len: host_vec::<u32>(kv_last_page_len, "kv_last_page_len")?,
        };
        let layout = layout(kv_layout)?;
        let dtype = KvDtype::parse(kv_dtype).map_err(to_py)?;
        let gpu = device.gpu.clone();
        let plan = guard(py, || {
            BatchAttention::plan(
                &gpu,
                &PlanInputs {
                    qo_indptr: &qo_indptr,
                    table: &table,
                    num_qo_heads,
                    num_kv_heads,
                    head_dim,
                    page_size,
                    layout,
                    dtype,
                    options: BatchOptions {
                        causal,
                        window_left,
                        scale,
                        softcap,
                        return_lse: true,
                        ..Default::default()
                    },
                },
            )
        })?;
        Ok(BatchPlan {
            gpu,
            plan,
            heads: num_qo_heads,
            head_dim,
        })
    }

    /// Query rows of the step.
    #[getter]
    fn total_q(&self) -> usize {
        self.plan.total_q()
    }

    /// Most keys one work item covers (a sequence with more is split, its parts merged).
    #[getter]
    fn chunk_keys(&self) -> usize {
        self.plan.chunk_keys()
    }

    /// `q` float32 `[total_q, H, D]` over `pool` → `(out [total_q, H, D], lse [total_q, H])`,
    /// float32, the log-sum-exp in natural log; lse only read back when `return_lse`.
    fn run(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        pool: &PagedPool,
        return_lse: bool,
    ) -> PyResult<(PyObject, Option<PyObject>)> {
        let q = host(q, "q")?.tensor()?;
        let (tq, h, d) = (self.plan.total_q(), self.heads, self.head_dim);
        if q.shape() != [tq, h, d] {
            return Err(value_error(format!(
                "q must be [total_q {tq}, num_qo_heads {h}, head_dim {d}] as planned, got {:?}",
                q.shape()
            )));
        }
        let gpu = &self.gpu;
        let (out, lse) = guard(py, || {
            if tq == 0 {
                return Ok((Vec::new(), Vec::new()));
            }
            let q = GpuTensor::upload(gpu, &q)?;
            let out = GpuTensor::zeros(gpu, &[tq, h, d])?;
            let lse = GpuTensor::zeros(gpu, &[tq, h])?;
            self.plan.run(&q, &pool.pool, &out, Some(&lse))?;
            let lse = match return_lse {
                true => lse.read(gpu)?.into_data(),
                false => Vec::new(),
            };
            Ok::<_, Error>((out.read(gpu)?.into_data(), lse))
        })?;
        let out = array_f32(py, &[tq, h, d], out)?;
        let lse = match return_lse {
            true => Some(array_f32(py, &[tq, h], lse)?),
            false => None,
        };
        Ok((out, lse))
    }
}

/// `ValueError` naming the first wrong index of a page table (uint32 arrays) for a pool of
/// `max_pages` pages of `page_size` tokens: the engine's own check, so appends and plans word
/// their refusals alike.
#[pyfunction]
pub fn check_page_table(
    kv_indptr: &Bound<'_, PyAny>,
    kv_indices: &Bound<'_, PyAny>,
    kv_last_page_len: &Bound<'_, PyAny>,
    max_pages: usize,
    page_size: usize,
) -> PyResult<()> {
    let table = PageTable {
        kv_indptr: host_vec::<u32>(kv_indptr, "kv_indptr")?,
        kv_indices: host_vec::<u32>(kv_indices, "kv_indices")?,
        kv_last_page_len: host_vec::<u32>(kv_last_page_len, "kv_last_page_len")?,
    };
    table.check(max_pages, page_size).map_err(to_py)
}
