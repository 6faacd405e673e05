// Shared by the two decode bodies (decode_attention, decode_lane_keys); the host prepends it.
// Mirrors `DecodeParams` in src/kernels/decode.rs.

// Registers and workgroup memory are laid out for HEAD_CAP_QK and HEAD_CAP_V (the host's
// prelude: the head sizes rounded up to a bucket, see `head_cap` in src/kernels/); the real
// sizes are p.head_dim_qk and p.head_dim_v, and vec4s past them read as zero.
const DK4: u32 = (HEAD_CAP_QK + 3u) / 4u;
const DV4: u32 = (HEAD_CAP_V + 3u) / 4u;
const ROW_VECS: u32 = (ROWS + 3u) / 4u;  // vec4s of per-row values, rows 4n..4n+3 in vec4 n
// The running max's start: exactly -f32::MAX, so a row's max is finite from the start and no
// exponent is -inf - (-inf); a score of -f32::MAX (torch.finfo(float32).min added) then weighs
// exp(0) = 1 at a max it reaches. (-3.402823e38 rounds 2 ulps above -f32::MAX: such a score
// would weigh exp(-4e31) = 0 and leave its row 0/0.)
const LOWEST: f32 = -3.4028234663852886e38;

struct DecodeParams {
    q: RowStrides, // where each tensor's rows lie (rows.wgsl): K's and V's heads are
    k: RowStrides, // key/value heads, their rows counted from key_base
    v: RowStrides,
    lq: u32,              // query rows per (batch, head)
    lk: u32,
    heads: u32,
    kv_heads: u32,
    kv_group: u32,        // query heads per key/value head
    scale: f32,
    keys_per_split: u32,  // a multiple of TILE
    splits: u32,          // of the whole key range (the layout of `partials`)
    split_base: u32,      // the first split of this dispatch
    key_base: u32,        // the key in row 0 of the bound K/V (a KV cache's chunk start)
    head_dim_qk: u32,     // the module's head sizes (at most HEAD_CAP_QK, HEAD_CAP_V)
    head_dim_v: u32,
    k_scales: u32,        // a quantized K's and V's scales plane, in words (kv_quant.wgsl)
    v_scales: u32,
}

// Floats per (row, split) in `partials`: max, sum, and the accumulator's vec4s of the real
// head size (decode_reduce reads them so).
fn part_stride() -> u32 {
    return 2u + 4u * ((p.head_dim_v + 3u) / 4u);
}

@group(0) @binding(0) var<uniform> p: DecodeParams;
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;

// A block's 32 values as decode_lane_keys takes them, unscaled (q or q − 8), in two runs of
// 16, and its scale (the float loads give scale 1).
struct Block32 {
    lo: array<vec4<f32>, 4>,
    hi: array<vec4<f32>, 4>,
    scale: f32,
}
