// clamp: clamps rows of head-split Q, K or V in place to [-limit, limit] (OLMo's `clip_qkv`,
// applied to the projections before anything else). Each invocation clamps one element of
// `n` rows starting at `first` of each of `blocks` (batch, head) blocks of `stride` rows.
// The host prepends a prelude defining the element type QkvElem (f32, or f16 in an f16 module).
// Dispatch: ceil(elements / 64) workgroups of 64, spread over x then y.

struct ClampParams {
    elements: u32,  // blocks · n · head_dim
    n: u32,
    stride: u32,
    first: u32,
    head_dim: u32,
    offset: u32,    // element offset of the segment in its buffer
    groups_x: u32,
    limit: f32,
}

@group(0) @binding(0) var<uniform> p: ClampParams;
@group(0) @binding(1) var<storage, read_write> x: array<QkvElem>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = (wid.y * p.groups_x + wid.x) * 64u + lid.x;
    if (t >= p.elements) {
        return;
    }
    let e = t % p.head_dim;
    let row = t / p.head_dim;
    let i = row % p.n;
    let block = row / p.n;
    let k = p.offset + (block * p.stride + p.first + i) * p.head_dim + e;
    x[k] = QkvElem(clamp(f32(x[k]), -p.limit, p.limit));
}
