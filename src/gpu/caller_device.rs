//! What wrapping a device the caller made needs ([`super::Gpu::from_device`]): the options, the
//! limits below which no forward can run, and the GL lock `Gpu`s over one device share.

use std::sync::{Arc, Mutex};

use super::{KernelClass, PipelineCacheDir};
use crate::error::{Error, Result};

/// How to wrap a device the caller made ([`super::Gpu::from_device_with`]). There is no adapter to
/// pick: features and limits are the device's own, read from it.
#[derive(Debug, Clone, Default)]
pub struct DeviceOptions {
    /// The kernel shapes to run; `None` = `WGPU_MHA_KERNELS` or the adapter's own class, as
    /// for a device the crate makes.
    pub kernels: Option<KernelClass>,
    /// Where compiled pipelines are kept between processes; used only when the device was
    /// made with `PIPELINE_CACHE` (see `gpu::pipeline_cache`).
    pub pipeline_cache: PipelineCacheDir,
}

/// What one path's passes need of a device, at most over its passes: storage buffers bound
/// by one pass (all compute, so per stage), uniform buffers, workgroup memory in bytes and
/// invocations per workgroup. A unit test counts every pass's binding table against these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathNeeds {
    /// The path's name, as error messages give it (`"fused flash"`).
    pub path: &'static str,
    /// Storage buffers one pass binds (`max_storage_buffers_per_shader_stage`).
    pub storage_buffers: u32,
    /// Uniform buffers one pass binds (`max_uniform_buffers_per_shader_stage`).
    pub uniform_buffers: u32,
    /// Workgroup memory in bytes (`max_compute_workgroup_storage_size`).
    pub workgroup_bytes: u32,
    /// Invocations per workgroup (`max_compute_invocations_per_workgroup`).
    pub invocations: u32,
}

/// Every path's needs (the table in docs/embedding.md, "Use it inside your engine"):
/// * projections and row passes: the GEMM (x, W, bias, y) in 16×16 workgroups of 16×16-vec4
///   tiles (8 KiB), RoPE, norms, cache appends;
/// * fused decode (a few query rows): q, k, v, partials, mask words; up to 16 KiB of tiles;
/// * fused flash: q, k, v, out, carry (with the sinks folded in), mask words; its K/V tile is
///   sized to the device's workgroup memory (at least 8 keys of both head sizes, else the
///   multi-pass path runs), 64 lanes on GPUs;
/// * multi-pass: scores (q, k, scores, mask words), softmax, `P·V`: GEMM tiles.
pub const PATH_NEEDS: [PathNeeds; 4] = [
    PathNeeds {
        path: "projections",
        storage_buffers: 4,
        uniform_buffers: 1,
        workgroup_bytes: 8 * 1024,
        invocations: 256,
    },
    PathNeeds {
        path: "fused decode",
        storage_buffers: 5,
        uniform_buffers: 2,
        workgroup_bytes: 16 * 1024,
        invocations: 64,
    },
    PathNeeds {
        path: "fused flash",
        storage_buffers: 6,
        uniform_buffers: 2,
        workgroup_bytes: 1024,
        invocations: 64,
    },
    PathNeeds {
        path: "multi-pass",
        storage_buffers: 4,
        uniform_buffers: 2,
        workgroup_bytes: 8 * 1024,
        invocations: 256,
    },
];

/// The most of one need over every path, with the path that needs it.
fn most(need: impl Fn(&PathNeeds) -> u32) -> (u32, &'static str) {
    PATH_NEEDS
        .iter()
        .map(|p| (need(p), p.path))
        .max_by_key(|(n, _)| *n)
        .unwrap_or((0, ""))
}

/// The least of each limit the passes need whatever the problem: (name, device's value, least
/// value, the path that needs it). Every path runs on a device that has them all (the module
/// picks a path per problem, and the caller may force any), so a device under one is refused
/// when it is wrapped, by the limit's name, rather than failing in a forward.
pub(super) fn required_limits(l: &wgpu::Limits) -> [(&'static str, u32, u32, &'static str); 7] {
    let (storage, storage_path) = most(|p| p.storage_buffers);
    let (uniform, uniform_path) = most(|p| p.uniform_buffers);
    let (memory, memory_path) = most(|p| p.workgroup_bytes);
    let (invocations, invocations_path) = most(|p| p.invocations);
    [
        (
            "max_storage_buffers_per_shader_stage",
            l.max_storage_buffers_per_shader_stage,
            storage,
            storage_path,
        ),
        (
            "max_uniform_buffers_per_shader_stage",
            l.max_uniform_buffers_per_shader_stage,
            uniform,
            uniform_path,
        ),
        (
            "max_compute_workgroup_storage_size",
            l.max_compute_workgroup_storage_size,
            memory,
            memory_path,
        ),
        (
            "max_compute_invocations_per_workgroup",
            l.max_compute_invocations_per_workgroup,
            invocations,
            invocations_path,
        ),
        (
            "max_compute_workgroup_size_x",
            l.max_compute_workgroup_size_x,
            64,
            "fused flash",
        ),
        (
            "max_compute_workgroup_size_y",
            l.max_compute_workgroup_size_y,
            16,
            "projections",
        ),
        ("max_bind_groups", l.max_bind_groups, 1, "every pass"),
    ]
}

