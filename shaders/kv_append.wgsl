// kv_append: copies a step's new key (or value) rows from the projection's scratch into one
// chunk of a KV cache stored in chunks (a cache larger than one storage binding). Rows
// src_first .. src_first + count of each (batch, key/value head) block of src_stride rows
// go to rows dst_first .. of the chunk's block of dst_stride rows; one element per invocation.
// Dispatch: ceil(elements / 64) workgroups of 64, spread over x then y.
// The host's prelude defines the element type QkvElem.

struct AppendParams {
    blocks: u32,      // B · H_kv
    count: u32,       // rows copied per block
    width: u32,       // elements per row (the head size)
    src_offset: u32,  // element of the scratch's block 0, row 0
    src_stride: u32,
    src_first: u32,
    dst_stride: u32,  // rows per block of the chunk (its keys)
    dst_first: u32,
    groups_x: u32,
    dst_scales: u32,  // kv_append_quant's; unused here
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: AppendParams;
@group(0) @binding(1) var<storage, read> src: array<QkvElem>;
@group(0) @binding(4) var<storage, read_write> dst: array<QkvElem>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let idx = (wid.y * p.groups_x + wid.x) * 64u + lid.x;
    if (idx >= p.blocks * p.count * p.width) {
        return;
    }
    let e = idx % p.width;
    let row = (idx / p.width) % p.count;
    let block = idx / (p.width * p.count);
    let src_index = p.src_offset + (block * p.src_stride + p.src_first + row) * p.width + e;
    dst[(block * p.dst_stride + p.dst_first + row) * p.width + e] = src[src_index];
}
