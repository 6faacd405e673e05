//! Compiling passes: the device's cache of compiled passes (bounded, shared by every module),
//! the directives a browser's WGSL compiler needs, and the pipeline log CI counts.

use std::collections::HashMap;
use std::sync::Arc;

use super::pass::{Pass, PassSpec};
use super::pipeline_cache::DiskCache;
use super::Gpu;

/// Compiled passes the cache keeps beyond those in use: a pass no module or workspace holds any
/// more (say, the flash pass of a dropped module's head sizes) is dropped once there are more
/// than this many, so building and dropping modules of ever new shapes cannot grow memory
/// without bound.
const MAX_IDLE_PASSES: usize = 32;

/// Drops entries nothing but the cache holds while the map has more than `keep` entries.
fn evict_unused<V>(map: &mut HashMap<String, Arc<V>>, keep: usize) {
    if map.len() <= keep {
        return;
    }
    let mut idle: Vec<String> = map
        .iter()
        .filter(|(_, v)| Arc::strong_count(v) == 1)
        .map(|(k, _)| k.clone())
        .collect();
    idle.sort_unstable();
    for key in idle.into_iter().take(map.len() - keep) {
        map.remove(&key);
    }
}

impl Gpu {
    /// The compiled pass `key`, built from `spec` and `source()` the first time on this device
    /// and shared by every module after that.
    pub(crate) fn compile(
        &self,
        key: &str,
        spec: &PassSpec,
        source: impl FnOnce() -> String,
    ) -> Arc<Pass> {
        if let Some(pass) = self.passes.lock().ok().and_then(|m| m.get(key).cloned()) {
            self.note_used(&pass);
            return pass;
        }
        // No clock in a browser's wasm (`Instant::now` panics there); the log is native only.
        #[cfg(not(target_arch = "wasm32"))]
        let started = std::time::Instant::now();
        let disk = self.disk_cache.as_deref();
        let pass = Arc::new(Pass::build(
            &self.device,
            spec,
            &self.directives(source()),
            disk.map(|d| &d.cache),
        ));
        #[cfg(not(target_arch = "wasm32"))]
        self.log_compiled(key, started.elapsed());
        if let Some(disk) = disk {
            disk.save();
        }
        if let Ok(mut m) = self.passes.lock() {
            m.entry(key.to_string()).or_insert_with(|| pass.clone());
            evict_unused(&mut m, MAX_IDLE_PASSES);
        }
        self.note_used(&pass);
        pass
    }

    /// Runs `f` and returns, with its value, every pass compiled or taken from the cache while
    /// it ran (on any thread of this `Gpu`), each once: what a warm-up must hold so that the
    /// cache keeps exactly those (see [`crate::serve::WarmPasses`]). Calls nest: an outer
    /// call's list gets an inner one's passes too.
    pub(crate) fn passes_used_by<T>(&self, f: impl FnOnce() -> T) -> (T, Vec<Arc<Pass>>) {
        let outer = self
            .used
            .lock()
            .ok()
            .and_then(|mut u| u.replace(Vec::new()));
        let value = f();
        let ours = self
            .used
            .lock()
            .ok()
            .and_then(|mut u| std::mem::replace(&mut *u, outer))
            .unwrap_or_default();
        for pass in &ours {
            self.note_used(pass);
        }
        (value, ours)
    }

    fn note_used(&self, pass: &Arc<Pass>) {
        if let Ok(mut used) = self.used.lock() {
            if let Some(list) = used.as_mut() {
                if !list.iter().any(|p| Arc::ptr_eq(p, pass)) {
                    list.push(pass.clone());
                }
            }
        }
    }

