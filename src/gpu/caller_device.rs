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
    /// made with `PIPELINE_CACHE` (see [`pipeline_cache`]).
    pub pipeline_cache: PipelineCacheDir,
}

/// The least of each limit the passes need whatever the problem: (name, least value). Below
/// one of them no forward can run (the fused pass binds 6 storage buffers, the GEMMs run
/// 16×16 workgroups, the fused and decode passes 64 lanes), so a device under it is refused
/// when it is wrapped, by the limit's name, rather than failing in every forward.
pub(super) fn required_limits(l: &wgpu::Limits) -> [(&'static str, u32, u32); 6] {
    [
        (
            "max_storage_buffers_per_shader_stage",
            l.max_storage_buffers_per_shader_stage,
            6,
        ),
        (
            "max_uniform_buffers_per_shader_stage",
            l.max_uniform_buffers_per_shader_stage,
            2,
        ),
        (
            "max_compute_invocations_per_workgroup",
            l.max_compute_invocations_per_workgroup,
            256,
        ),
        (
            "max_compute_workgroup_size_x",
            l.max_compute_workgroup_size_x,
            64,
        ),
        (
            "max_compute_workgroup_size_y",
            l.max_compute_workgroup_size_y,
            16,
        ),
        ("max_bind_groups", l.max_bind_groups, 1),
    ]
}

/// `Err(Unsupported)` naming every limit of `limits` below what the passes need.
pub(super) fn check_limits(adapter: &str, limits: &wgpu::Limits) -> Result<()> {
    let short: Vec<String> = required_limits(limits)
        .iter()
        .filter(|(_, got, least)| got < least)
        .map(|(name, got, least)| format!("{name} is {got}, the passes need {least}"))
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
        // wgpu's downlevel defaults allow 4 storage buffers per stage; the fused pass binds 6.
        let mut low = wgpu::Limits::downlevel_defaults();
        low.max_compute_invocations_per_workgroup = 128;
        let err = check_limits("a", &low).unwrap_err().to_string();
        assert!(
            err.contains("max_storage_buffers_per_shader_stage is 4, the passes need 6")
                && err.contains("max_compute_invocations_per_workgroup is 128"),
            "{err}"
        );
    }
}
