//! What a [`Mask`] becomes for the shaders (`shaders/mask.wgsl`, prepended to `scores` and
//! `flash_attention`): a kind, strides over `(b, h, i, j)` and offsets in a uniform
//! (`MaskParams`, binding 7), and a word buffer (binding 6) holding keep bytes, key padding
//! lengths or f32 bias bits.

use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::source::Prelude;
use crate::model::config::AttentionConfig;
use crate::model::mask::{broadcast_strides, AttnDims, Mask, MASKED_SCORE};

/// The shared mask rule, prepended by the host.
pub const WGSL: &str = include_str!("../../shaders/mask.wgsl");

/// Binding of the mask words (`mask_words`) and of the mask uniform (`mask`).
pub const WORDS_BINDING: u32 = 6;
pub const PARAMS_BINDING: u32 = 7;

/// How the shader reads the mask; the values become the `MASK_*` constants of the prelude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MaskKind {
    None = 0,
    Causal = 1,
    KeyPadding = 2,
    Keep = 3,
    Bias = 4,
    SlidingWindow = 5,
    /// Causal or windowed, and a keep byte per (batch, key).
    CausalKeep = 6,
}

impl MaskKind {
    /// Every kind with its WGSL constant name.
    pub const ALL: [(MaskKind, &'static str); 7] = [
        (MaskKind::None, "MASK_NONE"),
        (MaskKind::Causal, "MASK_CAUSAL"),
        (MaskKind::KeyPadding, "MASK_KEY_PADDING"),
        (MaskKind::Keep, "MASK_KEEP"),
        (MaskKind::Bias, "MASK_BIAS"),
        (MaskKind::SlidingWindow, "MASK_SLIDING_WINDOW"),
        (MaskKind::CausalKeep, "MASK_CAUSAL_KEEP"),
    ];
}

/// The mask constants every mask-reading shader gets in its prelude.
pub fn prelude(p: Prelude) -> Prelude {
    MaskKind::ALL
        .iter()
        .fold(p.f32("MASKED_SCORE", MASKED_SCORE), |p, &(kind, name)| {
            p.u32(name, kind as u32)
        })
}

/// Mirrors `MaskParams` in `mask.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MaskParams {
    pub kind: u32,
    /// `Lk − Lq` of the whole problem, shifted by a query block's first row.
    pub causal_offset: i32,
    /// Element offset of a chunk's `(b = 0, i = 0)` in the mask.
    pub base: u32,
    /// First batch of a chunk (key padding lengths).
    pub batch_base: u32,
    /// Element strides over `(b, h, i, j)`; 0 where broadcast.
    pub strides: [u32; 4],
    /// Keys a query sees under [`Mask::SlidingWindow`], itself included.
    pub window: u32,
    /// Logit soft-cap `c` (scores become `c · tanh(s / c)` before the mask); 0 = none. It
    /// rides in the mask's uniform because every path applies the two at the same point.
    pub softcap: f32,
    /// ALiBi's `max_bias`, and the number of query heads its slopes are spread over (0 = no
    /// ALiBi).
    pub alibi_max_bias: f32,
    pub alibi_heads: u32,
    /// [`Mask::Chunked`]'s chunk on a causal kind (0 = none): a query at position `p` sees only
    /// the keys `j` with `j / chunk == p / chunk`.
    pub chunk: u32,
    /// Llama 4's temperature tuning (see [`AttentionConfig::temperature`]): the scaled score of
    /// a query at position `p` is multiplied by `ln(1 + floor((p + 1) / floor_scale)) ·
    /// attn_scale + 1`; floor_scale 0 = none.
    pub temp_floor_scale: f32,
    pub temp_attn_scale: f32,
    pub _pad: u32,
}

/// A mask lowered for one problem: its uniform and its words.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedMask {
    pub params: MaskParams,
    pub words: Vec<u32>,
    /// The problem it was encoded for.
    pub dims: AttnDims,
}

