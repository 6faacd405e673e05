// paged_append: new keys and values (f32, token t's head h at offset + t · row_stride +
// h · head_stride: [total_new, H_kv, D] or a head-split projection) into their slots of a page
// pool, a slot being page · page_size + offset (vLLM's slot mapping; negative: skip the token).
// One invocation per (token, KV head, column), writing K and V, converted to the pool's
// element type KvElem (the host's prelude defines it).
// Dispatch: ceil(total_new · H_kv · D / 64) workgroups of 64, over x then y.

struct PagedAppendParams {
    tokens: u32,
    kv_heads: u32,
    head_dim: u32,
    page_size: u32,
    hnd: u32,          // 1: pages are [2, H_kv, page_size, D]; 0: [2, page_size, H_kv, D]
    groups_x: u32,
    k_offset: u32,     // the new token t's head h of keys at k_offset + t · row_stride +
    v_offset: u32,     // h · head_stride (of values at v_offset + …)
    row_stride: u32,
    head_stride: u32,
    scales: u32,       // a quantized pool's scales plane (paged_append_quant.wgsl); unused here
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: PagedAppendParams;
@group(0) @binding(1) var<storage, read> keys: array<f32>;
@group(0) @binding(2) var<storage, read> values: array<f32>;
@group(0) @binding(3) var<storage, read> slots: array<i32>;
@group(0) @binding(4) var<storage, read_write> pool: array<KvElem>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let idx = (wid.y * p.groups_x + wid.x) * 64u + lid.x;
    if (idx >= p.tokens * p.kv_heads * p.head_dim) {
        return;
    }
    let d = idx % p.head_dim;
    let kvh = (idx / p.head_dim) % p.kv_heads;
    let token = idx / (p.head_dim * p.kv_heads);
    let slot = slots[token];
    if (slot < 0) {
        return;
    }
    let page = u32(slot) / p.page_size;
    let offset = u32(slot) % p.page_size;
    var at: u32;
    if (p.hnd == 1u) {
        at = ((page * 2u) * p.kv_heads + kvh) * p.page_size * p.head_dim + offset * p.head_dim + d;
    } else {
        at = ((page * 2u) * p.page_size + offset) * p.kv_heads * p.head_dim + kvh * p.head_dim + d;
    }
    let values_at = p.page_size * p.kv_heads * p.head_dim;
    let src = token * p.row_stride + kvh * p.head_stride + d;
    pool[at] = KvElem(keys[p.k_offset + src]);
    pool[at + values_at] = KvElem(values[p.v_offset + src]);
}
