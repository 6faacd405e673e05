// linear_vec4: linear.wgsl (Y = X · Wᵀ + b into head-split segments) for the common case the host
// selects it for: K % 4 == 0 and x_offset, w_offset multiples of 4, so every row of X and W is a
// run of whole vec4s. X and W are bound as vec4 arrays and read along K four floats at a time.
// Same bindings and parameters as linear.wgsl; the host prepends linear_params.wgsl and
// linear_vec4_block.wgsl (the block loop and the store, shared with linear_subgroup).
// Dispatch: (ceil(N / 64), ceil(M / 128), 1) workgroups of 8×8 threads; thread (tx, ty) owns
// rows ty + 8·i (i < RB = 16) and columns tx + 8·j (j < CB = 8) of the 128×64 tile, so stores
// of neighbouring threads hit neighbouring columns.
//
// No workgroup memory: each thread reads its X and W vec4s straight from storage and uses
// every X vec4 for CB outputs and every W vec4 for RB outputs (a 16×8 register block);
// the reuse comes from registers, not from staged tiles.

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.y * 8u * RB + lid.y;
    let col0 = wid.x * 8u * CB + lid.x;
    store_block(row0, col0, vec4_block(row0, col0));
}
