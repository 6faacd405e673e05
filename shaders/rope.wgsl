// rope: rotates rows of head-split Q or K in place by their positions (rotary position
// embeddings). The host computes cos/sin of every angle in f64 and passes them as a table
// [B, n, half, 2]; here each invocation rotates one pair of one row:
//   x_a' = x_a·cos − x_b·sin,  x_b' = x_b·cos + x_a·sin
// with (a, b) = (k, k + half) (rotate-half) or (2k, 2k + 1) (interleaved). Dimensions past
// 2·half are left as they are (partial rotary).
// The host prepends a prelude defining the element type QkvElem (f32, or f16 in an f16 module).
// Dispatch: ceil(rows·half / 64) workgroups of 64, spread over x then y (grid64.wgsl).

struct RopeParams {
    rows: u32,         // rows rotated: B · heads · n
    heads: u32,        // heads of this segment (query heads, or key/value heads)
    n: u32,            // rows per (batch, head) rotated: positions of the table
    stride: u32,       // rows per (batch, head) in the buffer (Lq, Lk or a cache's capacity)
    first: u32,        // first rotated row within each (batch, head)
    head_dim: u32,
    half: u32,         // rotary dimensions / 2: the pairs of a row
    interleaved: u32,  // 1: pairs (2k, 2k + 1); 0: pairs (k, k + half)
    offset: u32,       // element offset of the segment in its buffer
    groups_x: u32,     // workgroups along x
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(1) var<storage, read_write> x: array<QkvElem>;
@group(0) @binding(2) var<storage, read> table: array<f32>;

fn items() -> u32 {
    return p.rows * p.half;
}

fn item(t: u32) {
    let row = t / p.half;
    let k = t % p.half;
    let i = row % p.n;
    let bh = row / p.n;
    let b = bh / p.heads;
    let base = p.offset + (bh * p.stride + p.first + i) * p.head_dim;
    var a = k;
    var c = k + p.half;
    if (p.interleaved == 1u) {
        a = 2u * k;
        c = 2u * k + 1u;
    }
    let angle = ((b * p.n + i) * p.half + k) * 2u;
    let cos_a = table[angle];
    let sin_a = table[angle + 1u];
    let xa = f32(x[base + a]);
    let xc = f32(x[base + c]);
    x[base + a] = QkvElem(xa * cos_a - xc * sin_a);
    x[base + c] = QkvElem(xc * cos_a + xa * sin_a);
}