impl EncodedMask {
    /// Checks `mask` against `dims` and lowers it.
    pub fn new(mask: &Mask, dims: AttnDims) -> Result<Self> {
        mask.check(dims)?;
        let causal_offset =
            (dims.lk as i64 - dims.lq as i64).clamp(i32::MIN as i64, i32::MAX as i64);
        let mut params = MaskParams {
            causal_offset: causal_offset as i32,
            ..MaskParams::default()
        };
        let (kind, words) = match mask {
            Mask::None => (MaskKind::None, Vec::new()),
            Mask::Causal => (MaskKind::Causal, Vec::new()),
            Mask::SlidingWindow(w) => {
                // The shaders compare in i32, so a long window is passed shortened to one that
                // hides the same keys (a window of 2^31 or usize::MAX would wrap negative). A
                // query's diagonal lies at most at key max(Lq, Lk) − 1 under either alignment
                // (Lk − 1 bottom-right; Lq − 1 top-left, past the keys when Lq > Lk), so a
                // window of max(Lq, Lk) keys or more hides nothing: Lk alone is too short
                // top-left, where query i ≥ Lk + w − 1 sees no key at all.
                params.window = (*w).min(no_window(dims)) as u32;
                (MaskKind::SlidingWindow, Vec::new())
            }
            Mask::KeyPadding(lengths) => {
                params.strides = [1, 0, 0, 0];
                (
                    MaskKind::KeyPadding,
                    lengths.iter().map(|&l| l as u32).collect(),
                )
            }
            Mask::Attend(t) | Mask::Block(t) => {
                let attend = matches!(mask, Mask::Attend(_));
                params.strides = broadcast_strides("mask", t.shape(), dims)?;
                // One keep-byte per element, four to a u32 word (little-endian).
                let keep = t.data().iter().map(|&v| ((v != 0) == attend) as u8);
                (MaskKind::Keep, pack_bytes(keep, t.data().len()))
            }
            Mask::CausalKeep { window, keep } => {
                // Keep bytes over (b, j) only; window 0 stands for plain causal, and so does a
                // window of max(Lq, Lk) keys or more (the same mask under either alignment, as
                // for SlidingWindow; the shaders compare in i32, and the fused pass's
                // padded-row check then stops at the first real key).
                params.strides = [dims.lk as u32, 0, 0, 1];
                params.window = match window {
                    Some(w) if *w < no_window(dims) => *w as u32,
                    _ => 0,
                };
                let bytes = keep.data().iter().map(|&v| (v != 0) as u8);
                (MaskKind::CausalKeep, pack_bytes(bytes, keep.data().len()))
            }
            Mask::Chunked { chunk, keep } => {
                // Positions run below max(Lq, Lk): a chunk that long holds them all (plain
                // causal), and a shorter one fits the shaders' i32.
                params.chunk = match *chunk < no_window(dims) {
                    true => *chunk as u32,
                    false => 0,
                };
                match keep {
                    None => (MaskKind::Causal, Vec::new()),
                    Some(keep) => {
                        params.strides = [dims.lk as u32, 0, 0, 1];
                        let bytes = keep.data().iter().map(|&v| (v != 0) as u8);
                        (MaskKind::CausalKeep, pack_bytes(bytes, keep.data().len()))
                    }
                }
            }
            Mask::Bias(t) => {
                params.strides = broadcast_strides("bias mask", t.shape(), dims)?;
                let bits = t.data().iter().map(|v| v.to_bits()).collect();
                (MaskKind::Bias, bits)
            }
        };
        params.kind = kind as u32;
        Ok(EncodedMask {
            params,
            words,
            dims,
        })
    }

