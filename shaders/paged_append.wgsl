// paged_append: new keys and values into their slots of a page pool (paged_append_params.wgsl
// walks them), one invocation per (token, KV head, column), writing K and V converted to the
// pool's element type KvElem (the host's prelude defines it).

@group(0) @binding(4) var<storage, read_write> pool: array<KvElem>;

const PER_INVOCATION: u32 = 1u;

fn put(src: u32, k_at: u32, v_at: u32) {
    pool[k_at] = KvElem(keys[p.k_offset + src]);
    pool[v_at] = KvElem(values[p.v_offset + src]);
}
