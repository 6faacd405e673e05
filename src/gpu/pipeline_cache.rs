//! Compiled pipelines kept on disk between processes, where the adapter offers it
//! (`wgpu::Features::PIPELINE_CACHE`, Vulkan): the second start of a program compiles nothing
//! its first start already did, on drivers that keep no cache of their own.
//!
//! One file per adapter and driver in the cache directory (`WGPU_MHA_PIPELINE_CACHE`, else
//! the platform's: `$XDG_CACHE_HOME` or `~/.cache` on Linux, `~/Library/Caches` on macOS,
//! `%LOCALAPPDATA%` on Windows, each `/wgpu-mha`). The file is wgpu's cache data behind a
//! header of ours with its length and checksum: wgpu checks that data was made for this adapter
//! and driver, but not that its bytes are whole, and a driver handed corrupt cache data may
//! crash. Anything that fails either check is ignored with a warning and replaced.
//!
//! Bounds: a file over [`MAX_FILE_BYTES`] is neither read nor written (the next process starts
//! a fresh one), and at most [`MAX_FILES`] adapters' files are kept (the oldest go first).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where the cache lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PipelineCacheDir {
    /// `WGPU_MHA_PIPELINE_CACHE` (a directory, or `off`), else the platform's cache directory.
    #[default]
    FromEnv,
    /// No cache on disk.
    Off,
    /// This directory (made if missing).
    At(PathBuf),
}

/// Largest cache file read or written. Pipelines of every kernel family at a few head sizes
/// take far less; more means shapes keep changing and the cache should start over.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Cache files kept in the directory (one per adapter and driver).
pub const MAX_FILES: usize = 8;

const MAGIC: &[u8; 8] = b"WGPUMHA1";
const HEADER_BYTES: usize = 8 + 8 + 8;

/// FNV-1a over `bytes`: enough to tell a torn or damaged file from a whole one.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `MAGIC`, the data's length and checksum, the data.
fn wrap(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(data).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// The data inside a file [`wrap`] wrote, or why there is none.
fn unwrap_file(bytes: &[u8]) -> Result<&[u8], &'static str> {
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
        return Err("not a wgpu-mha pipeline cache");
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let data = &bytes[HEADER_BYTES..];
    if word(8) != data.len() as u64 {
        return Err("its length does not match its header (torn or truncated)");
    }
    if word(16) != checksum(data) {
        return Err("its checksum does not match (damaged)");
    }
    Ok(data)
}

/// The platform's cache directory for this crate, if the environment names one.
fn platform_dir() -> Option<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let base = if cfg!(target_os = "windows") {
        var("LOCALAPPDATA")?
    } else if cfg!(target_os = "macos") {
        var("HOME")?.join("Library/Caches")
    } else {
        var("XDG_CACHE_HOME").or_else(|| Some(var("HOME")?.join(".cache")))?
    };
    Some(base.join("wgpu-mha"))
}

/// The directory `setting` names, `None` when the cache is off.
fn directory(setting: &PipelineCacheDir) -> Option<PathBuf> {
    match setting {
        PipelineCacheDir::Off => None,
        PipelineCacheDir::At(dir) => Some(dir.clone()),
        PipelineCacheDir::FromEnv => match std::env::var_os("WGPU_MHA_PIPELINE_CACHE") {
            Some(v) if v == "off" || v == "0" => None,
            Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
            _ => platform_dir(),
        },
    }
}

fn warn(path: &Path, why: impl std::fmt::Display) {
    eprintln!(
        "wgpu-mha: warning: pipeline cache {}: {why}; compiling without it",
        path.display()
    );
}

/// An adapter's pipeline cache and the file it is kept in.
#[derive(Debug)]
pub struct DiskCache {
    pub(crate) cache: wgpu::PipelineCache,
    path: PathBuf,
    /// Bytes of wgpu data last read or written: a save that would write the same is skipped.
    saved_len: Mutex<usize>,
}