    /// With the module's logit soft-cap and ALiBi (see [`AttentionConfig::softcap`] and
    /// [`AttentionConfig::alibi`]): score terms every path applies where it applies the mask.
    pub fn with_score_terms(mut self, config: &AttentionConfig) -> Self {
        self.params.softcap = config.softcap.unwrap_or(0.0);
        if let Some(max_bias) = config.alibi {
            self.params.alibi_max_bias = max_bias;
            self.params.alibi_heads = config.heads as u32;
        }
        if let Some(t) = config.temperature {
            self.params.temp_floor_scale = t.floor_scale;
            self.params.temp_attn_scale = t.attn_scale;
        }
        self
    }

    pub fn kind(&self) -> u32 {
        self.params.kind
    }

    /// The part of the mask a chunk of `nb` batches from `b0` and `nq` queries from `i0` reads:
    /// its uniform (offsets relative to the window) and the range of words it needs. Only that
    /// window is uploaded, so a mask larger than one storage binding runs in chunks like the
    /// inputs. Causal visibility keeps the whole problem's `i` and `Lq`.
    pub fn window(&self, (b0, nb): (usize, usize), (i0, nq): (usize, usize)) -> MaskWindow {
        let p = self.params;
        let mut params = MaskParams {
            causal_offset: p.causal_offset.saturating_add(i0 as i32),
            ..p
        };
        let words = match self.kind() {
            k if k == MaskKind::KeyPadding as u32 => b0..b0 + nb,
            k if k == MaskKind::Keep as u32
                || k == MaskKind::Bias as u32
                || k == MaskKind::CausalKeep as u32 =>
            {
                let first = b0 as u64 * p.strides[0] as u64 + i0 as u64 * p.strides[2] as u64;
                let last = first + self.span(nb, nq) - 1;
                // Keep bytes are four to a word; bias values one.
                let per_word = if k == MaskKind::Bias as u32 { 1 } else { 4 };
                params.base = (first % per_word) as u32;
                (first / per_word) as usize..(last / per_word) as usize + 1
            }
            _ => 0..0,
        };
        MaskWindow { params, words }
    }

    /// Most words any window of `nb` batches and `nq` queries needs (see [`window`](Self::window)).
    pub fn window_len(&self, nb: usize, nq: usize) -> usize {
        match self.kind() {
            k if k == MaskKind::KeyPadding as u32 => nb,
            k if k == MaskKind::Keep as u32 || k == MaskKind::CausalKeep as u32 => {
                (self.span(nb, nq) / 4) as usize + 2
            }
            k if k == MaskKind::Bias as u32 => self.span(nb, nq) as usize,
            _ => 0,
        }
    }

    /// Elements from a window's first to its last, plus one.
    fn span(&self, nb: usize, nq: usize) -> u64 {
        let s = self.params.strides.map(u64::from);
        let d = self.dims;
        let last = |n: usize| n.saturating_sub(1) as u64;
        last(nb) * s[0] + last(d.heads) * s[1] + last(nq) * s[2] + last(d.lk) * s[3] + 1
    }
}

/// The part of a mask one chunk reads: its uniform and a range of [`EncodedMask::words`].
#[derive(Debug, Clone, PartialEq)]
pub struct MaskWindow {
    pub params: MaskParams,
    pub words: std::ops::Range<usize>,
}

/// A mask on the device: its words and its uniform, bound at 6 and 7 by every pass that
/// reads it. The words buffer grows when a larger mask comes.
#[derive(Debug)]
pub struct MaskBuffers {
    pub words: wgpu::Buffer,
    pub params: wgpu::Buffer,
}

impl MaskBuffers {
    pub fn new(gpu: &Gpu, words: usize) -> Self {
        MaskBuffers {
            words: gpu.storage("mask words", 4 * words as u64, wgpu::BufferUsages::empty()),
            params: gpu.uniform("mask params", &MaskParams::default()),
        }
    }

    /// Buffers holding `words` and `params` from the start: a call's own, which no later
    /// write changes (what a call recorded into a caller's encoder needs).
    pub fn with_contents(gpu: &Gpu, words: &[u32], params: &MaskParams) -> Self {
        MaskBuffers {
            words: gpu.upload("mask words", words, wgpu::BufferUsages::empty()),
            params: gpu.uniform("mask params", params),
        }
    }

