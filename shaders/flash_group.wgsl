// flash_group: the key-group math of the flash passes (flash_attention, paged_prefill), over
// K/V tiles staged in workgroup memory: each thread's ROWS rows hold q and the accumulators as
// vec4s, a group of KEY_GROUP keys is scored, softmaxed online and added to them at once. The
// row loops run in quarters so that lavapipe unrolls them (see flash_attention.wgsl's header).
// The pass defines ROWS, KEY_GROUP, DK4 and DV4.
//
// A thread's row state lives in module-scope private arrays, not in the pass's locals passed
// here by pointer: GLSL and HLSL have no pointers, so naga passes a pointer argument as an
// `inout` copy, and at d128 every call copied the 4 × 32 vec4s of q or acc in and out (128
// calls per key group): Mesa's GL compiler took 9.5 minutes over one flash pipeline. SPIR-V and
// MSL keep real pointers; a private array is a local after inlining everywhere.

// Each owned row's scores (then weights) of one key group: vec4s 2 and 3 only with 16 keys.
alias GroupScores = array<array<vec4<f32>, 4>, ROWS>;
// One head-size vec4 of each key (or value) of a group: 8..15 only with 16 keys.
alias GroupRows = array<vec4<f32>, 16>;

var<private> q_regs: array<array<vec4<f32>, DK4>, ROWS>;  // pre-scaled, so dots are scores
var<private> acc: array<array<vec4<f32>, DV4>, ROWS>;     // P·V under the running max
var<private> scores: GroupScores;                         // the current key group's
var<private> row_max: array<f32, ROWS>;
var<private> row_sum: array<f32, ROWS>;
var<private> correction: array<f32, ROWS>;                // exp(old max − new max)

// The four dot products of qc with keys j .. j + 3 of a group.
fn quad_dots(qc: vec4<f32>, k: GroupRows, j: u32) -> vec4<f32> {
    return vec4<f32>(dot(qc, k[j]), dot(qc, k[j + 1u]), dot(qc, k[j + 2u]), dot(qc, k[j + 3u]));
}

// Weights w of keys j .. j + 3 times their value vec4s.
fn quad_values(w: vec4<f32>, v: GroupRows, j: u32) -> vec4<f32> {
    return w.x * v[j] + w.y * v[j + 1u] + w.z * v[j + 2u] + w.w * v[j + 3u];
}

// The functions below spell out each vec4 of a row's scores rather than loop over them: with
// an inner loop, lavapipe ran about 1.2x slower.

// Rows [first, last) of a key group's QKᵀ over head-size vec4 c: each row's scores gain its
// dot products with the group's keys k.
fn add_group_dots(
    first: u32,
    last: u32,
    live_rows: u32,
    c: u32,
    k: GroupRows,
) {
    for (var r = first; r < last; r++) {
        if (r < live_rows) {
            let qc = q_regs[r][c];
            scores[r][0] += quad_dots(qc, k, 0u);
            scores[r][1] += quad_dots(qc, k, 4u);
            if (KEY_GROUP == 16u) {
                scores[r][2] += quad_dots(qc, k, 8u);
                scores[r][3] += quad_dots(qc, k, 12u);
            }
        }
    }
}

// Rows [first, last) of a key group's online softmax: the new max, the correction of what was
// accumulated under the old one, and the scores turned into weights exp(s - max).
fn group_softmax_rows(
    first: u32,
    last: u32,
) {
    for (var r = first; r < last; r++) {
        var m4 = max(scores[r][0], scores[r][1]);
        if (KEY_GROUP == 16u) {
            m4 = max(m4, max(scores[r][2], scores[r][3]));
        }
        let m = vec4<f32>(max(row_max[r], max(max(m4.x, m4.y), max(m4.z, m4.w))));
        correction[r] = exp(row_max[r] - m.x);
        scores[r][0] = exp(scores[r][0] - m);
        scores[r][1] = exp(scores[r][1] - m);
        var total = scores[r][0] + scores[r][1];
        if (KEY_GROUP == 16u) {
            scores[r][2] = exp(scores[r][2] - m);
            scores[r][3] = exp(scores[r][3] - m);
            total += scores[r][2] + scores[r][3];
        }
        row_sum[r] = row_sum[r] * correction[r] + dot(total, vec4<f32>(1.0));
        row_max[r] = m.x;
    }
}

// Rows [first, last) of a key group's P·V over head-size vec4 c: acc[r][c], rescaled, gains
// the weights times the group's values v.
fn add_group_values(
    first: u32,
    last: u32,
    live_rows: u32,
    c: u32,
    v: GroupRows,
) {
    for (var r = first; r < last; r++) {
        if (r < live_rows) {
            var o = acc[r][c] * correction[r];
            o += quad_values(scores[r][0], v, 0u) + quad_values(scores[r][1], v, 4u);
            if (KEY_GROUP == 16u) {
                o += quad_values(scores[r][2], v, 8u) + quad_values(scores[r][3], v, 12u);
            }
            acc[r][c] = o;
        }
    }
}

// The whole key group's steps, each as its four row quarters (one call per quarter keeps each
// row loop small enough for lavapipe to unroll).
fn add_group_dots_all(live_rows: u32, c: u32, k: GroupRows) {
    add_group_dots(0u, ROWS / 4u, live_rows, c, k);
    add_group_dots(ROWS / 4u, ROWS / 2u, live_rows, c, k);
    add_group_dots(ROWS / 2u, 3u * ROWS / 4u, live_rows, c, k);
    add_group_dots(3u * ROWS / 4u, ROWS, live_rows, c, k);
}

fn group_softmax_all() {
    group_softmax_rows(0u, ROWS / 4u);
    group_softmax_rows(ROWS / 4u, ROWS / 2u);
    group_softmax_rows(ROWS / 2u, 3u * ROWS / 4u);
    group_softmax_rows(3u * ROWS / 4u, ROWS);
}

fn add_group_values_all(live_rows: u32, c: u32, v: GroupRows) {
    add_group_values(0u, ROWS / 4u, live_rows, c, v);
    add_group_values(ROWS / 4u, ROWS / 2u, live_rows, c, v);
    add_group_values(ROWS / 2u, 3u * ROWS / 4u, live_rows, c, v);
    add_group_values(3u * ROWS / 4u, ROWS, live_rows, c, v);
}
