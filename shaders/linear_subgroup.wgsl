// linear_subgroup: linear_vec4.wgsl with the X loads shared across a subgroup. Same parameters,
// bindings, preconditions (K % 4 == 0, x_offset and w_offset multiples of 4, every index proven
// in range by the host) and dispatch: (ceil(N / 64), ceil(M / 128), 1) workgroups of 64 threads;
// thread (tx, ty) = (index % 8, index / 8) owns rows ty + 8·i (i < 16) and columns tx + 8·j
// (j < 8) of the 128×64 tile, as in linear_vec4.
//
// The 8 threads of a workgroup row (same ty) read the same 16 X rows. Where they are 8
// consecutive lanes of one subgroup, thread tx loads only X rows tx and tx + 8 and the others
// get them by subgroupShuffle: 2 X loads per K step instead of 16 (W is distinct per thread).
// Loads are what costs on a CPU device, where each lane's load is a separate scalar access.
//
// Which invocations form a subgroup, and its size, are up to the device (8 on lavapipe, 32 or
// 64 on most GPUs, possibly 4 or 128), so the shader checks the layout it needs at run time and
// a subgroup that does not have it runs the vec4 loop unchanged (`vec4_block`, the same
// function linear_vec4 runs; the host prepends linear_params.wgsl and linear_vec4_block.wgsl).
//
// Needs the device feature SUBGROUP. No `enable subgroups;`: naga 30 rejects that directive as
// not yet implemented (gfx-rs/wgpu#5555) and gates the subgroup builtins on the feature alone;
// a browser's compiler (Tint) requires it, and `Gpu::compile` adds it there.

// Whether this lane's aligned group of 8 lanes is the 8 threads of one workgroup row, all
// active, in tx order: then lane (lane & ~7) + c is thread (c, ty).
fn row_group_ok(lidx: u32, lane: u32, sg_size: u32) -> bool {
    let offset = lidx - lane; // the same on every lane when lanes follow the invocation index
    let group = lane & ~7u;
    let live = subgroupBallot(true); // 128 bits: subgroups have at most 128 lanes
    let group_bits = (live[min(group / 32u, 3u)] >> (group % 32u)) & 0xffu;
    // Called by every lane, not behind `&&`: a subgroup builtin under a condition that differs
    // across lanes is refused by WGSL's uniformity analysis (Tint's, a browser's).
    let first = subgroupBroadcastFirst(offset);
    return sg_size % 8u == 0u && sg_size <= 128u && offset % 8u == 0u
        && offset == first && group_bits == 0xffu;
}

// One-dimensional: naga allows subgroup_invocation_id only with a 1-D workgroup size.
@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(local_invocation_index) lidx: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    let tx = lidx % 8u;
    let ty = lidx / 8u;
    let row0 = wid.y * 8u * RB + ty;
    let col0 = wid.x * 8u * CB + tx;
    var acc: array<array<f32, CB>, RB>;
    // Subgroup-uniform, so every lane of a subgroup takes the same loop and shuffles read
    // only lanes that run it.
    if (subgroupAll(row_group_ok(lidx, lane, sg_size))) {
        let k4 = p.k / 4u;
        var wb: array<u32, CB>;
        for (var j = 0u; j < CB; j++) {
            wb[j] = w_base(col0, j, k4);
        }
        let group = lane & ~7u;
        // Thread tx loads X rows ty + 8·tx and ty + 8·(tx + 8): acc rows tx and tx + 8.
        let xa = x_base(row0, tx, k4);
        let xc = x_base(row0, tx + 8u, k4);
        for (var kq = 0u; kq < k4; kq++) {
            var b: array<vec4<f32>, CB>;
            for (var j = 0u; j < CB; j++) {
                b[j] = w4[wb[j] + kq];
            }
            let va = x4[xa + kq];
            let vc = x4[xc + kq];
            // Two loops rather than one with both rows: Mesa unrolls only small loop bodies,
            // and an un-unrolled loop leaves acc indexed dynamically (1.7× slower on lavapipe).
            for (var c = 0u; c < 8u; c++) {
                let a = subgroupShuffle(va, group + c);
                for (var j = 0u; j < CB; j++) {
                    acc[c][j] += dot(a, b[j]);
                }
            }
            for (var c = 0u; c < 8u; c++) {
                let a = subgroupShuffle(vc, group + c);
                for (var j = 0u; j < CB; j++) {
                    acc[c + 8u][j] += dot(a, b[j]);
                }
            }
        }
    } else {
        // The vec4 loop: every thread loads its own 16 X rows.
        acc = vec4_block(row0, col0);
    }
    store_block(row0, col0, acc);
}
