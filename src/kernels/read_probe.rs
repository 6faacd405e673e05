//! `read_probe`: passes that only read two buffers, to measure the read bandwidth a
//! memory-bound pass (decoding) can reach on a device, in the same run; and the host's own
//! read bandwidth over as many bytes ([`host_read_gbps`]), the physical limit of a CPU adapter.
//!
//! One read shape is not a bound: lanes striding through memory ([`ProbeShape::Strided`]) is
//! what a GPU coalesces, but on llvmpipe the decode pass, whose lanes each read a run of keys,
//! read 1.6–2.0× faster than it. So the probe has several shapes ([`SHAPES`]) and a bench
//! reports the fastest.

use crate::error::Result;
use crate::gpu::pass::{Dispatch, PassSpec, Slot};
use crate::gpu::Gpu;

use super::source::Prelude;

/// `ProbeParams` and the bindings, shared by both shapes' bodies.
pub const IO_WGSL: &str = include_str!("../../shaders/read_probe_io.wgsl");
/// Lanes stride through memory: lane `l` reads vec4s `l, l + 64, …` of its workgroup's range.
/// The whole source: [`IO_WGSL`], then the body (no prelude).
pub const WGSL: &str = concat!(
    include_str!("../../shaders/read_probe_io.wgsl"),
    "\n",
    include_str!("../../shaders/read_probe.wgsl")
);
/// Each lane reads a contiguous run: the body, after a prelude with `LANES` and [`IO_WGSL`]
/// (see [`runs_source`]).
pub const RUNS_WGSL: &str = include_str!("../../shaders/read_probe_runs.wgsl");

/// vec4s of each buffer one workgroup of the strided shape reads (64 per thread: far under
/// any loop cap).
pub const PER_GROUP: u32 = 4096;

/// How the probe's lanes walk memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeShape {
    /// 64 lanes striding through [`PER_GROUP`] vec4s per workgroup (`read_probe.wgsl`).
    Strided,
    /// `lanes` lanes, each reading `per_lane` consecutive vec4s of each buffer
    /// (`read_probe_runs.wgsl`); `per_lane` a multiple of 4.
    Runs { lanes: u32, per_lane: u32 },
}

/// The shapes a bench times: strided (a GPU's); a short run per lane in workgroups of 64; runs
/// of 256 and of 4,096 vec4s per lane in workgroups of 8 (decode_lane_keys' lanes on a CPU
/// adapter, each reading thousands of consecutive vec4s). On llvmpipe (2 cores) the runs of 8
/// lanes read 2–5× faster than the strided shape, the length of the run mattering little.
pub const SHAPES: [ProbeShape; 4] = [
    ProbeShape::Strided,
    ProbeShape::Runs {
        lanes: 64,
        per_lane: 64,
    },
    ProbeShape::Runs {
        lanes: 8,
        per_lane: 256,
    },
    ProbeShape::Runs {
        lanes: 8,
        per_lane: 4096,
    },
];

impl ProbeShape {
    /// `strided`, `runs64x64`, `runs8x1024`: lanes × vec4s per lane.
    pub fn name(&self) -> String {
        match self {
            ProbeShape::Strided => "strided".into(),
            ProbeShape::Runs { lanes, per_lane } => format!("runs{lanes}x{per_lane}"),
        }
    }

    /// Lanes of a workgroup.
    pub fn lanes(&self) -> u32 {
        match self {
            ProbeShape::Strided => 64,
            ProbeShape::Runs { lanes, .. } => *lanes,
        }
    }

    /// vec4s of each buffer one workgroup reads.
    pub fn per_group(&self) -> u32 {
        match self {
            ProbeShape::Strided => PER_GROUP,
            ProbeShape::Runs { lanes, per_lane } => lanes * per_lane,
        }
    }

    /// Workgroups reading `vec4s` vec4s of each buffer.
    pub fn groups(&self, vec4s: u32) -> u32 {
        vec4s.div_ceil(self.per_group()).max(1)
    }

    /// Floats of the `out` buffer: one per invocation.
    pub fn out_len(&self, vec4s: u32) -> usize {
        self.lanes() as usize * self.groups(vec4s) as usize
    }
}

/// Mirrors `ProbeParams` in `read_probe.wgsl` and `read_probe_runs.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ProbeParams {
    pub vec4s: u32,
    pub per_group: u32,
    pub groups_x: u32,
    pub _pad0: u32,
}

/// Workgroups of the strided shape reading `vec4s` vec4s of each buffer.
pub fn groups(vec4s: u32) -> u32 {
    ProbeShape::Strided.groups(vec4s)
}

/// The runs shader for workgroups of `lanes`.
pub fn runs_source(lanes: u32) -> String {
    Prelude::new()
        .u32("LANES", lanes)
        .source(&[IO_WGSL, RUNS_WGSL])
}

/// Reads `vec4s` vec4s of `a` and of `b` in `shape`; `out` takes `shape.out_len(vec4s)` floats.
pub fn dispatch(
    gpu: &Gpu,
    shape: ProbeShape,
    vec4s: u32,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<Dispatch> {
    let total = shape.groups(vec4s) as u64;
    let (groups_x, workgroups) = super::clamp::spread_groups(gpu, total, "read probe")?;
    let p = ProbeParams {
        vec4s,
        per_group: shape.per_group(),
        groups_x,
        _pad0: 0,
    };
    let slots = [
        Slot::Uniform(0),
        Slot::Read(1),
        Slot::Read(2),
        Slot::Write(4),
    ];
    let spec = PassSpec::main("read_probe", &slots);
    let pass = match shape {
        ProbeShape::Strided => gpu.compile("read_probe", &spec, || WGSL.to_string()),
        ProbeShape::Runs { lanes, .. } => {
            gpu.compile(&format!("read_probe_runs {lanes}"), &spec, || {
                runs_source(lanes)
            })
        }
    };
    Dispatch::new(gpu, pass, &p, &[(1, a), (2, b), (4, out)], workgroups)
}

/// The host's read bandwidth in GB/s over `bytes` of memory: a streaming sum of u64 words on
/// every core (one contiguous chunk per core), the best of at least `runs` runs (more, up to
/// 200, until they have taken 100 ms: a small buffer is read in microseconds, and one
/// descheduled thread would otherwise be the figure). On a CPU adapter this is the physical
/// limit of any pass that reads as many bytes (from memory past the caches, from them below).
/// The words are written first: a fresh allocation would read the kernel's shared zero page.
#[cfg(not(target_arch = "wasm32"))]
pub fn host_read_gbps(bytes: u64, runs: usize) -> f64 {
    let words = (bytes / 8).max(1) as usize;
    let data: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = words.div_ceil(cores).max(1);
    let mut best = f64::INFINITY;
    use std::time::Instant;
    let began = Instant::now();
    for run in 0..200 {
        if run >= runs.max(1) && began.elapsed().as_secs_f64() > 0.1 {
            break;
        }
        let start = Instant::now();
        std::thread::scope(|s| {
            let sums: Vec<_> = data
                .chunks(chunk)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |acc, &w| acc.wrapping_add(w))))
                .collect();
            for sum in sums {
                std::hint::black_box(sum.join().unwrap_or(0));
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    (8 * words) as f64 / best / 1e9
}
