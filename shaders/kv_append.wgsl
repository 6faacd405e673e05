// kv_append: copies a step's new key (or value) rows from the projection's scratch into one
// chunk of a KV cache stored in chunks (a cache larger than one storage binding), one element
// per invocation (kv_append_params.wgsl walks the rows).

@group(0) @binding(4) var<storage, read_write> dst: array<QkvElem>;

const PER_INVOCATION: u32 = 1u;

fn put(src_at: u32, e: u32) {
    dst[e] = src[src_at];
}
