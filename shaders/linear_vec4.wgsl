// linear_vec4: linear.wgsl (Y = X · Wᵀ + b into head-split segments) for the common case the host
// selects it for: K % 4 == 0 and x_offset, w_offset multiples of 4, so every row of X and W is a
// run of whole vec4s. X and W are bound as vec4 arrays and read along K four floats at a time.
// Same bindings and parameters as linear.wgsl; the host prepends linear_params.wgsl.
// Dispatch: (ceil(N / 64), ceil(M / 128), 1) workgroups of 8×8 threads; thread (tx, ty) owns
// rows ty + 8·i (i < RB = 16) and columns tx + 8·j (j < CB = 8) of the 128×64 tile, so stores
// of neighbouring threads hit neighbouring columns.
//
// No workgroup memory: each thread reads its X and W vec4s straight from storage and uses
// every X vec4 for CB outputs and every W vec4 for RB outputs (a 16×8 register block);
// the reuse comes from registers, not from staged tiles.

@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const RB: u32 = 16u;
const CB: u32 = 8u;

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.y * 8u * RB + lid.y;
    let col0 = wid.x * 8u * CB + lid.x;
    let k4 = p.k / 4u;
    var xb: array<u32, RB>;
    var wb: array<u32, CB>;
    for (var i = 0u; i < RB; i++) {
        xb[i] = p.x_offset / 4u + select(0u, (row0 + 8u * i) * k4, row0 + 8u * i < p.m);
    }
    for (var j = 0u; j < CB; j++) {
        wb[j] = p.w_offset / 4u + select(0u, (col0 + 8u * j) * k4, col0 + 8u * j < p.n);
    }
    var acc: array<array<f32, CB>, RB>;
    for (var kq = 0u; kq < k4; kq++) {
        var b: array<vec4<f32>, CB>;
        for (var j = 0u; j < CB; j++) {
            b[j] = w4[wb[j] + kq];
        }
        for (var i = 0u; i < RB; i++) {
            let a = x4[xb[i] + kq];
            for (var j = 0u; j < CB; j++) {
                acc[i][j] += dot(a, b[j]);
            }
        }
    }
    for (var i = 0u; i < RB; i++) {
        let row = row0 + 8u * i;
        for (var j = 0u; j < CB; j++) {
            let col = col0 + 8u * j;
            if (row < p.m && col < p.n) {
                var v = acc[i][j];
                if (p.has_bias != 0u) {
                    v += bias[p.bias_offset + col];
                }
                y[dst_index(row, col)] = v;
            }
        }
    }
}
