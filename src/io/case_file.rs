//! Reading a case file: its metadata `variant` picks the reader, the seeds' (`io::case`) or a
//! Hugging Face module's (`io::hf::case`). Kept apart from both, which it calls, so that
//! `io::hf::case` can build on `io::case`'s types without either importing the other.

use std::path::Path;

use crate::error::{Error, Result};
use crate::io::case::{seed_case, Case, CaseVariant};
use crate::io::safetensors::SafetensorsFile;

impl Case {
    /// Reads a case file; every problem (unreadable, corrupt, inconsistent) is an `Err`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_safetensors(&SafetensorsFile::open(path)?)
    }

    /// Reads a case from bytes in memory; `name` is used in messages.
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> Result<Self> {
        Self::from_safetensors(&SafetensorsFile::from_bytes(name, bytes)?)
    }

    /// Reads a case from an opened safetensors file.
    pub fn from_safetensors(file: &SafetensorsFile) -> Result<Self> {
        let bad_meta = |problem: String| Error::file(file.name(), problem);
        let variant =
            match file.metadata("variant") {
                Some("dmodel") => CaseVariant::Classic,
                Some("perhead") => CaseVariant::PerHead,
                Some("hf") => return crate::io::hf::case::from_file(file),
                Some(other) => {
                    return Err(bad_meta(format!(
                "metadata `variant` = {other:?}; a case file has \"dmodel\", \"perhead\" or \"hf\""
            )))
                }
                None => return Err(bad_meta(
                    "metadata `variant` is missing; is this a case file? (weight files are loaded \
                     with `run --weights`)"
                        .into(),
                )),
            };
        seed_case(file, variant)
    }
}
