// Shared by linear_vec4 and linear_subgroup (the host prepends it, after linear_params.wgsl):
// their bindings, the 16×8 register block each thread owns, the plain vec4 K loop and the store.
// Thread (tx, ty) of a tile starting at row0 - ty, col0 - tx owns rows row0 + 8·i (i < RB) and
// columns col0 + 8·j (j < CB). Every index is in range for the parameters the host selects
// these shaders for (see `LinearParams::in_bounds`); rows and columns past the edge read row 0
// and are not stored.

@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// RB (rows) and CB (columns) of the register block come from the host's prelude.

// vec4 index of the start of X row row0 + 8·i (row 0 past the edge).
fn x_base(row0: u32, i: u32, k4: u32) -> u32 {
    let row = row0 + 8u * i;
    return p.x_offset / 4u + select(0u, row * k4, row < p.m);
}

// vec4 index of the start of W row (output column) col0 + 8·j (row 0 past the edge).
fn w_base(col0: u32, j: u32, k4: u32) -> u32 {
    let col = col0 + 8u * j;
    return p.w_offset / 4u + select(0u, col * k4, col < p.n);
}

// The thread's 16×8 block of X · Wᵀ, every X and W vec4 loaded by the thread itself.
fn vec4_block(row0: u32, col0: u32) -> array<array<f32, CB>, RB> {
    let k4 = p.k / 4u;
    var xb: array<u32, RB>;
    var wb: array<u32, CB>;
    for (var i = 0u; i < RB; i++) {
        xb[i] = x_base(row0, i, k4);
    }
    for (var j = 0u; j < CB; j++) {
        wb[j] = w_base(col0, j, k4);
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
    return acc;
}

// Adds the bias and stores the block into the head-split destination.
fn store_block(row0: u32, col0: u32, acc: array<array<f32, CB>, RB>) {
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