impl DiskCache {
    /// The cache of `info`'s adapter on `device` (which must have `PIPELINE_CACHE`), loaded
    /// from its file where that file is whole and made for this adapter and driver. `None`
    /// when the setting is off, the backend has no cache key, or the directory cannot be made.
    pub fn open(
        device: &wgpu::Device,
        info: &wgpu::AdapterInfo,
        setting: &PipelineCacheDir,
    ) -> Option<Self> {
        let dir = directory(setting)?;
        let key = wgpu::util::pipeline_cache_key(info)?;
        // wgpu's key names the device; the driver goes in too, so an update starts afresh.
        let driver = checksum(format!("{} {}", info.driver, info.driver_info).as_bytes());
        let path = dir.join(format!("{key}_{driver:016x}.bin"));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            warn(&path, format!("its directory cannot be made ({e})"));
            return None;
        }
        let loaded = read_whole(&path);
        let data = match &loaded {
            Ok(bytes) => match unwrap_file(bytes) {
                Ok(data) => Some(data),
                Err(why) => {
                    warn(&path, why);
                    None
                }
            },
            Err(None) => None,
            Err(Some(why)) => {
                warn(&path, why);
                None
            }
        };
        let cache = match data {
            Some(data) => Self::with_data(device, data).or_else(|| {
                warn(&path, "it was made by another adapter, driver or wgpu");
                None
            }),
            None => None,
        };
        let saved_len = if cache.is_some() {
            data.map_or(0, <[u8]>::len)
        } else {
            0
        };
        // SAFETY: no data, so nothing for the driver to trust.
        let cache = cache.unwrap_or_else(|| unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("wgpu-mha"),
                data: None,
                fallback: true,
            })
        });
        Some(DiskCache {
            cache,
            path,
            saved_len: Mutex::new(saved_len),
        })
    }

    /// A cache seeded with `data`, or `None` when wgpu refuses it (another adapter, driver or
    /// wgpu version: its own header check).
    fn with_data(device: &wgpu::Device, data: &[u8]) -> Option<wgpu::PipelineCache> {
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        // SAFETY: `data` came from `PipelineCache::get_data` (our header's checksum says the
        // bytes are those written), and wgpu checks it was made for this adapter and driver.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("wgpu-mha"),
                data: Some(data),
                fallback: false,
            })
        };
        #[cfg(not(target_arch = "wasm32"))]
        let refused = pollster::block_on(scope.pop()).is_some();
        // WebGPU has no pipeline cache (no `PIPELINE_CACHE`): the browser never gets here.
        #[cfg(target_arch = "wasm32")]
        let refused = {
            drop(scope);
            true
        };
        (!refused).then_some(cache)
    }

    /// The file this cache is kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the cache's data to its file (a temporary file renamed over it, so a reader
    /// never sees half a file), unless it is unchanged or over [`MAX_FILE_BYTES`]; then trims
    /// the directory to [`MAX_FILES`]. Failures are warnings: the cache only saves time.
    pub fn save(&self) {
        let Some(data) = self.cache.get_data() else {
            return;
        };
        let Ok(mut saved_len) = self.saved_len.lock() else {
            return;
        };
        if data.len() == *saved_len {
            return;
        }
        if (data.len() + HEADER_BYTES) as u64 > MAX_FILE_BYTES {
            // Start over next time rather than grow: drop the file this cache began from.
            let _ = std::fs::remove_file(&self.path);
            *saved_len = data.len();
            return;
        }
        let tmp = self.path.with_extension(format!(
            "tmp{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let written =
            std::fs::write(&tmp, wrap(&data)).and_then(|()| std::fs::rename(&tmp, &self.path));
        match written {
            Ok(()) => *saved_len = data.len(),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                warn(&self.path, format!("cannot be written ({e})"));
            }
        }
        if let Some(dir) = self.path.parent() {
            trim(dir, MAX_FILES);
        }
    }
}

/// The file's bytes; `Err(None)` when there is no file, `Err(Some(why))` when it cannot or
/// should not be read (not a regular file, over the bound).
fn read_whole(path: &Path) -> Result<Vec<u8>, Option<String>> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(None),
        Err(e) => return Err(Some(e.to_string())),
    };
    if !meta.is_file() {
        return Err(Some("not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(Some(format!(
            "{} bytes, over the {MAX_FILE_BYTES}-byte bound",
            meta.len()
        )));
    }
    std::fs::read(path).map_err(|e| Some(e.to_string()))
}

/// Removes the oldest `*.bin` cache files of `dir` beyond `keep`.
fn trim(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "bin")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("wgpu_pipeline_cache_"))
        })
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    if files.len() <= keep {
        return;
    }
    files.sort();
    for (_, path) in &files[..files.len() - keep] {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_file_unwraps_and_any_damage_is_seen() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        let file = wrap(&data);
        assert_eq!(unwrap_file(&file), Ok(&data[..]));
        for at in [0, 9, 17, HEADER_BYTES, file.len() - 1] {
            let mut bad = file.clone();
            bad[at] ^= 0x40;
            assert!(unwrap_file(&bad).is_err(), "a flip at {at} went unseen");
        }
        assert!(unwrap_file(&file[..file.len() - 1]).is_err(), "a torn file");
        assert!(unwrap_file(b"WGPUMHA1").is_err(), "a header alone");
    }

    #[test]
    fn trimming_keeps_the_newest_cache_files_and_nothing_else_goes() {
        let dir = std::env::temp_dir().join(format!("wgpu-mha-trim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
        for i in 0..5u64 {
            let p = dir.join(format!("wgpu_pipeline_cache_vulkan_0_{i}.bin"));
            std::fs::write(&p, b"x").unwrap();
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs(i))
                .unwrap();
        }
        std::fs::write(dir.join("notes.bin"), b"not ours").unwrap();
        trim(&dir, 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "notes.bin",
                "wgpu_pipeline_cache_vulkan_0_3.bin",
                "wgpu_pipeline_cache_vulkan_0_4.bin"
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
