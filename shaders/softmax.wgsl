// softmax: in place over each row of S [rows, cols], numerically stable (max subtracted).
// One workgroup of 64 threads per row: strided max, tree reduction, strided sum, tree
// reduction, then normalise. Dispatch: (min(rows, 65535), ceil(rows / 65535), 1).

struct SoftmaxParams {
    rows: u32,
    cols: u32,
    groups_x: u32,   // workgroups along x; row = wid.y · groups_x + wid.x
    sinks: u32,      // 1: row r of [·, heads, lq, cols] adds its head's sink to the denominator
    lq: u32,
    heads: u32,
    _pad0: u32,
    _pad1: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: SoftmaxParams;
@group(0) @binding(4) var<storage, read_write> s: array<f32>;
@group(0) @binding(8) var<storage, read> sinks: array<f32>;

var<workgroup> partial: array<f32, WG>;

fn reduce_max(lid: u32, v: f32) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            partial[lid] = max(partial[lid], partial[lid + stride]);
        }
        workgroupBarrier();
    }
    let r = partial[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(lid: u32, v: f32) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            partial[lid] = partial[lid] + partial[lid + stride];
        }
        workgroupBarrier();
    }
    let r = partial[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.y * p.groups_x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    // A sink is a column of value zero outside the row: in the max and the sum only.
    // Exactly -f32::MAX: the max is finite from the start, so no exponent is -inf - (-inf),
    // and a score of -f32::MAX (torch.finfo(float32).min added) weighs exp(0) at that max.
    var sink = -3.4028234663852886e38;
    if (p.sinks == 1u) {
        sink = sinks[(row / p.lq) % p.heads];
    }
    var m = sink;
    for (var j = lid.x; j < p.cols; j += WG) {
        m = max(m, s[base + j]);
    }
    m = reduce_max(lid.x, m);
    var sum = 0.0;
    for (var j = lid.x; j < p.cols; j += WG) {
        sum += exp(s[base + j] - m);
    }
    sum = reduce_sum(lid.x, sum);
    if (p.sinks == 1u) {
        sum += exp(sink - m);
    }
    // Every score of the row was -inf (an additive mask) iff the sum stayed below 1: a finite
    // score at the (finite) max adds exp(0) = 1, a sink joins the same way, and -inf scores add
    // exp(-inf), 0 (or next to it: fast math need not keep it exact). The softmax is then 0/0,
    // NaN, as the reference's. WGSL has no NaN constant, so it is spelled out.
    let inv = select(1.0 / sum, bitcast<f32>(0x7fc00000u | (p.cols & 0u)), sum < 0.5);
    for (var j = lid.x; j < p.cols; j += WG) {
        s[base + j] = exp(s[base + j] - m) * inv;
    }
}
