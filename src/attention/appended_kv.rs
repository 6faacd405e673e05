//! The keys a module appends to every sequence (`nn.MultiheadAttention`'s `bias_k`/`bias_v`,
//! a zero key for `add_zero_attn`): input-independent rows written once into a workspace's
//! Q/K/V buffers when they are made.

use super::plan::{qkv_layout, Shape};
use super::MultiHeadAttention;

/// The initial contents of the Q/K/V buffer(s) (labelled, as [`qkv_layout`](super::plan::qkv_layout) lays them out) of
/// a module with appended keys: zero but for rows `Lk_in..Lk` of every (batch, head) of K and
/// V, which hold the appended keys and values. `None` for a module without them.
pub(super) fn appended_kv_images(
    mha: &MultiHeadAttention,
    s: Shape,
    split: bool,
) -> Option<Vec<(&'static str, Vec<f32>)>> {
    let c = &mha.config;
    let appended = c.appended_keys();
    if appended == 0 {
        return None;
    }
    let (h, kv_h, dk, dv) = (c.heads, c.kv_heads, c.qk_head_dim, c.v_head_dim);
    let lk_in = s.input_keys(c);
    let l = qkv_layout(mha, s, split);
    let (k_rows, v_rows) = &mha.weights.appended_kv;
    // Rows are `[appended, H_kv·head_dim]`; head `hi` of row `r` goes to (batch, hi), key
    // lk_in + r.
    let put = |image: &mut [f32], offset: u32, head_dim: usize, rows: &[f32]| {
        for bh in 0..s.batch * kv_h {
            for r in 0..appended {
                let dst = offset as usize + (bh * s.lk + lk_in + r) * head_dim;
                let src = (r * kv_h + bh % kv_h) * head_dim;
                image[dst..dst + head_dim].copy_from_slice(&rows[src..src + head_dim]);
            }
        }
    };
    let [q, k, v] = [h * s.lq * dk, kv_h * s.lk * dk, kv_h * s.lk * dv].map(|n| s.batch * n);
    Some(if split {
        let (mut k_image, mut v_image) = (vec![0.0; k], vec![0.0; v]);
        put(&mut k_image, 0, dk, k_rows);
        put(&mut v_image, 0, dv, v_rows);
        vec![
            ("Q head-split", vec![0.0; q]),
            ("K head-split", k_image),
            ("V head-split", v_image),
        ]
    } else {
        let mut image = vec![0.0; q + k + v];
        put(&mut image, l.k_offset, dk, k_rows);
        put(&mut image, l.v_offset, dv, v_rows);
        vec![("Q|K|V head-split", image)]
    })
}
