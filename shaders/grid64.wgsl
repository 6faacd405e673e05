// grid64: the entry point of the passes that give each invocation of a 1-D dispatch one item:
// workgroups of 64, spread over x then y (p.groups_x of them along x). The pass's body defines
// items(), how many there are, and item(idx), what the invocation of item idx does.

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let idx = (wid.y * p.groups_x + wid.x) * 64u + lid.x;
    if (idx < items()) {
        item(idx);
    }
}

// Item idx of an [outer, middle, inner] grid as its (inner, middle, outer) indices.
fn grid3(idx: u32, inner: u32, middle: u32) -> vec3<u32> {
    return vec3<u32>(idx % inner, (idx / inner) % middle, idx / (inner * middle));
}
