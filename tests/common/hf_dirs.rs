//! Model directories and safetensors files written from seeded tensors, for the loader's tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use wgpu_mha::io::safetensors::write_safetensors;
use wgpu_mha::Tensor;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("wgpu-mha-hf-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// Seeded tensors of the given shapes, under the given names.
pub fn tensors(specs: &[(&str, &[usize])]) -> Vec<(String, Tensor)> {
    specs
        .iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            (
                name.to_string(),
                Tensor::random(shape.to_vec(), i as u64 + 1),
            )
        })
        .collect()
}

/// Writes a model directory: `config.json` and the tensors in one file, or over two shards
/// with an index.
pub fn model_dir(tag: &str, config: &str, tensors: &[(String, Tensor)], sharded: bool) -> TempDir {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    if !sharded {
        write_safetensors(dir.path().join("model.safetensors"), &refs, None).unwrap();
        return dir;
    }
    let (a, b) = refs.split_at(refs.len() / 2);
    let mut map = HashMap::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        write_safetensors(dir.path().join(file), part, None).unwrap();
        for (name, _) in part {
            map.insert(name.to_string(), file.to_string());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    dir
}
