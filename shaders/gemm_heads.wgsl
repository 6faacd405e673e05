// The entry point of the per-(batch, head) GEMMs on gemm_tile.wgsl (scores, av_combine): a
// workgroup of 16×16 computes one 64×64 tile of one z layer, z = b·H + h offset by p.z_offset
// (so a problem with more than 65535 (batch, head) pairs can be split), and each thread hands
// the elements of its 4×4 block that lie inside the output to the body's epilogue. The host
// puts it after gemm_tile.wgsl; the body supplies its params `p` (lq, heads, z_offset,
// k_begin, k_end), load_a and load_b, and
//   fn out_cols() -> u32                                          // the output's columns
//   fn epilogue(z: u32, b: u32, h: u32, i: u32, col: u32, acc: f32)  // output row i, column col

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let z = wid.z + p.z_offset;
    let row0 = wid.y * TILE_M;
    let col0 = wid.x * TILE_N;
    let cols = out_cols();
    let acc = gemm_tile(lid, z, row0, col0, p.lq, cols, p.k_begin, p.k_end);
    let b = z / p.heads;
    let h = z % p.heads;
    for (var r = 0u; r < 4u; r++) {
        let i = row0 + lid.y * 4u + r;
        for (var c = 0u; c < 4u; c++) {
            let col = col0 + lid.x * 4u + c;
            if (i < p.lq && col < cols) {
                epilogue(z, b, h, i, col, acc[r][c]);
            }
        }
    }
}
