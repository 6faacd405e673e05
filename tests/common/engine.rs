//! A device an engine makes itself (`Gpu::from_device`), with the caller's side of recording:
//! its own copies, its buffers, its validation scope, and one small sdpa problem placed in
//! its buffers with an f64 reference (`tests/contract.rs`).

use std::sync::{Arc, Mutex, OnceLock};

use wgpu::util::DeviceExt;
use wgpu_mha::{DeviceTensor, Layout, SdpaOptions, Tensor};

use super::{assert_within, relative_tolerance, run_sdpa_core};

pub const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// A device the test made, wrapped, and every uncaptured wgpu error on it (recorded, not a
/// panic, so that a test can say which call caused it).
pub struct Engine {
    pub gpu: wgpu_mha::Gpu,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub uncaptured: Arc<Mutex<Vec<String>>>,
}

/// One adapter (so one instance) for every device of the file, as in an engine: a buffer of
/// one device is then *another device's* to the other, which wgpu checks.
pub fn adapter() -> &'static wgpu::Adapter {
    static A: OnceLock<wgpu::Adapter> = OnceLock::new();
    A.get_or_init(|| {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
            &instance, None,
        ))
        .unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"))
    })
}

pub fn engine(label: &str, limits: wgpu::Limits) -> Engine {
    let adapter = adapter();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some(label),
        required_features: adapter.features() & wgpu::Features::SHADER_F16,
        required_limits: limits,
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("{label}: {e}"));
    let uncaptured = Arc::new(Mutex::new(Vec::new()));
    let sink = uncaptured.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        sink.lock().unwrap().push(e.to_string());
    }));
    let gpu = wgpu_mha::Gpu::from_device(device.clone(), queue.clone())
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    Engine {
        gpu,
        device,
        queue,
        uncaptured,
    }
}

/// wgpu's defaults (where the adapter offers less, its own value: GL's llvmpipe).
pub fn default_engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let limits = wgpu::Limits::default().or_worse_values_from(&adapter().limits());
        engine("wgpu::Limits::default()", limits)
    })
}

/// docs/embedding.md's numbers exactly ("Use it inside your engine"), and one storage binding of
/// 1 MiB so that an arena larger than a binding is cheap.
pub fn stated_engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let mut limits = wgpu::Limits::default().or_worse_values_from(&adapter().limits());
        limits.max_storage_buffers_per_shader_stage = 6;
        limits.max_uniform_buffers_per_shader_stage = 2;
        limits.max_compute_workgroup_storage_size = 16 * 1024;
        limits.max_compute_invocations_per_workgroup = 256;
        limits.max_storage_buffer_binding_size = BINDING_LIMIT;
        engine("docs/embedding.md's limits", limits)
    })
}

pub const BINDING_LIMIT: u64 = 1 << 20;

impl Engine {
    pub fn buffer(&self, data: &[f32]) -> wgpu::Buffer {
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("caller data"),
                contents: bytemuck::cast_slice(data),
                usage: USAGE,
            })
    }

    pub fn zeros(&self, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("caller buffer"),
            size: bytes,
            usage: USAGE,
            mapped_at_creation: false,
        })
    }

    pub fn read(&self, buffer: &wgpu::Buffer, at: u64, len: usize) -> Vec<f32> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 4 * len as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(buffer, at, &staging, 0, 4 * len as u64);
        self.queue.submit([encoder.finish()]);
        staging.slice(..).map_async(wgpu::MapMode::Read, |r| {
            r.expect("map");
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("poll");
        let view = staging.slice(..).get_mapped_range().expect("mapped");
        bytemuck::cast_slice(&view).to_vec()
    }

    /// Finishes and submits `encoder` inside a validation scope: `Err` with wgpu's message if
    /// anything in it (the crate's commands or the caller's) failed validation.
    pub fn submit(&self, encoder: wgpu::CommandEncoder) -> Result<(), String> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        self.queue.submit([encoder.finish()]);
        let error = pollster::block_on(scope.pop());
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("poll");
        match error {
            Some(e) => Err(e.to_string()),
            None => Ok(()),
        }
    }

    pub fn assert_no_uncaptured(&self, label: &str) {
        let errors = self.uncaptured.lock().unwrap();
        assert!(
            errors.is_empty(),
            "{label}: uncaptured wgpu errors {errors:?}"
        );
    }
}

/// The caller's own pass: a copy of known data into a buffer of its own, recorded into the
/// encoder the crate records into.
pub struct CallerCopy {
    pub dst: wgpu::Buffer,
    pub data: Vec<f32>,
}

impl CallerCopy {
    pub fn record(e: &Engine, encoder: &mut wgpu::CommandEncoder, seed: u64) -> Self {
        let data = Tensor::random([12], seed).data().to_vec();
        let src = e.buffer(&data);
        let dst = e.zeros(48);
        encoder.copy_buffer_to_buffer(&src, 0, &dst, 0, 48);
        CallerCopy { dst, data }
    }

    pub fn check(&self, e: &Engine, label: &str) {
        assert_eq!(
            e.read(&self.dst, 0, 12),
            self.data,
            "{label}: the caller's copy"
        );
    }
}

