//! The GPU context: adapter, device and queue, and the two things every pass needs from them:
//! errors turned into `Err` (never wgpu's default panic) and blocking readback.

pub mod buffers;
mod caller_device;
mod compile;
#[cfg(target_arch = "wasm32")]
pub(crate) mod deferred;
// Compiled passes and their dispatches: the kernels' machinery, public for them and the tests.
#[doc(hidden)]
pub mod pass;
pub mod pipeline_cache;
pub mod record;
pub mod timer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::gpu::pass::Pass;
use crate::gpu::pipeline_cache::DiskCache;
pub use crate::gpu::pipeline_cache::PipelineCacheDir;
use caller_device::{check_limits, forced_class, gl_lock, record_loss};
pub use caller_device::{DeviceOptions, PathNeeds, PATH_NEEDS};

use crate::error::{Error, Result};

/// Optional features the engine uses when the adapter has them.
const WANTED_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::TIMESTAMP_QUERY)
    .union(wgpu::Features::PIPELINE_CACHE);

/// Which family of kernel shapes (workgroup sizes, rows per thread, variants) the passes
/// pick. Each adapter gets its own class's; any class runs on any adapter, so that every
/// shape a GPU would pick is also tested on lavapipe (`WGPU_MHA_KERNELS=gpu`). Only tuning
/// follows the class: limits that make results exact on a software rasteriser (its loop
/// cap) follow the adapter itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelClass {
    /// Software rasterisers (lavapipe, llvmpipe): a workgroup of 8 is one SIMD vector.
    Cpu,
    /// Real GPUs: 64 or more threads per workgroup.
    Gpu,
}

impl KernelClass {
    /// `cpu` or `gpu` (any case).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(KernelClass::Cpu),
            "gpu" => Ok(KernelClass::Gpu),
            other => Err(Error::Misuse(format!(
                "unknown kernel class `{other}` (WGPU_MHA_KERNELS): use cpu or gpu"
            ))),
        }
    }

    /// The class an adapter gets by default.
    pub fn of(info: &wgpu::AdapterInfo) -> Self {
        match info.device_type {
            wgpu::DeviceType::Cpu => KernelClass::Cpu,
            _ => KernelClass::Gpu,
        }
    }
}

/// How to pick an adapter. `Default` honours `WGPU_BACKEND`, `WGPU_ADAPTER_NAME` and
/// `WGPU_MHA_KERNELS`.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// `vulkan`, `metal`, `dx12`, `gl` (comma-separated list allowed); `None` = env or all.
    pub backend: Option<String>,
    /// Case-insensitive substring of the adapter name; `None` = env or the first found.
    pub adapter_name: Option<String>,
    /// The kernel shapes to run; `None` = `WGPU_MHA_KERNELS` or the adapter's own class.
    pub kernels: Option<KernelClass>,
    /// Where compiled pipelines are kept between processes (adapters with
    /// `PIPELINE_CACHE`, i.e. Vulkan); see [`pipeline_cache`].
    pub pipeline_cache: PipelineCacheDir,
}

/// Counts of live GPU objects (see [`Gpu::live_objects`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveObjects {
    /// Live buffers.
    pub buffers: isize,
    /// Live bind groups.
    pub bind_groups: isize,
    /// Bytes of buffer memory allocated.
    pub buffer_bytes: isize,
}

/// One line of `wgpu-mha info`.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    /// The adapter's name, backend, device type and driver.
    pub info: wgpu::AdapterInfo,
    /// Every feature the adapter offers (not only those the crate uses).
    pub features: wgpu::Features,
    /// The adapter's own limits.
    pub limits: wgpu::Limits,
}

