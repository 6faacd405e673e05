//! The dispatch chain of a forward ([`dispatches`], the seeds' `forward` one pass per line)
//! and the buffers of one problem shape ([`Workspace`]), reused across calls. The KV cache
//! builds its steps with the same [`dispatches`] over its own buffers.

use crate::error::Result;
use crate::gpu::pass::Dispatch;
use crate::kernels::decode;
use crate::kernels::kv_append::{self, NewRows};
use crate::kernels::linear::{self, LinearBuffers, LinearElems, LinearParams, Segment};
use crate::kernels::mask::{MaskBuffers, MaskParams};
use crate::kernels::{
    av_combine, flash_attention, scores, softmax, CoreDims, CoreProblem, KvChunks, QkvBuffers,
    QkvLayout, RowStrides,
};

use super::appended_kv::appended_kv_images;
use super::chain_buffers::{new_kv_row, Bound, ChainIo, Geometry, Placement, RopeTables};
pub(crate) use super::output_stage::output_projection;
use super::plan::{qkv_layout, Shape, Sharing};
use super::row_passes;
use super::{MultiHeadAttention, Precision};

/// The seeds' `forward`, one dispatch per step.
pub(crate) fn dispatches(
    mha: &MultiHeadAttention,
    g: &Geometry,
    b: &Bound,
) -> Result<Vec<Dispatch>> {
    let c = &mha.config;
    let gpu = &mha.gpu;
    let (h, dk, dv) = (c.heads, c.qk_head_dim, c.v_head_dim);
    let mut chain = front(mha, g, b)?;

    // cache.append(K, V): into a chunked KV cache, from the scratch they were projected to
    let mut layout = g.layout;
    if let Some(chunks) = b.chunks {
        chain.extend(appends(mha, g, b, &chunks)?);
        layout = QkvLayout {
            k_offset: 0,
            v_offset: 0,
            kv_stride: chunks.keys as u32,
            ..layout
        };
    }

    let dims = CoreDims {
        batch: g.batch,
        heads: h,
        lq: g.lq,
        lk: g.lk,
        qk_head_dim: dk,
        v_head_dim: dv,
    };
    let mut core = CoreProblem::head_split(dims, c.scale(), layout);
    // A quantized cache's chunks: the attention passes read its blocks.
    if let Some(chunks) = b.chunks {
        core.layout.kv = chunks.format;
    }
    let out_rows = match b.at.out_rows {
        0 => g.lq,
        rows => rows as usize,
    };
    if b.output.is_none() || mha.weights.w_o.is_none() {
        // No output projection: the core writes the module's result, where it is placed.
        core.layout.out = RowStrides::sequence_major(b.at.out_offset, h, out_rows, dv);
    }
    match (&mha.flash, b.scores) {
        (Some(_), _) if g.fused && mha.decodes(g.lq) => {
            // combined = combine_heads(softmax(mask(Q·Kᵀ·scale))·V) for a few query rows: key
            // ranges in parallel, each read once per key/value head, then their reduce
            let buffers = decode::DecodeBuffers {
                qkv: b.qkv,
                partials: b.carry,
                out: b.combined,
                mask: b.mask,
                chunks: b.chunks,
                sinks: (&mha.weights.sinks, c.sinks),
            };
            let f16 = mha.qkv_elem_bytes() == 2;
            chain.extend(decode::dispatches(gpu, &core, f16, &buffers)?);
        }
        (Some(flash), _) if g.fused => {
            // combined = combine_heads(softmax(mask(Q·Kᵀ·scale))·V), without a scores buffer
            // (one dispatch per key range when long key ranges are split)
            let buffers = flash_attention::FlashBuffers {
                qkv: b.qkv,
                out: b.combined,
                carry: b.carry,
                mask: b.mask,
                chunks: b.chunks,
                sinks: c.sinks,
            };
            chain.extend(flash.dispatches(gpu, &core, &buffers)?);
        }
        (_, Some(scores_buf)) if !g.fused && b.chunks.is_none() => {
            // scores = mask(Q·Kᵀ·scale)
            let buffers = scores::ScoresBuffers {
                qkv: b.qkv,
                scores: scores_buf,
                mask: b.mask,
            };
            chain.extend(scores::dispatches(gpu, &core, buffers)?);
            // probs = softmax(scores), in place
            let sinks = softmax::Sinks {
                logits: &mha.weights.sinks,
                on: c.sinks,
                heads: h,
                lq: g.lq,
            };
            chain.push(softmax::dispatch(
                gpu,
                g.batch * h * g.lq,
                g.lk,
                scores_buf,
                sinks,
            )?);
            // combined = combine_heads(probs · V)
            let buffers = av_combine::AvBuffers {
                probs: scores_buf,
                v: b.qkv.v,
                out: b.combined,
            };
            chain.extend(av_combine::dispatches(gpu, &core, buffers)?);
        }
        // The plan picks fused only with a flash pass, and allocates scores otherwise.
        _ => return Err(mha.no_fused_kernel()),
    }

    chain.extend(output_projection(mha, g, b, out_rows)?);
    Ok(chain)
}

