//! `wgpu_mha._native`: the engine's entry points on host arrays, for the Python package
//! `wgpu_mha` (python/wgpu_mha), which adds torch's argument rules, broadcasting and tensor
//! kinds on top. Every call copies its inputs out of the arrays, then releases the GIL while
//! the GPU works ([`errors::guard`]); no engine error or panic crosses into Python unmapped.

use pyo3::prelude::*;

mod arrays;
mod device;
mod errors;
mod hf;
mod mha;
mod sdpa;
mod serve;

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<device::Device>()?;
    m.add_class::<mha::Mha>()?;
    m.add_class::<hf::HfModule>()?;
    m.add_class::<hf::HfKvCache>()?;
    m.add_class::<serve::PagedPool>()?;
    m.add_class::<serve::BatchPlan>()?;
    m.add_class::<serve::PyWarmPasses>()?;
    m.add_function(wrap_pyfunction!(device::adapters, m)?)?;
    m.add_function(wrap_pyfunction!(hf::kv_dtype_name, m)?)?;
    m.add_function(wrap_pyfunction!(sdpa::sdpa, m)?)?;
    m.add_function(wrap_pyfunction!(serve::check_page_table, m)?)?;
    m.add_function(wrap_pyfunction!(sdpa::bench_rust_sdpa, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
