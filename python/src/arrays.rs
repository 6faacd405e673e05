//! numpy arrays in and out: inputs are copied into owned host data (so the GIL can be
//! released), results become new arrays.

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use wgpu_mha::Tensor;

use crate::errors::value_error;

/// Elements of one array, as they came.
pub enum HostData {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
}

/// A C-ordered copy of an f32 or f16 array.
pub struct Host {
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl Host {
    pub fn is_f16(&self) -> bool {
        matches!(self.data, HostData::F16(_))
    }

    /// The elements as f32 (f16 widened exactly).
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            HostData::F32(v) => v.clone(),
            HostData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }

    pub fn tensor(&self) -> PyResult<Tensor> {
        Tensor::new(self.shape.clone(), self.to_f32()).map_err(crate::errors::to_py)
    }
}

/// `obj` as a float32 or float16 numpy array (any strides: the copy is C-ordered).
pub fn host(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Host> {
    if let Ok(a) = obj.downcast::<PyArrayDyn<f32>>() {
        let a = a.readonly();
        let view = a.as_array();
        return Ok(Host {
            shape: view.shape().to_vec(),
            data: HostData::F32(view.iter().copied().collect()),
        });
    }
    if let Ok(a) = obj.downcast::<PyArrayDyn<half::f16>>() {
        let a = a.readonly();
        let view = a.as_array();
        return Ok(Host {
            shape: view.shape().to_vec(),
            data: HostData::F16(view.iter().copied().collect()),
        });
    }
    Err(PyTypeError::new_err(format!(
        "{name} must be a numpy array of float32 or float16, got {}",
        describe(obj)
    )))
}

/// `obj` as a C-ordered copy of a bool or uint8 array (nonzero = set).
pub fn host_u8(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(Vec<usize>, Vec<u8>)> {
    if let Ok(a) = obj.downcast::<PyArrayDyn<bool>>() {
        let a = a.readonly();
        let view = a.as_array();
        return Ok((
            view.shape().to_vec(),
            view.iter().map(|&b| b as u8).collect(),
        ));
    }
    if let Ok(a) = obj.downcast::<PyArrayDyn<u8>>() {
        let a = a.readonly();
        let view = a.as_array();
        return Ok((view.shape().to_vec(), view.iter().copied().collect()));
    }
    Err(PyTypeError::new_err(format!(
        "{name} must be a numpy array of bool or uint8, got {}",
        describe(obj)
    )))
}

/// `obj` as a C-ordered copy of an integer array of non-negative values.
pub fn host_indices(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(Vec<usize>, Vec<usize>)> {
    let (shape, values): (Vec<usize>, Vec<i64>) = if let Ok(a) = obj.downcast::<PyArrayDyn<i64>>() {
        let a = a.readonly();
        let v = a.as_array();
        (v.shape().to_vec(), v.iter().copied().collect())
    } else if let Ok(a) = obj.downcast::<PyArrayDyn<i32>>() {
        let a = a.readonly();
        let v = a.as_array();
        (v.shape().to_vec(), v.iter().map(|&x| x as i64).collect())
    } else {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a numpy array of int64 or int32, got {}",
            describe(obj)
        )));
    };
    let values = values
        .into_iter()
        .map(|x| usize::try_from(x).map_err(|_| value_error(format!("{name} holds {x} < 0"))))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((shape, values))
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    match obj.downcast::<numpy::PyUntypedArray>() {
        Ok(a) => format!("an array of dtype {}", a.dtype()),
        Err(_) => obj
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "an object".into()),
    }
}

/// A new float32 array of `shape` holding `data`.
pub fn array_f32(py: Python<'_>, shape: &[usize], data: Vec<f32>) -> PyResult<PyObject> {
    let a = ArrayD::from_shape_vec(IxDyn(shape), data)
        .map_err(|e| value_error(format!("result of shape {shape:?}: {e}")))?;
    Ok(a.into_pyarray(py).into_any().unbind())
}

/// A host tensor as a new float32 array.
pub fn tensor_array(py: Python<'_>, t: Tensor) -> PyResult<PyObject> {
    let shape = t.shape().to_vec();
    array_f32(py, &shape, t.into_data())
}