/// The passes before the attention core: Q, K and V projected, clamped, normalised and
/// rotated, in the head-split layout of `g` (what a serving step reuses, see `crate::serve`).
pub(crate) fn front(mha: &MultiHeadAttention, g: &Geometry, b: &Bound) -> Result<Vec<Dispatch>> {
    let c = &mha.config;
    // Q, K, V = split_heads(W_q(query)), split_heads(W_k(key)), split_heads(W_v(value))
    let mut chain = projections(mha, g, b)?;

    // Q, K, V = clamp(Q), clamp(K), clamp(V): OLMo's clip_qkv, on the new rows
    chain.extend(row_passes::clamps(mha, g, b)?);

    // Q, K = q_norm(Q), k_norm(K): normalised in place (the new keys only), before RoPE or,
    // for a norm after it (Hunyuan), once they are rotated
    let after_rope = c.qk_norm.is_some_and(|n| n.after_rope);
    if !after_rope {
        chain.extend(row_passes::norms(mha, g, b)?);
    }

    // Q, K = rope(Q), rope(K): rotated by position in place (the new keys only: a KV cache
    // holds its keys rotated)
    if let (Some(rope), Some(tables)) = (&c.rope, b.rope) {
        chain.extend(row_passes::rotations(mha, rope, g, b, tables)?);
    }
    if after_rope {
        chain.extend(row_passes::norms(mha, g, b)?);
    }
    Ok(chain)
}

