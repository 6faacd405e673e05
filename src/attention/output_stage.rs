//! The passes after the attention core: BitNet's output norm and Qwen3-Next's output gate on
//! the combined heads, then `W_o` — shared by every path (a module's chain, a KV cache's
//! steps, a paged step).

use super::chain_buffers::{Bound, Geometry};
use super::MultiHeadAttention;
use crate::error::Result;
use crate::gpu::pass::Dispatch;
use crate::kernels::linear::{self, LinearBuffers, LinearParams, Segment};
use crate::kernels::rope::RopeRows;
use crate::kernels::{output_gate, qk_norm};
use crate::model::qk_norm::{NormKind, NormScope, QkNorm};

/// output = W_o(combined) into `b.output`, `out_rows` rows per sequence, when the module has
/// an output projection (nothing otherwise).
pub(crate) fn output_projection(
    mha: &MultiHeadAttention,
    g: &Geometry,
    b: &Bound,
    out_rows: usize,
) -> Result<Vec<Dispatch>> {
    let c = &mha.config;
    let gpu = &mha.gpu;
    let mut chain = Vec::new();
    if let (Some(eps), Some(w)) = (c.output_norm, &mha.weights.output_norm) {
        // combined = rms_norm(combined) · w: each token's H·dv values (BitNet's attn_sub_norm)
        let norm = QkNorm {
            kind: NormKind::Rms,
            scope: NormScope::PerHead,
            eps,
            weight_offset: 0.0,
            after_rope: false,
        };
        let rows = RopeRows {
            batch: g.batch,
            heads: 1,
            n: g.lq,
            stride: g.lq,
            first: 0,
            head_dim: c.v_width(),
            offset: 0,
        };
        let weight = (w, c.v_width());
        chain.push(qk_norm::dispatch(
            gpu, &norm, false, rows, b.combined, weight, None,
        )?);
    }
    if let (Some((w_g, b_g)), Some(gate)) = (&mha.weights.gate, b.gate) {
        // combined ·= sigmoid(W_g(query)): the gate of each query row, then the product
        let seg = Segment {
            heads: 1,
            head_dim: c.v_width() as u32,
            dst: 0,
        };
        let mut p = LinearParams::new(rows_of(g), c.model_dim as u32, g.lq as u32, &[seg])
            .weights_at(0, 0, b_g.is_some());
        p.x_offset = b.at.inputs[0];
        let buffers = LinearBuffers {
            x: b.query,
            w: w_g,
            bias: b_g.as_ref(),
            y: gate,
        };
        chain.extend(linear::dispatch(gpu, mha.linear_elems(false), None, &p, buffers)?.0);
        let elements = g.batch * g.lq * c.v_width();
        chain.push(output_gate::dispatch(gpu, elements, b.combined, gate)?);
    }
    if let (Some((w_o, b_o)), Some(output)) = (&mha.weights.w_o, b.output) {
        let rows = rows_of(g);
        let seg = Segment {
            heads: 1,
            head_dim: c.model_dim as u32,
            dst: b.at.out_offset,
        };
        let p = LinearParams::new(rows, c.v_width() as u32, g.lq as u32, &[seg])
            .weights_at(0, 0, b_o.is_some())
            .appending(out_rows as u32, 0);
        let buffers = LinearBuffers {
            x: b.combined,
            w: w_o,
            bias: b_o.as_ref(),
            y: output,
        };
        chain.extend(linear::dispatch(gpu, mha.linear_elems(false), None, &p, buffers)?.0);
    }
    Ok(chain)
}

fn rows_of(g: &Geometry) -> u32 {
    (g.batch * g.lq) as u32
}
