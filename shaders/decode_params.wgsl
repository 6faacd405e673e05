// Shared by the two decode bodies (decode_attention, decode_lane_keys); the host prepends it.
// Mirrors `DecodeParams` in src/kernels/decode.rs.

const DK4: u32 = (HEAD_DIM_QK + 3u) / 4u;
const DV4: u32 = (HEAD_DIM_V + 3u) / 4u;
const PART_STRIDE: u32 = 2u + 4u * DV4;  // per (row, split) in `partials`: max, sum, accumulator
const ROW_VECS: u32 = (ROWS + 3u) / 4u;  // vec4s of per-row values, rows 4n..4n+3 in vec4 n
const LOWEST: f32 = -3.402823e38;        // the running max's start: -f32::MAX

struct DecodeParams {
    lq: u32,              // query rows per (batch, head)
    lk: u32,
    heads: u32,
    kv_heads: u32,
    kv_group: u32,        // query heads per key/value head
    scale: f32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    kv_stride: u32,       // rows of K/V per (batch, kv head)
    keys_per_split: u32,  // a multiple of TILE
    splits: u32,          // of the whole key range (the layout of `partials`)
    split_base: u32,      // the first split of this dispatch
    key_base: u32,        // the key in row 0 of the bound K/V (a KV cache's chunk start)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: DecodeParams;
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;