/// The projection GEMMs: one per distinct input, each writing its segments of Q | K | V.
/// W_k's and W_v's rows follow W_q's in the packed weights, so a fused projection is one GEMM
/// over consecutive rows. New keys go to rows `kv_pos..` of the K/V layout (a KV cache).
fn projections(mha: &MultiHeadAttention, g: &Geometry, b: &Bound) -> Result<Vec<Dispatch>> {
    let c = &mha.config;
    let w = &mha.weights;
    let (h, dk, dv) = (c.heads as u32, c.qk_head_dim as u32, c.v_head_dim as u32);
    let kv_h = c.kv_heads as u32;
    let l = g.layout;
    let (q_seg, k_seg, v_seg) = (
        Segment {
            heads: h,
            head_dim: dk,
            dst: l.q_offset,
        },
        Segment {
            heads: kv_h,
            head_dim: dk,
            dst: l.k_offset,
        },
        Segment {
            heads: kv_h,
            head_dim: dv,
            dst: l.v_offset,
        },
    );
    let plain_kv = g.kv_pos == 0 && g.appended == 0 && l.kv_stride as usize == g.lk;
    let new_keys = g.lk - g.kv_pos - g.appended;
    let [q_at, k_at, v_at] = b.at.inputs;
    // The same rows (buffer, offset, width, count) are one input, read by one GEMM.
    let sharing = Sharing::of(
        b.query == b.key && q_at == k_at && c.model_dim == c.key_dim && g.lq == new_keys,
        b.key == b.value && k_at == v_at && c.key_dim == c.value_dim,
    );
    // One GEMM may write several of Q, K, V only when they share a buffer.
    let packed = b.qkv.is_packed();
    let fused_qkv = packed && sharing == Sharing::SelfAttention && plain_kv && g.lq == g.lk;
    let has_bias = w.b_qkv.is_some();
    // (input and its offset, rows per sequence, input width, first weight row, first bias,
    // segments, output)
    type Gemm<'a> = (
        (&'a wgpu::Buffer, u32),
        usize,
        usize,
        u32,
        u32,
        Vec<Segment>,
        &'a wgpu::Buffer,
    );
    let query = (
        (b.query, q_at),
        g.lq,
        c.model_dim,
        0,
        0,
        vec![q_seg],
        b.qkv.q,
    );
    let key = (
        (b.key, k_at),
        new_keys,
        c.key_dim,
        w.w_k_offset,
        w.b_k_offset,
    );
    let gemms: Vec<Gemm> = if fused_qkv {
        vec![(
            (b.query, q_at),
            g.lq,
            c.model_dim,
            0,
            0,
            vec![q_seg, k_seg, v_seg],
            b.qkv.q,
        )]
    } else if b.qkv.k == b.qkv.v && sharing != Sharing::Distinct {
        // K and V in one buffer (a KV cache keeps its queries apart): one GEMM writes both.
        let (x, seq, width, w_off, b_off) = key;
        // Values read from the keys (a latent cache): the keys are all there is to write.
        let segments = match c.values_from_keys && l.v_offset == l.k_offset {
            true => vec![k_seg],
            false => vec![k_seg, v_seg],
        };
        vec![query, (x, seq, width, w_off, b_off, segments, b.qkv.k)]
    } else {
        let (x, seq, width, w_off, b_off) = key;
        vec![
            query,
            (x, seq, width, w_off, b_off, vec![k_seg], b.qkv.k),
            (
                (b.value, v_at),
                new_keys,
                c.value_dim,
                w.w_v_offset,
                w.b_v_offset,
                vec![v_seg],
                b.qkv.v,
            ),
        ]
    };
    gemms
        .into_iter()
        .enumerate()
        // No input keys (only appended ones): nothing to project.
        .filter(|(_, (_, seq, ..))| *seq > 0)
        .map(
            |(i, ((x, x_offset), seq, width, w_offset, bias_offset, segments, y))| {
                let rows = (g.batch * seq) as u32;
                let mut p = LinearParams::new(rows, width as u32, seq as u32, &segments)
                    .weights_at(w_offset, bias_offset, has_bias);
                p.x_offset = x_offset;
                // Every GEMM but the query one writes keys and values.
                if i > 0 || fused_qkv {
                    p = p.appending(l.kv_stride, new_kv_row(g, b) as u32);
                }
                let buffers = LinearBuffers {
                    x,
                    w: &w.w_qkv,
                    bias: w.b_qkv.as_ref(),
                    y,
                };
                Ok(linear::dispatch(&mha.gpu, mha.linear_elems(true), None, &p, buffers)?.0)
            },
        )
        .collect::<Result<Vec<Vec<Dispatch>>>>()
        .map(|gemms| gemms.into_iter().flatten().collect())
}

/// The new keys and values, from the scratch rows `0..` into a chunked cache at `kv_pos`.
fn appends(
    mha: &MultiHeadAttention,
    g: &Geometry,
    b: &Bound,
    chunks: &KvChunks,
) -> Result<Vec<Dispatch>> {
    let c = &mha.config;
    let f16 = mha.qkv_elem_bytes() == 2;
    let l = g.layout;
    let keys = NewRows {
        scratch: b.qkv.k,
        offset: l.k_offset,
        stride: l.kv_stride as usize,
        blocks: g.batch * c.kv_heads,
        count: g.lk - g.kv_pos - g.appended,
        width: c.qk_head_dim,
        first: g.kv_pos,
    };
    let values = NewRows {
        scratch: b.qkv.v,
        offset: l.v_offset,
        width: c.v_head_dim,
        ..keys
    };
    let mut chain = kv_append::dispatches(&mha.gpu, f16, keys, chunks, true)?;
    // Values read from the keys (a latent cache): the rotated keys are the values.
    if !c.values_from_keys {
        chain.extend(kv_append::dispatches(&mha.gpu, f16, values, chunks, false)?);
    }
    Ok(chain)
}