/// Adapter + device + queue. Cheap to clone (wgpu handles are reference counted).
///
/// Made by the crate ([`Gpu::new`], [`Gpu::with_options`]) or around a caller's own device
/// ([`Gpu::from_device`]). Either way the kernels follow the device's features and limits.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    features: wgpu::Features,
    limits: wgpu::Limits,
    kernel_class: KernelClass,
    /// Set by the device-lost callback (the crate's on a device it made; on a caller's device,
    /// the caller's forwarding to [`Gpu::device_lost_handler`]); every later call then fails
    /// fast with `DeviceLost`.
    lost: Arc<Mutex<Option<String>>>,
    /// Errors that escaped an error scope (e.g. raised on another thread's resources). Only
    /// filled on a device the crate made: a caller's device keeps the caller's handler.
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// On GL, one thread at a time talks to the device (one lock per device, see `gl_lock`).
    /// wgpu's GL backend holds one context lock per call and *panics* when a thread waits for
    /// it more than a few seconds, which a long dispatch on a software GL triggers; waiting on
    /// our lock instead has no deadline. Reentrant, because a forward's readback runs inside
    /// its error scope.
    serial: Option<Arc<parking_lot::ReentrantMutex<()>>>,
    /// Compiled passes by name, shared by every module on this `Gpu` (another `Gpu` over the
    /// same device keeps its own): a pass depends only on its source (and the flash pass on
    /// its head sizes), so a second module compiles nothing.
    passes: Arc<Mutex<HashMap<String, Arc<Pass>>>>,
    /// While [`Gpu::passes_used_by`] runs: every pass `compile` hands out (see `compile`).
    used: Arc<Mutex<Option<Vec<Arc<Pass>>>>>,
    /// Pipelines kept on disk between processes, where the adapter can.
    disk_cache: Option<Arc<DiskCache>>,
    /// In the browser, the error scopes the next read awaits (see `deferred`).
    #[cfg(target_arch = "wasm32")]
    deferred: deferred::DeferredScopes,
}

fn instance(backend: Option<&str>) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if let Some(b) = backend {
        desc.backends = wgpu::Backends::from_comma_list(b);
    }
    wgpu::Instance::new(desc)
}

/// Every adapter wgpu finds under the given (or env) backend selection.
#[cfg(not(target_arch = "wasm32"))]
pub fn list_adapters(backend: Option<&str>) -> Vec<AdapterSummary> {
    let instance = instance(backend);
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .into_iter()
        .map(|a| AdapterSummary {
            info: a.get_info(),
            features: a.features(),
            limits: a.limits(),
        })
        .collect()
}