/// `Err(Unsupported)` naming every limit of `limits` below what the passes need.
pub(super) fn check_limits(adapter: &str, limits: &wgpu::Limits) -> Result<()> {
    let short: Vec<String> = required_limits(limits)
        .iter()
        .filter(|(_, got, least, _)| got < least)
        .map(|(name, got, least, path)| {
            format!("{name} is {got}, the passes need {least} (the {path} path)")
        })
        .collect();
    if short.is_empty() {
        return Ok(());
    }
    Err(Error::Unsupported {
        adapter: adapter.to_string(),
        what: format!("device limits too low: {}", short.join("; ")),
    })
}

/// The kernel class `WGPU_MHA_KERNELS` forces when `option` does not.
pub(super) fn forced_class(option: Option<KernelClass>) -> Result<Option<KernelClass>> {
    match (option, std::env::var("WGPU_MHA_KERNELS")) {
        (Some(class), _) => Ok(Some(class)),
        (None, Ok(s)) if !s.trim().is_empty() => KernelClass::parse(&s).map(Some),
        _ => Ok(None),
    }
}

/// The lock that serialises GL calls (see `Gpu::serial`), one per device: `Gpu`s wrapping the
/// same device share it, or two of them on two threads could still wait on wgpu's GL context
/// lock past its deadline. Keyed by the device's hash; a lock outlives no `Gpu` using it, and
/// two devices that happened to share a key would only be serialised together.
pub(super) fn gl_lock(device: &wgpu::Device) -> Arc<parking_lot::ReentrantMutex<()>> {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    use std::sync::Weak;
    type Locks = Vec<(u64, Weak<parking_lot::ReentrantMutex<()>>)>;
    static LOCKS: Mutex<Locks> = Mutex::new(Vec::new());
    let key = BuildHasherDefault::<DefaultHasher>::default().hash_one(device);
    let Ok(mut locks) = LOCKS.lock() else {
        // A poisoned registry only loses the sharing, never the serialisation.
        return Arc::new(parking_lot::ReentrantMutex::new(()));
    };
    locks.retain(|(_, lock)| lock.strong_count() > 0);
    if let Some(lock) = locks
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, lock)| lock.upgrade())
    {
        return lock;
    }
    let lock = Arc::new(parking_lot::ReentrantMutex::new(()));
    locks.push((key, Arc::downgrade(&lock)));
    lock
}

/// Records a device loss in `slot` (what the crate's callback, or a caller forwarding to
/// [`Gpu::device_lost_handler`], does).
pub(super) fn record_loss(
    slot: &Mutex<Option<String>>,
    reason: wgpu::DeviceLostReason,
    message: &str,
) {
    if let Ok(mut slot) = slot.lock() {
        *slot = Some(format!("{reason:?}: {message}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_below_what_the_passes_need_are_each_named() {
        assert!(check_limits("a", &wgpu::Limits::default()).is_ok());
        // Exactly what docs/embedding.md states is enough.
        let exact = wgpu::Limits {
            max_storage_buffers_per_shader_stage: 6,
            max_uniform_buffers_per_shader_stage: 2,
            max_compute_workgroup_storage_size: 16 * 1024,
            ..Default::default()
        };
        assert!(check_limits("a", &exact).is_ok());
        // wgpu's downlevel defaults allow 4 storage buffers per stage; the flash pass binds 6.
        let mut low = wgpu::Limits::downlevel_defaults();
        low.max_compute_invocations_per_workgroup = 128;
        let err = check_limits("a", &low).unwrap_err().to_string();
        assert!(
            err.contains(
                "max_storage_buffers_per_shader_stage is 4, the passes need 6 (the fused flash path)"
            ) && err.contains("max_compute_invocations_per_workgroup is 128")
                && err.contains("max_compute_workgroup_storage_size is 16352"),
            "{err}"
        );
    }

    /// Every pass's binding table within what its path states (and so within what a wrapped
    /// device is checked for): a pass that grew a binding fails here, not on a caller's device.
    #[test]
    fn every_pass_binds_no_more_storage_buffers_than_its_path_states() {
        use crate::gpu::pass::{Pass, Slot};
        use crate::kernels::{decode, flash_attention, linear, scores};
        let need = |path: &str| {
            PATH_NEEDS
                .iter()
                .find(|p| p.path == path)
                .map(|p| p.storage_buffers as usize)
                .unwrap()
        };
        let uniforms = |slots: &[Slot]| {
            slots
                .iter()
                .filter(|s| matches!(s, Slot::Uniform(_)))
                .count()
        };
        for (path, slots) in [
            ("fused flash", flash_attention::SLOTS),
            ("fused decode", decode::SLOTS),
            ("fused decode", decode::REDUCE_SLOTS),
            ("multi-pass", scores::SLOTS),
            ("projections", linear::SLOTS),
        ] {
            assert!(
                Pass::storage_buffers(slots) <= need(path),
                "{path}: {slots:?}"
            );
            assert!(uniforms(slots) <= 2, "{path}: {slots:?}");
        }
        // The flash pass binds exactly the most any path states.
        assert_eq!(Pass::storage_buffers(flash_attention::SLOTS), 6);
        assert_eq!(most(|p| p.storage_buffers), (6, "fused flash"));
    }
}
