// read_probe: reads every vec4 of two buffers once and keeps one sum per invocation — the read
// bandwidth a memory-bound pass can reach on this device, measured beside the decode pass on
// buffers of the same size (`wgpu-mha bench --only decode`).
// Dispatch: ceil(vec4s / per_group) workgroups of 64, spread over x then y. ProbeParams and the
// bindings come before this body (read_probe_io.wgsl).

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let group = wid.y * p.groups_x + wid.x;
    let first = group * p.per_group;
    let end = min(first + p.per_group, p.vec4s);
    var s = vec4<f32>(0.0);
    for (var i = first + lid.x; i < end; i += 64u) {
        s += a[i] + b[i];
    }
    out[group * 64u + lid.x] = dot(s, vec4<f32>(1.0));
}