    /// Whether `words` fit the current words buffer (else the caller rebuilds its bindings
    /// around a new, larger `MaskBuffers`).
    pub fn holds(&self, words: usize) -> bool {
        4 * words as u64 <= self.words.size()
    }

    /// Writes the words (when there are any) and the uniform through the queue: they land at
    /// the next submit, before every command buffer in it, so only for buffers no other call
    /// recorded into a pending encoder shares (the standalone kernels' own); a recording path
    /// uses [`write_in`](Self::write_in).
    pub fn write(&self, queue: &wgpu::Queue, words: &[u32], params: &MaskParams) {
        if !words.is_empty() {
            queue.write_buffer(&self.words, 0, bytemuck::cast_slice(words));
        }
        queue.write_buffer(&self.params, 0, bytemuck::bytes_of(params));
    }

    /// [`write`](Self::write) as commands of `encoder` (see [`crate::gpu::record`]): what the
    /// passes recorded after it, and before the next call's write, read.
    pub fn write_in(
        &self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        words: &[u32],
        params: &MaskParams,
    ) {
        gpu.write_in(encoder, &self.words, 0, bytemuck::cast_slice(words));
        gpu.write_in(encoder, &self.params, 0, bytemuck::bytes_of(params));
    }

    /// The two `(binding, buffer)` pairs of a mask-reading pass.
    pub fn bindings(&self) -> [(u32, &wgpu::Buffer); 2] {
        [(WORDS_BINDING, &self.words), (PARAMS_BINDING, &self.params)]
    }
}

/// The shortest window that hides nothing behind any query's diagonal, under either causal
/// alignment: max(Lq, Lk) (at least 1), at most `i32::MAX` (the shaders compare in i32).
fn no_window(dims: AttnDims) -> usize {
    dims.lq.max(dims.lk).clamp(1, i32::MAX as usize)
}

