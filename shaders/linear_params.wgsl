// Shared by the three linear shaders (linear, linear_vec4, linear_subgroup); the host prepends
// it. Mirrors `LinearParams` in src/kernels/linear.rs, and says where each output goes.

struct LinearParams {
    m: u32,            // rows of X (= batch · seq_len)
    n: u32,            // output features
    k: u32,            // input features
    seq_len: u32,      // L, to split a row index into (batch, position)
    x_offset: u32,     // element offsets into the bound buffers
    w_offset: u32,
    bias_offset: u32,
    has_bias: u32,
    dst_seq_len: u32,  // rows per (batch, head) in the destination (a KV cache's capacity, else L)
    dst_pos: u32,      // position of input row 0 in the destination (cache length before append)
    k_begin: u32,      // the K range of this dispatch (scalar kernel): [k_begin, k_end);
    k_end: u32,        // a range not starting at 0 adds to y instead of adding the bias
    seg_start: vec4<u32>,    // first column of each segment (.x = 0)
    seg_head_dim: vec4<u32>, // d of each segment
    seg_heads: vec4<u32>,    // H of each segment
    seg_dst: vec4<u32>,      // element offset of each segment in y
}

@group(0) @binding(0) var<uniform> p: LinearParams;

// Where output (row, col) lives: segment, then head-split [B, H, L, d] inside it.
fn dst_index(row: u32, col: u32) -> u32 {
    let s = select(0u, 1u, col >= p.seg_start.y) + select(0u, 1u, col >= p.seg_start.z);
    let local = col - p.seg_start[s];
    let d = p.seg_head_dim[s];
    let head = local / d;
    let b = row / p.seq_len;
    let l = row % p.seq_len;
    return p.seg_dst[s] + ((b * p.seg_heads[s] + head) * p.dst_seq_len + p.dst_pos + l) * d + local % d;
}