/// One sdpa problem: q `[B, H, Lq, 8]`, k/v `[B, Hkv, Lk, 8]`, in `Bhld` or `Blhd`, each at an
/// element offset of its buffer; out `[B, H, Lq, 8]` f32.
#[derive(Debug, Clone)]
pub struct Problem {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub lq: usize,
    pub lk: usize,
    pub layout: Layout,
    pub offsets: [usize; 4],
    pub options: SdpaOptions,
}

pub const D: usize = 8;

impl Problem {
    pub fn new(lq: usize, lk: usize) -> Self {
        Problem {
            batch: 1,
            heads: 2,
            kv_heads: 2,
            lq,
            lk,
            layout: Layout::Bhld,
            offsets: [0; 4],
            options: SdpaOptions::default(),
        }
    }

    pub fn shapes(&self) -> [[usize; 4]; 4] {
        let (b, h, kh) = (self.batch, self.heads, self.kv_heads);
        [
            [b, h, self.lq, D],
            [b, kh, self.lk, D],
            [b, kh, self.lk, D],
            [b, h, self.lq, D],
        ]
    }

    /// q, k, v in `[B, L, H, D]` order (the reference's).
    pub fn inputs(&self, seed: u64) -> [Vec<f32>; 3] {
        let s = self.shapes();
        [0, 1, 2].map(|i| {
            let n: usize = s[i].iter().product();
            Tensor::random([n], seed + i as u64).data().to_vec()
        })
    }

    /// Element index of row `l` of head `h` of batch `b` of tensor `i` (dense, at its offset).
    pub fn index(&self, i: usize, (b, h, l): (usize, usize, usize)) -> usize {
        let [_, heads, len, d] = self.shapes()[i];
        self.offsets[i]
            + match self.layout {
                Layout::Bhld => ((b * heads + h) * len + l) * d,
                Layout::Blhd => ((b * len + l) * heads + h) * d,
            }
    }

    /// Elements tensor `i` spans from the start of its buffer.
    pub fn extent(&self, i: usize) -> usize {
        self.offsets[i] + self.shapes()[i].iter().product::<usize>()
    }

    /// Writes tensor `i`'s `[B, L, H, D]` data into `host` at its place.
    pub fn place(&self, i: usize, data: &[f32], host: &mut [f32]) {
        let [b, h, l, d] = self.shapes()[i];
        for bi in 0..b {
            for li in 0..l {
                for hi in 0..h {
                    let at = self.index(i, (bi, hi, li));
                    let src = ((bi * l + li) * h + hi) * d;
                    host[at..at + d].copy_from_slice(&data[src..src + d]);
                }
            }
        }
    }

    /// Tensor `i` back in `[B, L, H, D]` order from `host` (its buffer from element 0).
    pub fn gather(&self, i: usize, host: &[f32]) -> Vec<f32> {
        let [b, h, l, d] = self.shapes()[i];
        let mut out = Vec::new();
        for bi in 0..b {
            for li in 0..l {
                for hi in 0..h {
                    let at = self.index(i, (bi, hi, li));
                    out.extend_from_slice(&host[at..at + d]);
                }
            }
        }
        out
    }

    pub fn reference(&self, seed: u64) -> Vec<f64> {
        let dims = [
            self.batch,
            self.heads,
            self.kv_heads,
            self.lq,
            self.lk,
            D,
            D,
        ];
        run_sdpa_core(dims, &self.options, self.inputs(seed)).0
    }

    /// q, k, v each in its own buffer (every other element NaN: never read), out zeroed.
    pub fn buffers(&self, e: &Engine, seed: u64) -> [wgpu::Buffer; 4] {
        let data = self.inputs(seed);
        let [q, k, v] = [0, 1, 2].map(|i| {
            let mut host = vec![f32::NAN; self.extent(i) + 3];
            self.place(i, &data[i], &mut host);
            e.buffer(&host)
        });
        [q, k, v, e.zeros(4 * (self.extent(3) as u64 + 1))]
    }

    pub fn tensors<'a>(&self, buffers: [&'a wgpu::Buffer; 4]) -> [DeviceTensor<'a>; 4] {
        let s = self.shapes();
        [0, 1, 2, 3]
            .map(|i| DeviceTensor::new(buffers[i], s[i], self.layout).at_offset(self.offsets[i]))
    }

    /// This problem recorded over `buffers` (q, k, v, out) into an encoder of its own, submitted,
    /// and its output checked.
    pub fn run_and_check(&self, e: &Engine, buffers: [&wgpu::Buffer; 4], seed: u64, label: &str) {
        let [q, k, v, out] = self.tensors(buffers);
        let mut encoder = e.device.create_command_encoder(&Default::default());
        wgpu_mha::record_scaled_dot_product_attention(
            &e.gpu,
            &mut encoder,
            &q,
            &k,
            &v,
            &out,
            &self.options,
        )
        .unwrap_or_else(|err| panic!("{label}: {err}"));
        e.submit(encoder)
            .unwrap_or_else(|err| panic!("{label}: validation error {err}"));
        self.check_out(e, buffers[3], seed, label);
    }

    pub fn check_out(&self, e: &Engine, out: &wgpu::Buffer, seed: u64, label: &str) {
        let host = e.read(out, 0, self.extent(3));
        let got = self.gather(3, &host);
        let want = self.reference(seed);
        assert_within(label, &got, &want, relative_tolerance(1e-5, &want));
    }
}
