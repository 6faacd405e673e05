// The frame of the passes in which one workgroup of 64 reduces over one group of values and
// writes them (qk_norm, mla_rows): the entry point and the workgroup's sum. The host puts it
// before the pass's body, which supplies its params `p` (with `groups_x`: the workgroups in x,
// groups being spread over x then y) and
//   fn group_count() -> u32           // the groups; workgroups past them do nothing
//   fn group_pass(g: u32, lid: u32)   // group g's work; lid is the invocation, 0..WG
// group_pass may call workgroup_sum in control flow uniform across the workgroup.

const WG: u32 = 64u;
var<workgroup> partial: array<f32, 64>;

// The sum of every invocation's `v`, in every invocation.
fn workgroup_sum(lid: u32, v: f32) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            partial[lid] = partial[lid] + partial[lid + s];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let g = wid.y * p.groups_x + wid.x;
    // Uniform across the workgroup: every invocation leaves together, before any barrier.
    if (g >= group_count()) {
        return;
    }
    group_pass(g, lid.x);
}