impl MultiHeadAttention {
    /// Whether the fused path runs `lq` query rows per sequence with the decode pass (few
    /// rows: split over keys) instead of the flash pass.
    pub(crate) fn decodes(&self, lq: usize) -> bool {
        let c = &self.config;
        decode::serves(c.kv_group(), lq, c.qk_head_dim, c.v_head_dim)
    }

    /// Element types of this module's GEMMs: `to_qkv` for the projections into Q/K/V (f16 in
    /// an f16 module), else the output projection (f32 out).
    pub(super) fn linear_elems(&self, to_qkv: bool) -> LinearElems {
        match self.precision {
            Precision::F16 => LinearElems::F16Weights { f16_out: to_qkv },
            _ => LinearElems::F32,
        }
    }
}

/// Buffers and dispatches for one problem shape, reused across calls.
pub(crate) struct Workspace {
    pub shape: Shape,
    /// One buffer per distinct input tensor (see [`Sharing::inputs`]).
    pub inputs: Vec<wgpu::Buffer>,
    /// Q|K|V packed in one buffer, or Q, K and V each in its own when the packed one would
    /// exceed a storage binding (see [`split_qkv`]).
    qkv: Vec<wgpu::Buffer>,
    pub scores: Option<wgpu::Buffer>,
    combined: wgpu::Buffer,
    gate: Option<wgpu::Buffer>,
    output: Option<wgpu::Buffer>,
    carry: wgpu::Buffer,
    pub staging: wgpu::Buffer,
    mask: MaskBuffers,
    /// RoPE cos/sin tables of this shape's queries and keys (a module with RoPE).
    rope: Option<[wgpu::Buffer; 2]>,
    pub dispatches: Vec<Dispatch>,
}

impl Workspace {
    /// Allocates every buffer of `shape` (which `check_limits` accepted) and builds its chain.
    pub fn new(mha: &MultiHeadAttention, shape: Shape) -> Result<Self> {
        let c = &mha.config;
        let gpu = &mha.gpu;
        let (b, lq, lk, h) = (shape.batch, shape.lq, shape.lk, c.heads);
        let lk_in = shape.input_keys(c);
        let (dk, dv) = (c.qk_head_dim, c.v_head_dim);
        let none = wgpu::BufferUsages::empty();
        let copy = wgpu::BufferUsages::COPY_SRC;
        let widths = [
            ("query input", lq * c.model_dim),
            ("key input", lk_in * c.key_dim),
            ("value input", lk_in * c.value_dim),
        ];
        let inputs = widths[..shape.sharing.inputs()]
            .iter()
            .map(|(label, n)| gpu.storage(label, 4 * (b * n) as u64, none))
            .collect();
        let elem = mha.qkv_elem_bytes();
        let qkv_bytes = [h * lq * dk, c.kv_heads * lk * dk, c.kv_heads * lk * dv]
            .map(|n| elem * (b * n) as u64);
        let split = split_qkv(gpu.binding_limit(), qkv_bytes);
        let qkv = match appended_kv_images(mha, shape, split) {
            // The appended keys are input-independent: written once, here.
            Some(images) => images
                .iter()
                .map(|(label, image)| gpu.upload_f32_as(label, image, elem == 2))
                .collect(),
            None if !split => {
                vec![gpu.storage("Q|K|V head-split", qkv_bytes.iter().sum(), none)]
            }
            None => ["Q head-split", "K head-split", "V head-split"]
                .iter()
                .zip(qkv_bytes)
                .map(|(label, bytes)| gpu.storage(label, bytes, none))
                .collect(),
        };
        let out_len = b * lq * c.output_dim();
        let probs_len = if shape.probs { b * h * lq * lk } else { 0 };
        let carry_len = mha.carry_len(shape);
        let mut ws = Workspace {
            shape,
            inputs,
            qkv,
            scores: (!shape.fused)
                .then(|| gpu.storage("scores", 4 * (b * h * lq * lk) as u64, copy)),
            combined: gpu.storage("combined heads", 4 * (b * lq * c.v_width()) as u64, copy),
            gate: c
                .output_gate
                .then(|| gpu.storage("output gate", 4 * (b * lq * c.v_width()) as u64, none)),
            output: c
                .output_projection
                .then(|| gpu.storage("output", 4 * out_len as u64, copy)),
            carry: flash_attention::carry_buffer(
                gpu,
                "flash carry state",
                carry_len,
                mha.weights.sink_logits.as_deref(),
                none,
            ),
            staging: gpu.staging("readback", 4 * (out_len + probs_len) as u64),
            mask: MaskBuffers::new(gpu, 0),
            rope: c.rope.map(|r| {
                let table = |rows: usize| 4 * (b * rows * r.rotary_dims) as u64;
                [
                    gpu.storage("RoPE table (queries)", table(lq), none),
                    gpu.storage("RoPE table (keys)", table(lk_in), none),
                ]
            }),
            dispatches: Vec::new(),
        };
        ws.dispatches = ws.chain(mha)?;
        Ok(ws)
    }

