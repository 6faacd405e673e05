//! A user's files are sacred: inputs are read only as far as their size allows, and only when
//! they are regular files; outputs are written to a temporary file beside the target and
//! renamed over it, so a failure leaves the old file as it was.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The largest safetensors header accepted (the JSON that lists the tensors): far above any
/// real checkpoint's, small enough that a corrupt length cannot make us allocate gigabytes.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The largest `config.json` accepted: real ones are a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// The largest `model.safetensors.index.json` accepted: a checkpoint of ~100k tensors (the
/// largest mixture-of-experts models) writes about 10 MiB.
pub const MAX_INDEX_BYTES: u64 = 32 << 20;

/// Opens `path` for reading when it is a regular file (after following links); a directory,
/// FIFO, device or socket is an `Err` naming what it is, before anything is read from it, and
/// a link to nothing is reported as such.
fn open_regular(path: &Path) -> Result<(File, u64)> {
    let meta = std::fs::metadata(path).map_err(|e| match std::fs::read_link(path) {
        Ok(to) if e.kind() == std::io::ErrorKind::NotFound => Error::file(
            path.display().to_string(),
            format!("is a link to {}, which does not exist", to.display()),
        ),
        _ => io_error(path, e),
    })?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file (a FIFO, device or socket)"
        };
        return Err(Error::file(
            path.display().to_string(),
            format!("is {kind}; give a regular file"),
        ));
    }
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    Ok((file, meta.len()))
}

/// Reads a safetensors file: its 8-byte header length first, which must fit the file's size and
/// [`MAX_HEADER_BYTES`], then the rest, never more than the size said.
pub fn read_safetensors_bytes(path: &Path) -> Result<Vec<u8>> {
    let name = path.display().to_string();
    let (file, size) = open_regular(path)?;
    if size < 8 {
        return Err(Error::file(
            name,
            format!("is {size} bytes, too short for a safetensors header"),
        ));
    }
    let mut bytes = Vec::with_capacity(8);
    let mut reader = file.take(size);
    (&mut reader)
        .take(8)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, e))?;
    if bytes.len() == 8 {
        check_header_len(&name, &bytes, size)?;
    }
    bytes.reserve_exact(size as usize - bytes.len());
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, e))?;
    if bytes.len() as u64 != size {
        return Err(Error::file(
            name,
            format!(
                "changed while being read ({size} bytes expected, {} read)",
                bytes.len()
            ),
        ));
    }
    Ok(bytes)
}

/// Reads a text file (a `config.json`, an index) of at most `max_bytes`, when it is a regular
/// file: a FIFO, a device or a link to `/dev/zero` is refused before it is read, a larger file
/// is refused by its size, and no more than the size said is ever read.
pub fn read_text(path: &Path, max_bytes: u64) -> Result<String> {
    let name = path.display().to_string();
    let (file, size) = open_regular(path)?;
    if size > max_bytes {
        return Err(Error::file(
            name,
            format!("is {size} bytes, more than the {max_bytes} bytes accepted for it"),
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(size)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, e))?;
    String::from_utf8(bytes).map_err(|_| Error::file(name, "is not UTF-8 text"))
}

/// Whether `path` names a directory entry, a link to nothing included (`Path::exists` says
/// no to those, and a dangling `config.json` must be reported, not taken as absent).
pub fn entry_exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Checks the little-endian header length at the start of `bytes` against [`MAX_HEADER_BYTES`]
/// and the `size` of the whole file.
pub fn check_header_len(name: &str, bytes: &[u8], size: u64) -> Result<()> {
    let Some(head) = bytes.get(..8) else {
        return Err(Error::file(name, "too short for a safetensors header"));
    };
    let mut len = [0u8; 8];
    len.copy_from_slice(head);
    let header = u64::from_le_bytes(len);
    if header > MAX_HEADER_BYTES {
        return Err(Error::file(
            name,
            format!(
                "declares a {header}-byte header, more than the {MAX_HEADER_BYTES} bytes accepted"
            ),
        ));
    }
    if 8 + header > size {
        return Err(Error::file(
            name,
            format!("declares a {header}-byte header, but the file has {size} bytes"),
        ));
    }
    Ok(())
}

/// An output file being written: a temporary file beside the target, renamed over it by
/// [`commit`](Self::commit). Dropped without a commit, it removes the temporary file and
/// leaves the target untouched.
#[derive(Debug)]
pub struct PendingOutput {
    target: PathBuf,
    temp: PathBuf,
    file: Option<File>,
}

impl PendingOutput {
    /// Creates the temporary file now, so a missing or read-only directory is reported before
    /// any work is done. `inputs` are the files the work reads: a target that is (or resolves
    /// to) one of them is refused.
    pub fn create(target: &Path, inputs: &[&Path]) -> Result<Self> {
        let refuse = |why: String| Error::file(target.display().to_string(), why);
        if target.is_dir() {
            return Err(refuse(
                "is a directory; give a file path for the output".into(),
            ));
        }
        for input in inputs {
            if same_file(target, input) {
                return Err(refuse(format!(
                    "is the input {}; writing there would destroy it. Choose another output path",
                    input.display()
                )));
            }
        }
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(refuse(format!(
                "cannot be written: the directory {} does not exist",
                dir.display()
            )));
        }
        let name = target.file_name().unwrap_or_default().to_string_lossy();
        let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let file = File::create(&temp)
            .map_err(|e| refuse(format!("cannot be written in {}: {e}", dir.display())))?;
        Ok(PendingOutput {
            target: target.to_path_buf(),
            temp,
            file: Some(file),
        })
    }

    /// Writes `bytes`, flushes them to disk and renames the temporary file over the target.
    pub fn commit(mut self, bytes: &[u8]) -> Result<()> {
        // The file is closed at the end of this block, before the rename.
        {
            let Some(mut file) = self.file.take() else {
                return Err(io_error(&self.temp, std::io::ErrorKind::NotFound.into()));
            };
            file.write_all(bytes)
                .and_then(|()| file.sync_all())
                .map_err(|e| io_error(&self.temp, e))?;
        }
        std::fs::rename(&self.temp, &self.target).map_err(|e| io_error(&self.target, e))
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        // Committed: the temporary file was renamed away. Otherwise remove it.
        if self.temp.exists() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Whether `a` is `b`: the same path after resolving links, or the same file (a hard link).
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ca), Ok(cb)) = (std::fs::canonicalize(a), std::fs::canonicalize(b)) else {
        return false;
    };
    if ca == cb {
        return true;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(ma), Ok(mb)) = (std::fs::metadata(&ca), std::fs::metadata(&cb)) {
            return ma.dev() == mb.dev() && ma.ino() == mb.ino();
        }
    }
    false
}

/// Writes `bytes` to `target` atomically (see [`PendingOutput`]).
pub fn write_atomically(target: &Path, bytes: &[u8]) -> Result<()> {
    PendingOutput::create(target, &[])?.commit(bytes)
}
