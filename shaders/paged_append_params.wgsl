// paged_append_params: what paged_append and paged_append_quant share — their parameters and
// bindings, and the walk over the new rows: new keys and values (f32, token t's head h at
// offset + t · row_stride + h · head_stride: [total_new, H_kv, D] or a head-split projection)
// go to their slots of a page pool, a slot being page · page_size + offset (vLLM's slot
// mapping; negative: skip the token). The pass's body defines PER_INVOCATION, the consecutive
// elements of a (token, KV head) row one invocation takes (a divisor of D), and
// put(src, k_at, v_at), which writes them from element src of the new rows (past k_offset,
// v_offset) to the pool's logical elements k_at (keys) and v_at (values).
// Dispatch: ceil(total_new · H_kv · D / PER_INVOCATION / 64) workgroups of 64, over x then y
// (grid64.wgsl).

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
    scales: u32,       // a quantized pool's scales plane, in words (paged_append_quant)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: PagedAppendParams;
@group(0) @binding(1) var<storage, read> keys: array<f32>;
@group(0) @binding(2) var<storage, read> values: array<f32>;
@group(0) @binding(3) var<storage, read> slots: array<i32>;

fn items() -> u32 {
    return p.tokens * p.kv_heads * (p.head_dim / PER_INVOCATION);
}

fn item(idx: u32) {
    let at = grid3(idx, p.head_dim / PER_INVOCATION, p.kv_heads);  // (run, KV head, token)
    let d = PER_INVOCATION * at.x;
    let kvh = at.y;
    let token = at.z;
    let slot = slots[token];
    if (slot < 0) {
        return;
    }
    let page = u32(slot) / p.page_size;
    let offset = u32(slot) % p.page_size;
    var k_at: u32;
    if (p.hnd == 1u) {
        k_at = ((page * 2u) * p.kv_heads + kvh) * p.page_size * p.head_dim + offset * p.head_dim + d;
    } else {
        k_at = ((page * 2u) * p.page_size + offset) * p.kv_heads * p.head_dim + kvh * p.head_dim + d;
    }
    let values_at = p.page_size * p.kv_heads * p.head_dim;
    put(token * p.row_stride + kvh * p.head_stride + d, k_at, k_at + values_at);
}