    fn chain(&self, mha: &MultiHeadAttention) -> Result<Vec<Dispatch>> {
        self.chain_on(mha, None)
    }

    /// This shape's chain over the workspace's buffers, or — with `io` — reading its inputs
    /// from and writing its result to the given buffers at `io.at` (a caller's views, see
    /// `attention::views`); the workspace's Q/K/V, scores, carry, mask and tables either way.
    pub fn chain_on(
        &self,
        mha: &MultiHeadAttention,
        io: Option<&ChainIo>,
    ) -> Result<Vec<Dispatch>> {
        let s = self.shape;
        let qkv = match &self.qkv[..] {
            [q, k, v] => QkvBuffers { q, k, v },
            _ => QkvBuffers::packed(&self.qkv[0]),
        };
        let geometry = Geometry {
            batch: s.batch,
            lq: s.lq,
            lk: s.lk,
            kv_pos: 0,
            appended: mha.config.appended_keys(),
            layout: qkv_layout(mha, s, !qkv.is_packed()),
            fused: s.fused,
        };
        let input = |i: usize| &self.inputs[i.min(self.inputs.len() - 1)];
        let (key, value) = match s.sharing {
            Sharing::SelfAttention => (input(0), input(0)),
            Sharing::SharedKeyValue => (input(1), input(1)),
            Sharing::Distinct => (input(1), input(2)),
        };
        let [query, key, value] = match io {
            Some(io) => io.inputs,
            None => [input(0), key, value],
        };
        // The result is W_o's output, or the combined heads of a module without W_o.
        let (combined, output) = match (io, &self.output) {
            (Some(io), Some(_)) => (&self.combined, Some(io.output)),
            (Some(io), None) => (io.output, None),
            (None, output) => (&self.combined, output.as_ref()),
        };
        let bound = Bound {
            query,
            key,
            value,
            qkv,
            scores: self.scores.as_ref(),
            combined,
            gate: self.gate.as_ref(),
            output,
            carry: &self.carry,
            mask: &self.mask,
            chunks: None,
            rope: self.rope.as_ref().map(|[q, k]| RopeTables { q, k }),
            at: io.map_or(Placement::default(), |io| io.at),
        };
        dispatches(mha, &geometry, &bound)
    }

