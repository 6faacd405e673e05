// merge_state: two attention states of the same rows over disjoint key sets, (v_a, s_a) and
// (v_b, s_b) with s the natural-log sum of exp(score) and v the normalised output, into the
// state over both: s = log(exp(s_a) + exp(s_b)), v = exp(s_a − s)·v_a + exp(s_b − s)·v_b.
// A state that saw no key has s = −inf and weighs 0; if neither saw one, v is 0, s −inf.
// One invocation per (row, head, column).
// Dispatch: ceil(rows · H · D / 64) workgroups of 64, over x then y.

struct MergeStateParams {
    rows: u32,       // rows · heads
    head_dim: u32,
    groups_x: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: MergeStateParams;
@group(0) @binding(1) var<storage, read> v_a: array<f32>;
@group(0) @binding(2) var<storage, read> s_a: array<f32>;
@group(0) @binding(3) var<storage, read> v_b: array<f32>;
@group(0) @binding(4) var<storage, read> s_b: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> s_out: array<f32>;

// The max starts at the lowest finite float (never −inf − (−inf)), as in paged_merge.
const LOWEST: f32 = -0x1.fffffep+127f;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u | (p.rows & 0u));
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let idx = (wid.y * p.groups_x + wid.x) * 64u + lid.x;
    if (idx >= p.rows * p.head_dim) {
        return;
    }
    let row = idx / p.head_dim;
    let a = s_a[row];
    let b = s_b[row];
    let m = max(LOWEST, max(a, b));
    let wa = exp(a - m);
    let wb = exp(b - m);
    let total = wa + wb;
    if (total < 0.5) {
        v_out[idx] = 0.0;
        if (idx % p.head_dim == 0u) {
            s_out[row] = neg_inf();
        }
        return;
    }
    v_out[idx] = (wa * v_a[idx] + wb * v_b[idx]) / total;
    if (idx % p.head_dim == 0u) {
        s_out[row] = m + log(total);
    }
}
