//! Engine errors as Python exceptions, and the one way native code runs engine work.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use wgpu_mha::Error;

/// ValueError for what the caller passed (shapes, masks, configs, files, sizes), RuntimeError
/// for what the device or the system did; the message is the engine's.
pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::NoAdapter { .. }
        | Error::RequestDevice { .. }
        | Error::Unsupported { .. }
        | Error::Gpu { .. }
        | Error::DeviceLost(_)
        | Error::Io { .. } => PyRuntimeError::new_err(message),
        _ => PyValueError::new_err(message),
    }
}

/// Runs `work` with the GIL released, its error mapped by [`to_py`]; a panic (a bug, never
/// expected) becomes a RuntimeError instead of unwinding into the interpreter.
pub fn guard<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> wgpu_mha::Result<T> + Send,
) -> PyResult<T> {
    py.allow_threads(|| catch_unwind(AssertUnwindSafe(work)))
        .map_err(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            PyRuntimeError::new_err(format!("wgpu_mha internal error: {what}"))
        })?
        .map_err(to_py)
}

/// A ValueError with `message` (argument checks done before any engine call).
pub fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}