    /// Makes room for a mask of `words` words: a larger mask than the buffer holds gets a new
    /// buffer and the chain is rebuilt around it (a command recorded earlier keeps the old
    /// ones alive). Fallible, so it runs before anything of a call is recorded.
    pub fn fit_mask(&mut self, mha: &MultiHeadAttention, words: usize) -> Result<()> {
        if !self.mask.holds(words) {
            self.mask = MaskBuffers::new(&mha.gpu, words);
            self.dispatches = self.chain(mha)?;
        }
        Ok(())
    }

    /// Records the writes of this call's mask (which [`fit_mask`](Self::fit_mask) made room
    /// for) into `encoder`.
    pub fn write_mask(
        &self,
        mha: &MultiHeadAttention,
        encoder: &mut wgpu::CommandEncoder,
        words: &[u32],
        params: &MaskParams,
    ) {
        self.mask.write_in(&mha.gpu, encoder, words, params);
    }

    /// Records the writes of the RoPE tables of this call's chunk into `encoder`: queries at
    /// the positions of keys `lk − lq_whole + i0 ..` (the last `Lq` of the whole problem),
    /// keys at their own, for batches `b0..` (see `Plan::positions`).
    pub fn write_rope(
        &self,
        mha: &MultiHeadAttention,
        encoder: &mut wgpu::CommandEncoder,
        positions: &[usize],
        lq_whole: usize,
        (b0, i0): (usize, usize),
    ) {
        let (Some(rope), Some([q, k])) = (&mha.config.rope, &self.rope) else {
            return;
        };
        let s = self.shape;
        let lk_in = s.input_keys(&mha.config);
        let key_positions = |bi: usize| &positions[(b0 + bi) * lk_in..(b0 + bi + 1) * lk_in];
        let first_query = lk_in - lq_whole + i0;
        let q_pos: Vec<usize> = (0..s.batch)
            .flat_map(|bi| key_positions(bi)[first_query..first_query + s.lq].to_vec())
            .collect();
        let k_pos: Vec<usize> = (0..s.batch)
            .flat_map(|bi| key_positions(bi).to_vec())
            .collect();
        // dynamic / longrope: the frequencies of the whole call, not of this chunk.
        let seq_len = crate::model::rope::seq_len(positions);
        let gpu = &mha.gpu;
        gpu.write_in(
            encoder,
            q,
            0,
            bytemuck::cast_slice(&rope.table(&q_pos, seq_len)),
        );
        gpu.write_in(
            encoder,
            k,
            0,
            bytemuck::cast_slice(&rope.table(&k_pos, seq_len)),
        );
    }

    /// The buffer holding the module's output: `[B, Lq, output_dim]`.
    pub fn result(&self) -> &wgpu::Buffer {
        self.output.as_ref().unwrap_or(&self.combined)
    }

    /// GPU bytes this workspace holds.
    pub fn bytes(&self) -> u64 {
        let optional = [&self.scores, &self.output];
        self.inputs.iter().map(wgpu::Buffer::size).sum::<u64>()
            + optional
                .iter()
                .filter_map(|b| b.as_ref())
                .map(wgpu::Buffer::size)
                .sum::<u64>()
            + self.qkv.iter().map(wgpu::Buffer::size).sum::<u64>()
            + [&self.combined, &self.carry, &self.staging]
                .iter()
                .map(|b| b.size())
                .sum::<u64>()
    }
}

/// Whether Q, K and V (of `bytes` each) need a buffer each: when packed they would exceed one
/// storage binding (`limit`), though each alone fits (the plan checks that).
pub(crate) fn split_qkv(limit: u64, bytes: [u64; 3]) -> bool {
    bytes.iter().sum::<u64>() > limit
}

#[cfg(test)]
mod tests {
    use super::split_qkv;

    #[test]
    fn qkv_is_split_only_past_the_binding() {
        assert!(!split_qkv(300, [100, 100, 100]));
        assert!(split_qkv(299, [100, 100, 100]));
        assert!(!split_qkv(16, [0, 8, 8]));
    }
}