fn pack_bytes(bytes: impl Iterator<Item = u8>, len: usize) -> Vec<u32> {
    let mut words = vec![0u32; len.div_ceil(4)];
    for (i, b) in bytes.enumerate() {
        words[i / 4] |= (b as u32) << ((i % 4) * 8);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mask::MaskTensor;

    fn dims(batch: usize, lq: usize, lk: usize) -> AttnDims {
        AttnDims {
            batch,
            heads: 2,
            lq,
            lk,
        }
    }

    #[test]
    fn windows_hold_exactly_the_words_a_chunk_reads() {
        // Keep bytes [2, 3, 5] (b, i, j): strides (15, 0, 5, 1).
        let keep: Vec<u8> = (0..2 * 3 * 5).map(|e| (e % 3 != 0) as u8).collect();
        let mask = Mask::Attend(MaskTensor::new([2, 3, 5], keep).unwrap());
        let m = EncodedMask::new(&mask, dims(2, 3, 5)).unwrap();
        assert_eq!(m.params.strides, [15, 0, 5, 1]);
        let whole = m.window((0, 2), (0, 3));
        assert_eq!(
            (whole.params.base, whole.words.clone()),
            (0, 0..m.words.len())
        );
        // Batch 1, queries 2..3: elements 25..30, words 6..8, starting at byte 1 of word 6.
        let w = m.window((1, 1), (2, 1));
        assert_eq!((w.params.base, w.words.clone()), (1, 6..8));
        assert_eq!(w.params.causal_offset, 2 + 2);
        assert!(w.words.len() <= m.window_len(1, 1));
        // One bias value per word.
        let bias = Mask::Bias(crate::Tensor::random([3, 5], 1));
        let b = EncodedMask::new(&bias, dims(2, 3, 5)).unwrap();
        let w = b.window((1, 1), (1, 2));
        assert_eq!((w.params.base, w.words.clone()), (0, 5..15));
        assert_eq!(b.window_len(1, 2), 10);
        // Key padding: one length per batch of the chunk.
        let pad = EncodedMask::new(&Mask::KeyPadding(vec![5, 4]), dims(2, 3, 5)).unwrap();
        let w = pad.window((1, 1), (0, 3));
        assert_eq!((w.params.batch_base, w.words.clone()), (0, 1..2));
    }

    #[test]
    fn causal_offset_is_bottom_right_and_moves_with_the_query_block() {
        let m = EncodedMask::new(&Mask::Causal, dims(1, 3, 8)).unwrap();
        assert_eq!(m.params.causal_offset, 5);
        assert_eq!(m.window((0, 1), (1, 2)).params.causal_offset, 6);
        assert!(m.words.is_empty() && m.window((0, 1), (1, 2)).words.is_empty());
    }

    #[test]
    fn keep_bytes_follow_polarity() {
        let t = MaskTensor::new([5], vec![1, 0, 1, 1, 0]).unwrap();
        let attend = EncodedMask::new(&Mask::Attend(t.clone()), dims(1, 1, 5)).unwrap();
        let block = EncodedMask::new(&Mask::Block(t), dims(1, 1, 5)).unwrap();
        // Little-endian keep bytes, four to a word.
        assert_eq!(attend.words, vec![0x0101_0001, 0x0000_0000]);
        assert_eq!(block.words, vec![0x0000_0100, 0x0000_0001]);
    }

    #[test]
    fn a_padded_causal_window_of_lk_keys_or_more_is_plain_causal() {
        let keep = MaskTensor::new([2, 5], vec![0, 1, 1, 1, 1, 1, 1, 1, 0, 0]).unwrap();
        let window = |w| {
            let m = Mask::causal_with_padding(w, &keep);
            EncodedMask::new(&m, dims(2, 3, 5)).unwrap().params.window
        };
        // 0 stands for plain causal in the shader: Lk keys back or more is the same mask.
        assert_eq!(window(None), 0);
        assert_eq!(window(Some(4)), 4);
        for w in [5, 1 << 31, (1 << 32) + 4, usize::MAX] {
            assert_eq!(window(Some(w)), 0, "window {w}");
        }
        // With more queries than keys, a window past Lk still hides keys from the queries a
        // top-left diagonal puts past the last key: only max(Lq, Lk) keys or more is none.
        let wide = |m: &Mask| EncodedMask::new(m, dims(1, 9, 4)).unwrap().params.window;
        assert_eq!(wide(&Mask::SlidingWindow(6)), 6);
        assert_eq!(wide(&Mask::SlidingWindow(usize::MAX)), 9);
        let keep4 = MaskTensor::new([1, 4], vec![1; 4]).unwrap();
        assert_eq!(wide(&Mask::causal_with_padding(Some(6), &keep4)), 6);
        assert_eq!(wide(&Mask::causal_with_padding(Some(9), &keep4)), 0);
        // One keep byte per (b, j), shared by every head and query.
        let m = EncodedMask::new(&Mask::causal_with_padding(None, &keep), dims(2, 3, 5)).unwrap();
        assert_eq!(m.params.strides, [5, 0, 0, 1]);
        assert_eq!(m.words, vec![0x0101_0100, 0x0101_0101, 0]);
        // A keep mask of another shape is an error.
        let short = Mask::causal_with_padding(None, &MaskTensor::new([2, 4], vec![1; 8]).unwrap());
        assert!(EncodedMask::new(&short, dims(2, 3, 5)).is_err());
    }

    #[test]
    fn key_padding_is_checked_against_the_batch_and_lk() {
        assert!(EncodedMask::new(&Mask::KeyPadding(vec![5, 4]), dims(2, 1, 5)).is_ok());
        assert!(EncodedMask::new(&Mask::KeyPadding(vec![6, 4]), dims(2, 1, 5)).is_err());
        assert!(EncodedMask::new(&Mask::KeyPadding(vec![5]), dims(2, 1, 5)).is_err());
    }
}
