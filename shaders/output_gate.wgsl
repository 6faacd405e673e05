// output_gate: Qwen3-Next's gate on the combined heads, in place before W_o:
// x[i] = x[i] · sigmoid(gate[i]) over `elements` f32 values (the gate is the query input's
// projection by W_g, one value per combined element). sigmoid(g) = 1 / (1 + exp(−g)): exp
// overflows to +inf for g < −88, giving 0, and underflows to 0 for large g, giving 1.
// Dispatch: ceil(elements / 64) workgroups of 64, spread over x then y.

struct GateParams {
    elements: u32,
    groups_x: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: GateParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = (wid.y * p.groups_x + wid.x) * 64u + lid.x;
    if (t >= p.elements) {
        return;
    }
    x[t] = x[t] / (1.0 + exp(-gate[t]));
}
