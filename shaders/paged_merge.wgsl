// paged_merge: combines the partial states that a plan's key chunks left for one query row,
// (o_c, lse_c) for chunks c = 0 .. chunks − 1, into the row's output and log-sum-exp:
//   lse = log Σ_c exp(lse_c),  o = Σ_c exp(lse_c − lse) · o_c
// Rows whose keys were not split were written whole by paged_attention and are skipped.
// One invocation per (row, head, vec4 of columns), in chunk order (so bit-identical per plan).
// Dispatch: ceil(total_q · H · DV4 / 64) workgroups of 64, over x then y (grid64.wgsl).
// The host's prelude defines DV4.

struct MergeParams {
    total_q: u32,
    heads: u32,
    head_dim: u32,
    rows_at: u32,       // u32 offset into `plan` of the rows' [first partial row, stride, chunks, 0]
    partial_rows: u32,  // rows of partial states in `scratch` (its lse part follows them)
    write_lse: u32,
    groups_x: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: MergeParams;
@group(0) @binding(1) var<storage, read> plan: array<u32>;
@group(0) @binding(2) var<storage, read> scratch: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;   // [total_q, H, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;   // [total_q, H]

// As in paged_attention: the max starts finite, a chunk that saw no key has lse −inf and
// weighs 0, and a row whose chunks all saw none ends with a total below 1/2.
const LOWEST: f32 = -0x1.fffffep+127f;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u | (p.total_q & 0u));
}

fn items() -> u32 {
    return p.total_q * p.heads * DV4;
}

fn item(idx: u32) {
    let at = grid3(idx, DV4, p.heads);
    let c = at.x;
    let h = at.y;
    let row = at.z;
    let info = p.rows_at + row * 4u;
    let first = plan[info];
    let stride = plan[info + 1u];
    let chunks = plan[info + 2u];
    if (chunks < 2u) {
        return;
    }
    let lse_base = p.partial_rows * p.heads * p.head_dim;
    var m = LOWEST;
    for (var k = 0u; k < chunks; k++) {
        m = max(m, scratch[lse_base + (first + k * stride) * p.heads + h]);
    }
    var total = 0.0;
    var acc = vec4<f32>(0.0);
    for (var k = 0u; k < chunks; k++) {
        let prow = first + k * stride;
        let weight = exp(scratch[lse_base + prow * p.heads + h] - m);
        total += weight;
        let base = (prow * p.heads + h) * p.head_dim + c * 4u;
        for (var lane = 0u; lane < 4u; lane++) {
            if (c * 4u + lane < p.head_dim) {
                acc[lane] += weight * scratch[base + lane];
            }
        }
    }
    var row_lse = neg_inf();
    if (total >= 0.5) {
        acc /= total;
        row_lse = m + log(total);
    } else {
        acc = vec4<f32>(0.0);
    }
    let base = (row * p.heads + h) * p.head_dim + c * 4u;
    for (var lane = 0u; lane < 4u; lane++) {
        if (c * 4u + lane < p.head_dim) {
            out[base + lane] = acc[lane];
        }
    }
    if (c == 0u && p.write_lse == 1u) {
        lse[row * p.heads + h] = row_lse;
    }
}
