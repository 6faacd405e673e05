// kv_append_params: what kv_append and kv_append_quant share — their parameters, the source
// binding, and the walk over the new rows. Rows src_first .. src_first + count of each
// (batch, key/value head) block of src_stride rows of the projection's scratch go to rows
// dst_first .. of the chunk's block of dst_stride rows. The pass's body defines
// PER_INVOCATION, the consecutive elements of a row one invocation takes (a divisor of the
// width), and put(src_at, e), which writes them from element src_at of `src` to the chunk's
// logical element e. The host's prelude defines the element type QkvElem.
// Dispatch: ceil(blocks · count · width / PER_INVOCATION / 64) workgroups of 64, over x then y
// (grid64.wgsl).

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
    dst_scales: u32,  // a quantized chunk's scales plane, in words (kv_append_quant)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: AppendParams;
@group(0) @binding(1) var<storage, read> src: array<QkvElem>;

fn items() -> u32 {
    return p.blocks * p.count * (p.width / PER_INVOCATION);
}

fn item(idx: u32) {
    let at = grid3(idx, p.width / PER_INVOCATION, p.count);  // (run, row, block)
    let e = PER_INVOCATION * at.x;
    let src_at = p.src_offset + (at.z * p.src_stride + p.src_first + at.y) * p.width + e;
    put(src_at, (at.z * p.dst_stride + p.dst_first + at.y) * p.width + e);
}
