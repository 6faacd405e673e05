// The parameters and bindings of both read-probe shapes (read_probe.wgsl, read_probe_runs.wgsl),
// which the host puts before either body: two buffers of vec4s read, one f32 per invocation
// written.

struct ProbeParams {
    vec4s: u32,      // vec4s in each buffer
    per_group: u32,  // vec4s of each buffer one workgroup reads (runs: a multiple of 4 · LANES)
    groups_x: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: ProbeParams;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