impl Gpu {
    /// The default adapter (honours `WGPU_BACKEND` and `WGPU_ADAPTER_NAME`). Native only: in
    /// the browser, where nothing may block, use [`new_async`](Self::new_async).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Self> {
        Self::with_options(&GpuOptions::default())
    }

    /// The adapter `options` pick (see [`GpuOptions`]), blocking until the device is made.
    /// `Err(NoAdapter)` when none matches, `Err(Misuse)` for an unknown backend or kernel
    /// class, `Err(RequestDevice)` when the adapter refuses the device, `Err(Unsupported)`
    /// when its limits are too low for any forward.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_options(options: &GpuOptions) -> Result<Self> {
        pollster::block_on(Self::new_async(options))
    }

    /// [`with_options`](Self::with_options) without blocking. With no name asked for, a
    /// discrete GPU is preferred, then integrated, virtual, other and software ones.
    pub async fn new_async(options: &GpuOptions) -> Result<Self> {
        let backend = options
            .backend
            .clone()
            .or_else(|| std::env::var("WGPU_BACKEND").ok());
        let wanted_name = options
            .adapter_name
            .clone()
            .or_else(|| std::env::var("WGPU_ADAPTER_NAME").ok())
            .map(|n| n.to_lowercase());
        if let Some(b) = &backend {
            if wgpu::Backends::from_comma_list(b).is_empty() {
                return Err(Error::Misuse(format!(
                    "unknown backend `{b}`: use vulkan, metal, dx12 or gl (comma-separated for several)"
                )));
            }
        }
        // Parsed before any device is made, so a bad value costs nothing.
        forced_class(options.kernels)?;
        let instance = instance(backend.as_deref());
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        let chosen = match &wanted_name {
            Some(name) => adapters
                .into_iter()
                .find(|a| a.get_info().name.to_lowercase().contains(name.as_str())),
            // Prefer real GPUs over software ones, then whatever comes first.
            None => {
                let mut all = adapters;
                all.sort_by_key(|a| match a.get_info().device_type {
                    wgpu::DeviceType::DiscreteGpu => 0,
                    wgpu::DeviceType::IntegratedGpu => 1,
                    wgpu::DeviceType::VirtualGpu => 2,
                    wgpu::DeviceType::Other => 3,
                    wgpu::DeviceType::Cpu => 4,
                });
                all.into_iter().next()
            }
        };
        let Some(adapter) = chosen else {
            let mut detail = String::new();
            if let Some(b) = &backend {
                detail += &format!(" for backend `{b}`");
            }
            if let Some(n) = &wanted_name {
                detail += &format!(" named like `{n}` (found: {names:?})");
            }
            return Err(Error::NoAdapter { detail });
        };
        let info = adapter.get_info();
        let features = adapter.features() & WANTED_FEATURES;
        // The adapter's own limits: the defaults cap workgroup memory at 16 KiB and storage
        // bindings at 128 MiB, lower than many GPUs offer.
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("wgpu-mha"),
                required_features: features,
                required_limits: limits,
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::RequestDevice {
                adapter: info.name.clone(),
                message: e.to_string(),
            })?;
        // Nobody else holds this device: the crate's callbacks replace wgpu's defaults.
        Self::assemble(
            device,
            queue,
            options.kernels,
            &options.pipeline_cache,
            true,
        )
    }

    /// Wraps a device and queue the caller made, with default [`DeviceOptions`]; see
    /// [`from_device_with`](Self::from_device_with).
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Result<Self> {
        Self::from_device_with(device, queue, &DeviceOptions::default())
    }

    /// Wraps a device and queue the caller made (an engine's own), for modules to run on.
    ///
    /// Features and limits are read from the device, and kernels are chosen from them exactly
    /// as for a device the crate makes: the kernel class from the adapter's type, subgroup
    /// kernels only with `SUBGROUP`, tiles from its workgroup memory, splits from its binding
    /// size. A missing feature is an error only when something that needs it is asked for
    /// (an f16 module without `SHADER_F16` is `Err(Unsupported)` naming it); without
    /// `TIMESTAMP_QUERY` there are no per-pass timings, without `PIPELINE_CACHE` no cache on
    /// disk. `Err(Unsupported)` when a limit every forward needs is too low (named).
    ///
    /// The device stays the caller's: its device-lost callback and uncaptured-error handler
    /// are left as they are (wgpu keeps one of each, so installing ours would silently drop
    /// the caller's). The crate's own work is still checked through error scopes, so its
    /// errors come back as `Err`; to have calls fail fast with `Error::DeviceLost` once the
    /// device is lost, forward the loss from the caller's callback to
    /// [`device_lost_handler`](Self::device_lost_handler). Several `Gpu`s may wrap one
    /// device: each compiles and caches its own pipelines.
    ///
    /// Calls that wait (every `forward`, readback) wait for the whole queue, the caller's
    /// work in flight included.
    pub fn from_device_with(
        device: wgpu::Device,
        queue: wgpu::Queue,
        options: &DeviceOptions,
    ) -> Result<Self> {
        Self::assemble(
            device,
            queue,
            options.kernels,
            &options.pipeline_cache,
            false,
        )
    }

    /// A `Gpu` over `device`, whoever made it: everything it knows of the device is read from
    /// the device itself. `own_callbacks` installs the crate's device-lost and
    /// uncaptured-error callbacks (only on a device the crate made).
    fn assemble(
        device: wgpu::Device,
        queue: wgpu::Queue,
        kernels: Option<KernelClass>,
        pipeline_cache: &PipelineCacheDir,
        own_callbacks: bool,
    ) -> Result<Self> {
        let info = device.adapter_info();
        let features = device.features();
        let limits = device.limits();
        check_limits(&info.name, &limits)?;
        let kernel_class = forced_class(kernels)?.unwrap_or_else(|| KernelClass::of(&info));
        let serial = (info.backend == wgpu::Backend::Gl).then(|| gl_lock(&device));
        let mut gpu = Gpu {
            device,
            queue,
            kernel_class,
            info,
            features,
            limits,
            lost: Arc::new(Mutex::new(None)),
            uncaptured: Arc::new(Mutex::new(Vec::new())),
            serial,
            passes: Arc::new(Mutex::new(HashMap::new())),
            used: Arc::new(Mutex::new(None)),
            disk_cache: None,
            #[cfg(target_arch = "wasm32")]
            deferred: Default::default(),
        };
        if own_callbacks {
            gpu.install_callbacks();
        }
        // A cache made on this device, used only by this `Gpu` (and so only on this device).
        gpu.disk_cache = features
            .contains(wgpu::Features::PIPELINE_CACHE)
            .then(|| DiskCache::open(&gpu.device, &gpu.info, pipeline_cache))
            .flatten()
            .map(Arc::new);
        Ok(gpu)
    }

    /// On a device the crate made (nobody else's to clobber): records its loss, and replaces
    /// wgpu's default uncaptured-error handler (which panics) with one that records the
    /// error; the next `scoped` call on any thread reports it.
    fn install_callbacks(&self) {
        self.device
            .set_device_lost_callback(self.device_lost_handler());
        let sink = self.uncaptured.clone();
        self.device
            .on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                if let Ok(mut v) = sink.lock() {
                    v.push(e.to_string());
                }
            }));
    }

    /// A device-lost callback for a device the caller made and wrapped
    /// ([`from_device`](Self::from_device)): once it has run, every call on this `Gpu` and
    /// its clones fails fast with `Error::DeviceLost`. Call it from the device's own callback,
    /// or install it as that callback:
    ///
    /// ```no_run
    /// # fn f(device: wgpu::Device, queue: wgpu::Queue) -> wgpu_mha::Result<()> {
    /// let gpu = wgpu_mha::Gpu::from_device(device.clone(), queue)?;
    /// let tell_gpu = gpu.device_lost_handler();
    /// device.set_device_lost_callback(move |reason, message| {
    ///     eprintln!("device lost: {message}"); // the engine's own handling
    ///     tell_gpu(reason, message);
    /// });
    /// # Ok(()) }
    /// ```
    ///
    /// It holds only the `Gpu`'s loss flag, not the device, so installing it makes no
    /// reference cycle.
    pub fn device_lost_handler(&self) -> impl Fn(wgpu::DeviceLostReason, String) + Send + 'static {
        let lost = self.lost.clone();
        move |reason, message| record_loss(&lost, reason, &message)
    }

    /// The wgpu device the passes run on.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }
    /// The device's queue, which every pass is submitted to.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }
    /// The adapter's name, backend and device type.
    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }
    /// The device's features (what it was made with; never more).
    pub fn features(&self) -> wgpu::Features {
        self.features
    }
    /// The device's limits (what it was made with).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }
    /// The kernel shapes this device runs (see [`KernelClass`]).
    pub fn kernel_class(&self) -> KernelClass {
        self.kernel_class
    }
    /// Whether the device has `SHADER_F16` (f16 modules and caches need it).
    pub fn has_f16(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F16)
    }
    /// Whether the device has `SUBGROUP` (the subgroup kernels need it).
    pub fn has_subgroups(&self) -> bool {
        self.features.contains(wgpu::Features::SUBGROUP)
    }
    /// Whether the device has `TIMESTAMP_QUERY` (per-pass timings need it).
    pub fn has_timestamps(&self) -> bool {
        self.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Live wgpu objects of this device (wgpu's internal counters), for leak checks.
    pub fn live_objects(&self) -> LiveObjects {
        let c = self.device.get_internal_counters();
        LiveObjects {
            buffers: c.hal.buffers.read(),
            bind_groups: c.hal.bind_groups.read(),
            buffer_bytes: c.hal.buffer_memory.read(),
        }
    }

    /// `"<name> (<backend>)"`, for reports, with the kernel class when it is forced.
    pub fn describe(&self) -> String {
        let forced = if self.kernel_class == KernelClass::of(&self.info) {
            String::new()
        } else {
            format!(", {:?} kernels forced", self.kernel_class).to_lowercase()
        };
        format!("{} ({:?}{forced})", self.info.name, self.info.backend)
    }

    /// Fails fast once the device is lost.
    pub(crate) fn check_alive(&self) -> Result<()> {
        match self.lost.lock().ok().and_then(|l| l.clone()) {
            Some(reason) => Err(Error::DeviceLost(reason)),
            None => Ok(()),
        }
    }

    /// Runs `f` inside validation and out-of-memory error scopes and turns anything wgpu
    /// reports into `Err` naming `stage`. In the browser the scopes' answers come later: they
    /// are kept, and the next [`GpuTensor::read_async`](crate::GpuTensor::read_async) returns
    /// the first error among them.
    pub(crate) fn scoped<T>(&self, stage: &str, f: impl FnOnce() -> T) -> Result<T> {
        let _serial = self.serialize();
        self.check_alive()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        self.answer_scopes(stage, validation, oom)?;
        let escaped: Vec<String> = self
            .uncaptured
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        if !escaped.is_empty() {
            return Err(Error::Gpu {
                stage: stage.to_string(),
                message: escaped.join("; "),
            });
        }
        self.check_alive()?;
        Ok(value)
    }

    /// The answers of `scoped`'s two scopes (popped innermost first): natively, waited for
    /// here; in the browser, kept for the next read to await (see `deferred`).
    fn answer_scopes(
        &self,
        stage: &str,
        validation: wgpu::ErrorScopeGuard,
        oom: wgpu::ErrorScopeGuard,
    ) -> Result<()> {
        #[cfg(target_arch = "wasm32")]
        {
            let validation = Box::pin(validation.pop());
            self.deferred.push(stage, validation, Box::pin(oom.pop()));
            Ok(())
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let validation = pollster::block_on(validation.pop());
            let oom = pollster::block_on(oom.pop());
            match validation.or(oom) {
                Some(e) => Err(Error::Gpu {
                    stage: stage.to_string(),
                    message: e.to_string(),
                }),
                None => Ok(()),
            }
        }
    }

    /// The error scopes kept since the last read, as one future (the browser's error path).
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn deferred_scopes(&self) -> deferred::ScopeResults {
        self.deferred.take()
    }

    /// Holds the device for this thread where the backend needs it (GL; see `serial`).
    pub(crate) fn serialize(&self) -> Option<parking_lot::ReentrantMutexGuard<'_, ()>> {
        self.serial.as_ref().map(|m| m.lock())
    }

    /// A new command encoder.
    pub(crate) fn encoder(&self, label: &str) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }

    /// Waits until the queue is idle.
    pub(crate) fn wait(&self) -> Result<()> {
        let _serial = self.serialize();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu {
                stage: "poll".into(),
                message: e.to_string(),
            })?;
        self.check_alive()
    }

    /// Maps the first `bytes` of `staging` (a `MAP_READ` buffer), copies them out, unmaps.
    pub(crate) fn read_bytes(&self, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        // A blocking read would wait forever in a browser (the map's answer needs the event loop
        // this call holds): the blocking API is refused there, by name, before anything is read.
        if cfg!(target_arch = "wasm32") {
            return Err(Error::Unsupported {
                adapter: self.info.name.clone(),
                what: "a blocking readback in the browser: record on device tensors and read them with `GpuTensor::read_async`".into(),
            });
        }
        let slice = staging.slice(0..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        let readback_error = |message: String| Error::Gpu {
            stage: "readback".into(),
            message,
        };
        rx.recv()
            .map_err(|_| readback_error("map callback never ran".into()))?
            .map_err(|e| readback_error(e.to_string()))?;
        let out = slice
            .get_mapped_range()
            .map_err(|e| readback_error(e.to_string()))?
            .to_vec();
        staging.unmap();
        Ok(out)
    }

    /// `read_bytes` as f32 values.
    pub(crate) fn read_f32(&self, staging: &wgpu::Buffer, len: usize) -> Result<Vec<f32>> {
        let bytes = self.read_bytes(staging, (len * 4) as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