    /// `source` with the directives this device's WGSL compiler needs. A browser's (Tint) wants
    /// `enable subgroups;` before any subgroup builtin, as the WGSL spec says; naga (every
    /// other backend, wgpu 30) does not implement that directive and refuses it, so the
    /// sources leave it out and it is added here, for the browser only. With it goes
    /// `diagnostic(off, subgroup_uniformity)`: the subgroup kernels branch on `subgroupAll(…)`,
    /// the same on every lane of a subgroup, which the spec's analysis cannot prove.
    #[doc(hidden)]
    pub fn directives(&self, source: String) -> String {
        let browser = self.info.backend == wgpu::Backend::BrowserWebGpu;
        if browser && self.has_subgroups() && source.contains("subgroup") {
            format!("enable subgroups;\ndiagnostic(off, subgroup_uniformity);\n{source}")
        } else {
            source
        }
    }

    /// Appends `"<backend>\t<kernel class>\t<key>\t<ms to build>"` to the file `WGPU_MHA_PIPELINE_LOG` names,
    /// if set: one line per pipeline a process compiles, so a whole test pass (many processes)
    /// can count its distinct pipelines with `sort -u` (`.ci/run` does). Best effort: a log
    /// that cannot be written is skipped, never an error of the forward that compiled.
    #[cfg(not(target_arch = "wasm32"))]
    fn log_compiled(&self, key: &str, took: std::time::Duration) {
        let Some(path) = std::env::var_os("WGPU_MHA_PIPELINE_LOG") else {
            return;
        };
        use std::io::Write;
        let line = format!(
            "{:?}\t{:?}\t{}\t{}\n",
            self.info.backend,
            self.kernel_class,
            key,
            took.as_millis()
        );
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write of one short line: appends from several processes do not interleave.
            let _ = file.write_all(line.as_bytes());
        }
    }

    /// The file compiled pipelines are kept in between processes, if any (see
    /// [`pipeline_cache`](super::pipeline_cache)).
    pub fn pipeline_cache_file(&self) -> Option<&std::path::Path> {
        self.disk_cache.as_deref().map(DiskCache::path)
    }

    /// Compiled passes cached on this device (in use or idle).
    pub fn cached_passes(&self) -> usize {
        self.passes.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::pass;

    #[test]
    fn only_idle_passes_are_evicted_and_only_past_the_bound() {
        let mut map: HashMap<String, Arc<u32>> = HashMap::new();
        let held: Vec<Arc<u32>> = (0..4).map(Arc::new).collect();
        for (i, v) in held.iter().enumerate() {
            map.insert(format!("held {i}"), v.clone());
        }
        for i in 0..3 {
            map.insert(format!("idle {i}"), Arc::new(i));
        }
        evict_unused(&mut map, 7);
        assert_eq!(map.len(), 7, "at the bound nothing goes");
        map.insert("idle 3".into(), Arc::new(3));
        evict_unused(&mut map, 7);
        assert_eq!(map.len(), 7);
        evict_unused(&mut map, 2);
        // Every idle entry went, every held one stayed, even past the bound.
        assert_eq!(map.len(), 4);
        assert!((0..4).all(|i| map.contains_key(&format!("held {i}"))));
    }

    /// Compiling and dropping passes of ever new shapes (as modules of new head sizes do)
    /// keeps the cache bounded, while a pass still held survives.
    #[test]
    fn compiling_ever_new_passes_keeps_the_cache_bounded() {
        let gpu = Gpu::new().expect("an adapter");
        let slots = [pass::Slot::Write(1)];
        let spec = PassSpec::main("cache probe", &slots);
        let source = |n: usize| {
            format!(
                "@group(0) @binding(1) var<storage, read_write> y: array<u32>;\n\
                 @compute @workgroup_size(1) fn main() {{ y[0] = {n}u; }}"
            )
        };
        let held = gpu.compile("cache probe held", &spec, || source(0));
        for n in 1..=3 * MAX_IDLE_PASSES {
            drop(gpu.compile(&format!("cache probe {n}"), &spec, || source(n)));
        }
        assert_eq!(gpu.cached_passes(), MAX_IDLE_PASSES);
        let again = gpu.compile("cache probe held", &spec, || unreachable!("still cached"));
        assert!(Arc::ptr_eq(&held, &again));
    }
}
