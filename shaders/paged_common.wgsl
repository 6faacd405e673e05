// paged_common: what the paged passes (paged_attention, paged_decode) share — their
// parameters, bindings, work-list strides and sentinels, and where a page keeps an element.
// The host's prelude defines the pool's element type KvElem.

struct PagedParams {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    page_size: u32,
    hnd: u32,             // 1: pages are [2, H_kv, page_size, D]; 0: [2, page_size, H_kv, D]
    causal: u32,
    window_left: u32,     // keys pos − window_left ..= pos; 0xffffffff: no window
    flags: u32,           // 1: sinks, 2: ALiBi, 4: write lse
    scale: f32,
    softcap: f32,         // 0: none
    groups_x: u32,
    items: u32,
    seqs_at: u32,         // u32 offsets into `plan` of each table
    indices_at: u32,
    heads_at: u32,        // [H] sink logits then [H] ALiBi slopes, as f32 bits
    partial_rows: u32,    // rows of partial states in `scratch` (its lse part follows them)
    q_offset: u32,        // q's row r of head h at q_offset + r · q_row + h · q_head
    q_row: u32,
    q_head: u32,
    page_shift: u32,      // log2(page_size)
    item_base: u32,       // this dispatch's first item: a plan's parts run in passes of their own
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: PagedParams;
// Binding 1, q (see q_offset), and binding 2, the pool [pages, 2, ...], are declared by each
// pass: element by element (paged_attention) or as whole vec4s (paged_decode).
@group(0) @binding(3) var<storage, read> plan: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;    // [total_q, H, D]
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;    // [total_q, H]
@group(0) @binding(6) var<storage, read_write> scratch: array<f32>;

const ITEM_WORDS: u32 = 12u;
const SEQ_WORDS: u32 = 4u;
const NO_WINDOW: u32 = 0xffffffffu;
const DIRECT: u32 = 0xffffffffu;
// The running max starts at the lowest finite float, so every exponent s − max is finite −
// finite or −inf − finite (exactly 0, or next to it where fast math keeps no exact exp(−inf)),
// never −inf − (−inf). A slot that saw no key ends with a sum below 1/2: any key seen adds
// exp(0) = 1 at the final max, a sink starts the sum at 1.
const LOWEST: f32 = -0x1.fffffep+127f;

// −inf, made a runtime value (WGSL rejects infinite constants): a hidden key's score.
fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u | (p.items & 0u));
}

// Element `d` of token `offset` of KV head `kvh` in page `page`; `which` 0 = K, 1 = V.
fn pool_index(page: u32, which: u32, offset: u32, kvh: u32, d: u32) -> u32 {
    let page_base = (page * 2u + which) * p.page_size * p.kv_heads * p.head_dim;
    if (p.hnd == 1u) {
        return page_base + (kvh * p.page_size + offset) * p.head_dim + d;
    }
    return page_base + (offset * p.kv_heads + kvh) * p.head_dim + d;
}

// A work item of the plan (ITEM_WORDS words) with the words of its sequence (SEQ_WORDS).
struct PlanItem {
    live: bool,           // false past this dispatch's items (uniform across the workgroup)
    kvh: u32,
    head_base: u32,       // the item's first query head
    n_heads: u32,
    row0: u32,            // its first query row within the sequence
    rows: u32,
    key_begin: u32,       // its keys: [key_begin, key_end)
    key_end: u32,
    partial: u32,         // DIRECT, or this chunk's first partial row
    first_chunk: u32,
    q_begin: u32,         // the sequence's first row of q and out
    q_len: u32,
    kv_len: u32,
    page_begin: u32,      // its first page in the page indices
}

// The item of workgroup `wid` (over x then y, from p.item_base).
fn plan_item(wid: vec3<u32>) -> PlanItem {
    var it: PlanItem;
    let index = wid.y * p.groups_x + wid.x;
    it.live = index < p.items;
    if (!it.live) {
        return it;
    }
    let w = (p.item_base + index) * ITEM_WORDS;
    let s = p.seqs_at + plan[w] * SEQ_WORDS;
    it.kvh = plan[w + 1u];
    it.head_base = it.kvh * (p.heads / p.kv_heads) + plan[w + 2u];
    it.n_heads = plan[w + 3u];
    it.row0 = plan[w + 4u];
    it.rows = plan[w + 5u];
    it.key_begin = plan[w + 6u];
    it.key_end = plan[w + 7u];
    it.partial = plan[w + 8u];
    it.first_chunk = plan[w + 9u];
    it.q_begin = plan[s];
    it.q_len = plan[s + 1u];
    it.kv_len = plan[s + 2u];
    it.page_begin = plan[s + 3u];
    return it;
}
