// Shared main loop of the three matmul passes (linear, scores, av_combine). The host prepends
// this file to each of them; the pass supplies
//   fn load_a(batch: u32, row: u32, k: u32) -> f32   // A[row, k], caller guarantees in range
//   fn load_b(batch: u32, k: u32, col: u32) -> f32   // B[k, col], caller guarantees in range
// and stores the 4×4 accumulator block this thread owns with its own epilogue.
//
// A workgroup of 16×16 threads computes a 64×64 output tile; each thread keeps a 4×4 block in
// registers, so every value read from workgroup memory is used four times (register blocking).
// The K dimension is walked in slices of 16, staged through workgroup memory as vec4s.

// TILE_M and TILE_N (64: the output tile of one workgroup) come from the host's prelude, which
// also sizes the dispatch with them.
const TILE_K: u32 = 16u;

// a_tile[k * 16 + g] holds A rows 4g..4g+3 at column k of the slice; b_tile likewise for B cols.
var<workgroup> a_tile: array<vec4<f32>, 256>;
var<workgroup> b_tile: array<vec4<f32>, 256>;

// Returns acc[i][j] = Σ_k A[row0 + 4·ty + i, k] · B[k, col0 + 4·tx + j] over k in
// [k_begin, k_end) (zero outside the shape). A long K is split over dispatches by the host
// (software rasterisers cap a shader's loop iterations); each pass's epilogue then adds its
// partial sum to what the previous dispatch stored.
fn gemm_tile(lid: vec3<u32>, batch: u32, row0: u32, col0: u32, rows: u32, cols: u32, k_begin: u32, k_end: u32) -> array<vec4<f32>, 4> {
    let t = lid.y * 16u + lid.x;
    let load_k = t % 16u;   // which column of the K slice this thread stages
    let load_g = t / 16u;   // which group of 4 rows (A) / 4 columns (B) it stages
    var acc: array<vec4<f32>, 4>;
    for (var k0 = k_begin; k0 < k_end; k0 += TILE_K) {
        let k = k0 + load_k;
        var a = vec4<f32>(0.0);
        var b = vec4<f32>(0.0);
        if (k < k_end) {
            for (var c = 0u; c < 4u; c++) {
                let row = row0 + load_g * 4u + c;
                if (row < rows) {
                    a[c] = load_a(batch, row, k);
                }
                let col = col0 + load_g * 4u + c;
                if (col < cols) {
                    b[c] = load_b(batch, k, col);
                }
            }
        }
        a_tile[load_k * 16u + load_g] = a;
        b_tile[load_k * 16u + load_g] = b;
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K; kk++) {
            let av = a_tile[kk * 16u + lid.y];
            let bv = b_tile[kk * 16u + lid.x];
            acc[0] += av.x * bv;
            acc[1] += av.y * bv;
            acc[2] += av.z * bv;
            acc[3] += av.w * bv;
        }
        workgroupBarrier();
    }
    return acc;
}
