// read_probe_runs: reads every vec4 of two buffers once, each lane a contiguous run of vec4s
// (as decode_lane_keys' lanes read their runs of keys), four vec4s of each buffer per step, and
// keeps one sum per invocation. read_probe.wgsl strides its lanes through memory, the shape a
// GPU coalesces; on a CPU adapter (llvmpipe) a run per lane is one stream the prefetcher
// follows, and decoding read its keys 1.6-2.0x faster than the strided probe. The bench takes
// the fastest of the probe's shapes, so that no kernel reads faster than its bound.
// The host puts a prelude defining LANES (the workgroup size), then read_probe_io.wgsl
// (ProbeParams, the bindings), before this body. Dispatch: ceil(vec4s / per_group) workgroups
// of LANES, spread over x then y; lane l of a workgroup reads per_group / LANES vec4s from
// group · per_group + l · (per_group / LANES).

@compute @workgroup_size(LANES, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let group = wid.y * p.groups_x + wid.x;
    let per_lane = p.per_group / LANES;
    let first = group * p.per_group + lid.x * per_lane;
    let end = min(first + per_lane, p.vec4s);
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var i = first;
    // Whole steps of four vec4s of each buffer, then the buffers' tail one vec4 at a time.
    for (; i + 4u <= end; i += 4u) {
        s0 += (a[i] + b[i]) + (a[i + 1u] + b[i + 1u]);
        s1 += (a[i + 2u] + b[i + 2u]) + (a[i + 3u] + b[i + 3u]);
    }
    for (; i < end; i++) {
        s0 += a[i] + b[i];
    }
    out[group * LANES + lid.x] = dot(s0 + s1, vec4<f32>(1.0));
}
