//! A KV cache's step buffers — everything a step writes besides the cached keys and values —
//! sized for the longest step so far, and the bytes a cache holds ([`KvCacheBytes`]).

use crate::attention::MultiHeadAttention;
use crate::kernels::decode::{partials_for, MAX_ROWS};
use crate::kernels::flash_attention::{carry_buffer, carry_stride};

/// What one step writes besides the cache, for steps of up to `tokens` new tokens: allocated
/// for a few tokens and grown (doubling, up to `max_step`) when a longer step comes, so that a
/// long cache does not hold buffers for a step as long as itself (a 32k-token cache used to
/// allocate about 3.5 times its keys and values).
pub(crate) struct StepBuffers {
    pub(crate) tokens: usize,
    /// The new queries `[B, H, n, dk]`; in a chunked cache the scratch `[Q | K | V]` of the new
    /// tokens, whose keys and values are then appended to the chunks.
    pub(crate) qkv: wgpu::Buffer,
    /// New tokens' query input `[B, n, model_dim]` and, for cross steps, key/value input.
    pub(crate) x_q: wgpu::Buffer,
    pub(crate) x_kv: wgpu::Buffer,
    pub(crate) combined: wgpu::Buffer,
    /// The output gate's values (a module with `output_gate`).
    pub(crate) gate: Option<wgpu::Buffer>,
    pub(crate) output: Option<wgpu::Buffer>,
    pub(crate) staging: wgpu::Buffer,
    /// The fused passes' state for a step of `tokens` over the whole capacity.
    pub(crate) carry: wgpu::Buffer,
    /// cos/sin of the new tokens' positions, for a module with RoPE: new queries and keys are
    /// rotated before attention, so the cache holds rotated keys.
    pub(crate) rope: Option<wgpu::Buffer>,
}

/// The bytes a cache holds on the device ([`KvCache::bytes`](crate::KvCache::bytes)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheBytes {
    /// Keys and values at the full capacity (in chunks or not).
    pub keys_values: u64,
    /// Everything a step writes besides them, at the largest step so far.
    pub step: u64,
    /// A multi-pass cache's `[B, H, C, C]` scores.
    pub scores: u64,
    /// Bytes of keys and values one token of one sequence takes (`keys_values` is this times
    /// batch times the capacity, rounded up to whole chunks): per key/value head `dk + dv`
    /// elements, or only the keys where values are read from them (MLA's latent cache:
    /// `qk_rope_head_dim + kv_lora_rank`).
    pub per_token: u64,
}

impl KvCacheBytes {
    /// All of it: `keys_values + step + scores`.
    pub fn total(&self) -> u64 {
        self.keys_values + self.step + self.scores
    }
}

/// Tokens a new cache's step buffers hold before a longer step grows them: a decode step and
/// a short prompt, without a reallocation.
pub(crate) const FIRST_STEP_TOKENS: usize = 64;

/// Floats of fused-pass state a step of up to `tokens` new tokens over up to `capacity` keys
/// needs: the decode pass's partials for its small steps, the flash pass's carry per token.
pub(crate) fn carry_len(
    mha: &MultiHeadAttention,
    b: usize,
    cap: usize,
    tokens: usize,
    fused: bool,
) -> usize {
    if !fused {
        return 0;
    }
    let c = &mha.config;
    let (h, dk, dv) = (c.heads, c.qk_head_dim, c.v_head_dim);
    let decode = (1..=tokens.min(MAX_ROWS))
        .filter(|&n| mha.decodes(n))
        .map(|n| partials_for(&mha.gpu, c.kv_group(), n, b * h * n, cap, dk, dv))
        .max()
        .unwrap_or(0);
    let per_token = b * h * carry_stride(dv);
    let fits = (mha.gpu.binding_limit() / 4) as usize / per_token;
    decode.max(per_token * tokens.min(fits))
}

impl StepBuffers {
    pub(crate) fn new(
        mha: &MultiHeadAttention,
        b: usize,
        cap: usize,
        tokens: usize,
        fused: bool,
        chunked: bool,
    ) -> Self {
        let c = &mha.config;
        let gpu = &mha.gpu;
        let (h, dk, dv, t) = (c.heads, c.qk_head_dim, c.v_head_dim, tokens);
        let elem = mha.qkv_elem_bytes();
        let none = wgpu::BufferUsages::empty();
        let copy = wgpu::BufferUsages::COPY_SRC;
        let f32s = |elems: usize| 4 * elems as u64;
        let qkv = match chunked {
            false => gpu.storage("step queries", elem * (b * h * t * dk) as u64, none),
            true => {
                let rows = b * (h * dk + c.kv_heads * (dk + dv)) * t;
                gpu.storage("step scratch Q|K|V", elem * rows as u64, none)
            }
        };
        StepBuffers {
            tokens,
            qkv,
            x_q: gpu.storage("step query input", f32s(b * t * c.model_dim), none),
            x_kv: gpu.storage("step key/value input", f32s(b * t * c.key_dim), none),
            combined: gpu.storage("step combined heads", f32s(b * t * c.v_width()), copy),
            gate: c
                .output_gate
                .then(|| gpu.storage("step output gate", f32s(b * t * c.v_width()), none)),
            output: c
                .output_projection
                .then(|| gpu.storage("step output", f32s(b * t * c.output_dim()), copy)),
            staging: gpu.staging("step readback", f32s(b * t * c.output_dim())),
            carry: carry_buffer(
                gpu,
                "step carry",
                carry_len(mha, b, cap, t, fused),
                mha.weights.sink_logits.as_deref(),
                none,
            ),
            rope: c
                .rope
                .map(|r| gpu.storage("step RoPE table", f32s(b * t * r.rotary_dims), none)),
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        [
            &self.qkv,
            &self.x_q,
            &self.x_kv,
            &self.combined,
            &self.staging,
            &self.carry,
        ]
        .into_iter()
        .chain(self.output.as_ref())
        .chain(self.gate.as_ref())
        .chain(self.rope.as_ref())
        .map(wgpu::Buffer::size)
        .sum()
    }
}
