//! The passes that work row by row on the new rows of Q, K and V in place, between the
//! projections and the attention core: OLMo's clamp, the q/k norms, RoPE.

use super::chain_buffers::{new_kv_row, Bound, Geometry, RopeTables};
use super::MultiHeadAttention;
use crate::error::Result;
use crate::gpu::pass::Dispatch;
use crate::kernels::rope::{self, RopeRows};
use crate::kernels::{clamp, qk_norm};

/// The three clamps of OLMo's `clip_qkv` (none without it).
pub(crate) fn clamps(mha: &MultiHeadAttention, g: &Geometry, b: &Bound) -> Result<Vec<Dispatch>> {
    let c = &mha.config;
    let Some(limit) = c.clip_qkv else {
        return Ok(Vec::new());
    };
    let [q_rows, k_rows] = new_rows(mha, g, b);
    let v_rows = RopeRows {
        head_dim: c.v_head_dim,
        offset: g.layout.v_offset,
        ..k_rows
    };
    let f16 = mha.qkv_elem_bytes() == 2;
    [(q_rows, b.qkv.q), (k_rows, b.qkv.k), (v_rows, b.qkv.v)]
        .into_iter()
        .map(|(rows, x)| clamp::dispatch(&mha.gpu, limit, f16, rows, x))
        .collect()
}

/// The q and k norms (none without them).
pub(crate) fn norms(mha: &MultiHeadAttention, g: &Geometry, b: &Bound) -> Result<Vec<Dispatch>> {
    let (Some(norm), Some(weights)) = (&mha.config.qk_norm, &mha.weights.qk_norm) else {
        return Ok(Vec::new());
    };
    let [q_rows, k_rows] = new_rows(mha, g, b);
    let f16 = mha.qkv_elem_bytes() == 2;
    let [(wq, nq, bq), (wk, nk, bk)] = weights;
    Ok(vec![
        qk_norm::dispatch(&mha.gpu, norm, f16, q_rows, b.qkv.q, (wq, *nq), bq.as_ref())?,
        qk_norm::dispatch(&mha.gpu, norm, f16, k_rows, b.qkv.k, (wk, *nk), bk.as_ref())?,
    ])
}

/// The rows position-wise passes touch: Q rows `0..lq`, and K rows `kv_pos..` of the new keys.
pub(crate) fn new_rows(mha: &MultiHeadAttention, g: &Geometry, b: &Bound) -> [RopeRows; 2] {
    let c = &mha.config;
    let l = g.layout;
    let q_rows = RopeRows {
        batch: g.batch,
        heads: c.heads,
        n: g.lq,
        stride: g.lq,
        first: 0,
        head_dim: c.qk_head_dim,
        offset: l.q_offset,
    };
    let k_rows = RopeRows {
        heads: c.kv_heads,
        n: g.lk - g.kv_pos - g.appended,
        stride: l.kv_stride as usize,
        first: new_kv_row(g, b),
        offset: l.k_offset,
        ..q_rows
    };
    [q_rows, k_rows]
}

/// The two RoPE dispatches, over [`new_rows`].
pub(crate) fn rotations(
    mha: &MultiHeadAttention,
    rope: &crate::model::rope::Rope,
    g: &Geometry,
    b: &Bound,
    tables: RopeTables,
) -> Result<Vec<Dispatch>> {
    let f16 = mha.qkv_elem_bytes() == 2;
    let [q_rows, k_rows] = new_rows(mha, g, b);
    Ok(vec![
        rope::dispatch(&mha.gpu, rope, f16, q_rows, b.qkv.q, tables.q)?,
        rope::dispatch(&mha.gpu, rope, f16, k_rows, b.qkv.k, tables.k)?,
    ])
}
