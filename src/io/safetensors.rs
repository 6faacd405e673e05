//! Safetensors in and out: a validated, typed reader ([`SafetensorsFile`]) for weights, case
//! files and the CLI, and [`write_safetensors`]. The weight layouts it is read in are in
//! [`crate::io::layouts`].

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::io::files;
use crate::model::mask::MaskTensor;
use crate::model::tensor::Tensor;

/// A safetensors file read into memory and validated (header, offsets, sizes).
///
/// Nothing here panics on a corrupt or truncated file: every failure is an [`Error::File`] (or
/// [`Error::Io`] when the file cannot be read at all).
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    name: String,
    bytes: Vec<u8>,
    data_start: usize,
    metadata: HashMap<String, String>,
    tensors: HashMap<String, TensorInfo>,
}

impl SafetensorsFile {
    /// Reads and validates a file; messages name it by its path. Only a regular file is read,
    /// never more than its size, and its header length is checked before the rest is read
    /// (see [`crate::io::files::read_safetensors_bytes`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = files::read_safetensors_bytes(path)?;
        Self::from_bytes(path.display().to_string(), bytes)
    }

    /// Validates bytes already in memory; `name` is used in messages.
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> Result<Self> {
        let name = name.into();
        files::check_header_len(&name, &bytes, bytes.len() as u64)?;
        let (header_len, metadata): (usize, Metadata) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| Error::file(&name, format!("not a readable safetensors file ({e})")))?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(k, info)| (k, info.clone()))
            .collect();
        Ok(SafetensorsFile {
            data_start: 8 + header_len,
            metadata: metadata.metadata().clone().unwrap_or_default(),
            tensors,
            name,
            bytes,
        })
    }

    /// The name used in messages (the path for [`open`](Self::open)).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A string from the `__metadata__` header.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }

    /// Whether a tensor of this name exists.
    pub fn contains(&self, tensor: &str) -> bool {
        self.tensors.contains_key(tensor)
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Shape of a tensor, if it exists.
    pub fn shape(&self, tensor: &str) -> Option<&[usize]> {
        self.tensors.get(tensor).map(|t| t.shape.as_slice())
    }

    /// Dtype of a tensor, if it exists.
    pub fn dtype(&self, tensor: &str) -> Option<Dtype> {
        self.tensors.get(tensor).map(|t| t.dtype)
    }

    fn raw(&self, tensor: &str) -> std::result::Result<(&TensorInfo, &[u8]), String> {
        let info = self.tensors.get(tensor).ok_or("is missing")?;
        let (start, end) = info.data_offsets;
        // `read_metadata` has checked the offsets; stay defensive anyway.
        let data = self
            .bytes
            .get(self.data_start + start..self.data_start + end)
            .ok_or("has data offsets outside the file")?;
        Ok((info, data))
    }

    /// Values of a floating-point tensor (F32, F16 or BF16) as f32; the error is a problem
    /// phrase for the caller to attach to the tensor's name.
    pub(crate) fn read_f32(
        &self,
        tensor: &str,
    ) -> std::result::Result<(Vec<usize>, Vec<f32>), String> {
        let (info, data) = self.raw(tensor)?;
        let values = match info.dtype {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => return Err(format!("has dtype {other:?}; it must be F32, F16 or BF16")),
        };
        Ok((info.shape.clone(), values))
    }

    /// Values of a floating-point tensor (F64, F32, F16 or BF16) as f64.
    fn read_f64(&self, tensor: &str) -> std::result::Result<(Vec<usize>, Vec<f64>), String> {
        let (info, data) = self.raw(tensor)?;
        if info.dtype == Dtype::F64 {
            let values = data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            return Ok((info.shape.clone(), values));
        }
        let (shape, values) = self.read_f32(tensor).map_err(|_| {
            format!(
                "has dtype {:?}; it must be F64, F32, F16 or BF16",
                info.dtype
            )
        })?;
        Ok((shape, values.into_iter().map(f64::from).collect()))
    }

    /// A float tensor (F32, F16 or BF16) as an f32 [`Tensor`]; a missing tensor or another
    /// dtype is an [`Error::File`] naming it.
    pub fn tensor_f32(&self, tensor: &str) -> Result<Tensor> {
        let (shape, values) = self
            .read_f32(tensor)
            .map_err(|p| self.tensor_error(tensor, p))?;
        Tensor::new(shape, values)
    }

    /// A float tensor (F64, F32, F16 or BF16) widened to f64: `(shape, values)`.
    pub fn tensor_f64(&self, tensor: &str) -> Result<(Vec<usize>, Vec<f64>)> {
        self.read_f64(tensor)
            .map_err(|p| self.tensor_error(tensor, p))
    }

    /// A U8 or BOOL tensor as a [`MaskTensor`] (any nonzero byte is "set").
    pub fn mask_tensor(&self, tensor: &str) -> Result<MaskTensor> {
        let (info, data) = self.raw(tensor).map_err(|p| self.tensor_error(tensor, p))?;
        match info.dtype {
            Dtype::U8 | Dtype::BOOL => MaskTensor::new(info.shape.clone(), data.to_vec()),
            other => Err(self.tensor_error(
                tensor,
                format!("has dtype {other:?}; a mask must be U8 or BOOL"),
            )),
        }
    }

    /// An integer tensor (I64, I32, U32, U16, U8) of non-negative values, such as
    /// `position_ids`: `(shape, values)`.
    pub fn tensor_indices(&self, tensor: &str) -> Result<(Vec<usize>, Vec<usize>)> {
        let (info, data) = self.raw(tensor).map_err(|p| self.tensor_error(tensor, p))?;
        let signed: Vec<i64> = match info.dtype {
            Dtype::I64 => data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            Dtype::I32 => data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::U32 => data
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::U16 => data
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            Dtype::U8 => data.iter().map(|&v| v as i64).collect(),
            other => {
                return Err(self.tensor_error(
                    tensor,
                    format!("has dtype {other:?}; indices must be I64, I32, U32, U16 or U8"),
                ))
            }
        };
        let values = signed
            .iter()
            .map(|&v| usize::try_from(v))
            .collect::<std::result::Result<Vec<usize>, _>>()
            .map_err(|_| self.tensor_error(tensor, "holds a negative value"))?;
        Ok((info.shape.clone(), values))
    }

    /// An [`Error::File`] about one tensor of this file.
    pub(crate) fn tensor_error(&self, tensor: &str, problem: impl std::fmt::Display) -> Error {
        Error::file(&self.name, format!("tensor `{tensor}` {problem}"))
    }

    /// Parses a whole-number metadata value (`num_heads`), `None` when the key is absent.
    pub(crate) fn metadata_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.metadata(key) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| {
                Error::file(
                    &self.name,
                    format!("metadata `{key}` = {v:?} is not a whole number"),
                )
            }),
        }
    }
}

/// f32 tensors (and optional string metadata) as the bytes of a safetensors file.
pub fn serialize_safetensors(
    tensors: &[(&str, &Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>> {
    // The safetensors crate indexes out of bounds on a repeated name; refuse it first.
    let mut seen = std::collections::HashSet::new();
    if let Some((name, _)) = tensors.iter().find(|(name, _)| !seen.insert(*name)) {
        return Err(Error::file(
            "output",
            format!("tensor name `{name}` is given twice"),
        ));
    }
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, t)| t.data().iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, t), b)| {
            safetensors::tensor::TensorView::new(Dtype::F32, t.shape().to_vec(), b)
                .map(|view| (*name, view))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .and_then(|views| safetensors::serialize(views, metadata));
    views.map_err(|e| Error::file("output", format!("cannot serialize: {e}")))
}

/// Writes f32 tensors (and optional string metadata) to a safetensors file, atomically: a
/// failure leaves an existing file at `path` as it was.
pub fn write_safetensors(
    path: impl AsRef<Path>,
    tensors: &[(&str, &Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    files::write_atomically(path.as_ref(), &serialize_safetensors(tensors, metadata)?)
}
