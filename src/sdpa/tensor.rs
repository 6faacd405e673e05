//! [`DeviceTensor`]: a `[B, H, L, D]` view into a caller's buffer, and the checks of one.

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::kernels::RowStrides;

use super::misuse;

/// How a `[B, H, L, D]` tensor's elements lie in memory (D always innermost, contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[B, H, L, D]`: PyTorch's `scaled_dot_product_attention` layout, and a head-split KV
    /// cache's.
    Bhld,
    /// `[B, L, H, D]`: what a projection `[B, L, H·D]` writes, read without a copy.
    Blhd,
}

/// Element type of a device tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Elem {
    /// 32-bit float (the default).
    #[default]
    F32,
    /// Needs the device's `SHADER_F16`; q, k and v only (the output is f32), fused path only.
    F16,
    /// llama.cpp's q8_0 blocks in the device's planes (see [`crate::kv_dtype`]): k and v only,
    /// fused path only; the tensor's [`scales`](DeviceTensor::scales) says where its scales lie.
    Q8_0,
    /// llama.cpp's q4_0 blocks, as [`Elem::Q8_0`].
    Q4_0,
}

impl Elem {
    /// Bytes per element of a float type; a quantized one's quants (its scales aside) take
    /// less than a byte, see [`crate::KvDtype::bytes_for`].
    pub fn bytes(self) -> u64 {
        match self {
            Elem::F32 => 4,
            Elem::F16 => 2,
            Elem::Q8_0 | Elem::Q4_0 => 1,
        }
    }

    /// The KV element type it is.
    pub fn kv_dtype(self) -> crate::KvDtype {
        match self {
            Elem::F32 => crate::KvDtype::F32,
            Elem::F16 => crate::KvDtype::F16,
            Elem::Q8_0 => crate::KvDtype::Q8_0,
            Elem::Q4_0 => crate::KvDtype::Q4_0,
        }
    }
}

/// A `[B, H, L, D]` tensor in a caller's storage buffer.
#[derive(Debug, Clone, Copy)]
pub struct DeviceTensor<'a> {
    /// The storage buffer holding the elements.
    pub buffer: &'a wgpu::Buffer,
    /// `[B, H, L, D]` whatever the layout.
    pub shape: [usize; 4],
    /// How the elements lie in the buffer.
    pub layout: Layout,
    /// Elements before element `(0, 0, 0, 0)`.
    pub offset: usize,
    /// Rows each (batch, head) — or each batch, in `Blhd` — has room for (≥ L): a KV cache slab
    /// of this capacity whose first L rows are attended. Default L.
    pub capacity: usize,
    /// The element type (default f32).
    pub elem: Elem,
    /// A quantized tensor's scales plane: element `e`'s f16 scale is half `2·scales + e/32` of
    /// the buffer's u32 words, `e` counted from the buffer's start (offset included). Unused
    /// for float tensors.
    pub scales: usize,
}

impl<'a> DeviceTensor<'a> {
    /// A dense f32 tensor of `shape` at the start of `buffer`.
    pub fn new(buffer: &'a wgpu::Buffer, shape: [usize; 4], layout: Layout) -> Self {
        DeviceTensor {
            buffer,
            shape,
            layout,
            offset: 0,
            capacity: shape[2],
            elem: Elem::F32,
            scales: 0,
        }
    }

    /// The same tensor starting `elements` into the buffer.
    pub fn at_offset(self, elements: usize) -> Self {
        DeviceTensor {
            offset: elements,
            ..self
        }
    }

    /// The same tensor in a slab of `rows` rows per sequence (see [`capacity`](Self::capacity)).
    pub fn with_capacity(self, rows: usize) -> Self {
        DeviceTensor {
            capacity: rows,
            ..self
        }
    }

    /// The same tensor stored as quantized blocks of `elem` ([`Elem::Q8_0`], [`Elem::Q4_0`])
    /// with their scales plane from word `scales` (see [`scales`](Self::scales)).
    pub fn quantized(self, elem: Elem, scales: usize) -> Self {
        DeviceTensor {
            elem,
            scales,
            ..self
        }
    }

    /// The same tensor stored as f16.
    pub fn f16(self) -> Self {
        DeviceTensor {
            elem: Elem::F16,
            ..self
        }
    }

    /// Element strides in the kernels' terms, element offsets counted from element `base`
    /// (the start of the bound range; checked to fit u32 by [`check`](Self::check)).
    fn strides(&self, base: u64) -> RowStrides {
        let [_, h, _, d] = self.shape;
        let s = match self.layout {
            Layout::Bhld => [h * self.capacity * d, self.capacity * d, d],
            Layout::Blhd => [self.capacity * h * d, d, h * d],
        };
        RowStrides {
            offset: (self.offset as u64 - base) as u32,
            batch: s[0] as u32,
            head: s[1] as u32,
            row: s[2] as u32,
        }
    }

    /// One past the last element read or written (u64: no overflow for any usize sizes).
    fn end(&self) -> Option<u64> {
        let [b, h, l, d] = self.shape.map(|n| n as u64);
        if b * h * l * d == 0 {
            return Some(self.offset as u64);
        }
        let cap = self.capacity as u64;
        let [sb, sh, sl] = match self.layout {
            Layout::Bhld => [h.checked_mul(cap)?.checked_mul(d)?, cap * d, d],
            Layout::Blhd => [cap.checked_mul(h)?.checked_mul(d)?, d, h * d],
        };
        let last = (b - 1)
            .checked_mul(sb)?
            .checked_add((h - 1) * sh)?
            .checked_add((l - 1) * sl)?
            .checked_add(d - 1)?;
        (self.offset as u64).checked_add(last + 1)
    }

    /// `Err` naming `name` when the tensor does not fit its buffer, the kernels' u32 indices,
    /// or one storage binding, or lacks `STORAGE` usage; else what the passes bind of it.
    ///
    /// Views into arenas: the passes bind only the range the view spans, its start rounded
    /// down to `min_storage_buffer_offset_alignment` (element offsets are rebased onto it), so
    /// a view of any buffer runs when that range fits one binding.
    pub(crate) fn check(&self, gpu: &Gpu, name: &str) -> Result<View> {
        if !self.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(misuse(format!(
                "{name}: its buffer has usage {:?}, without STORAGE (the passes bind it as a storage buffer)",
                self.buffer.usage()
            )));
        }
        if self.elem.kv_dtype().quantized() {
            return self.check_quantized(gpu, name);
        }
        let eb = self.elem.bytes();
        if self.elem == Elem::F16 && !self.buffer.size().is_multiple_of(4) {
            return Err(misuse(format!(
                "{name}: an f16 tensor in a buffer of {} bytes, not a multiple of 4 (a storage binding's size must be; make the buffer a few bytes larger)",
                self.buffer.size()
            )));
        }
        let end = self.checked_end(name)?;
        let bytes = end.saturating_mul(eb);
        if bytes > self.buffer.size() {
            return Err(misuse(format!(
                "{name}: shape {:?} ({:?}, offset {}, capacity {}) reaches byte {bytes}, past its buffer's {} bytes",
                self.shape,
                self.layout,
                self.offset,
                self.capacity,
                self.buffer.size()
            )));
        }
        // The bound range: from the view's first byte rounded down to the offset alignment, to
        // its last vec4 where the buffer has it (the vec4 decode loads), else its last word.
        let align = (gpu.limits().min_storage_buffer_offset_alignment as u64).max(4);
        let start = (self.offset as u64 * eb) / align * align;
        let base = start / eb;
        let rel_end = end - base;
        let vec4_end = start + rel_end.next_multiple_of(4) * eb;
        let word_end = bytes.next_multiple_of(4).min(self.buffer.size());
        // Whole words: a storage binding's size is a multiple of 4 (an f32 buffer may not be).
        let stop = (vec4_end.min(self.buffer.size()) / 4 * 4).max(word_end);
        let size = (stop - start).max(4).min(self.buffer.size() - start);
        if rel_end > u32::MAX as u64 {
            return Err(Error::TooLarge {
                what: format!("{name} (element indices from its bound range's start past u32)"),
                needed: rel_end * eb,
                limit: u32::MAX as u64 * eb,
            });
        }
        gpu.check_fits(
            &format!("{name} (the aligned range of its buffer its view spans)"),
            size,
        )?;
        Ok(View {
            strides: self.strides(base),
            range: (start, size),
            whole_vec4s: vec4_end <= start + size,
        })
    }
}

impl DeviceTensor<'_> {
    /// One past the last element the view spans, counted from the buffer's start; `Err`
    /// naming `name` when its capacity is less than its length or the end overflows.
    fn checked_end(&self, name: &str) -> Result<u64> {
        if self.capacity < self.shape[2] {
            return Err(misuse(format!(
                "{name}: capacity {} rows is less than its length L = {}",
                self.capacity, self.shape[2]
            )));
        }
        self.end()
            .ok_or_else(|| misuse(format!("{name}: shape {:?} overflows", self.shape)))
    }

    /// [`check`](Self::check) of a quantized tensor: its rows start on blocks, its quants lie
    /// before its scales plane and its scales inside the buffer; the passes bind the whole
    /// buffer (both planes), element offsets counted from its start.
    fn check_quantized(&self, gpu: &Gpu, name: &str) -> Result<View> {
        let dtype = self.elem.kv_dtype();
        let block = crate::kv_dtype::BLOCK;
        if !self.offset.is_multiple_of(block) {
            return Err(misuse(format!(
                "{name}: a {dtype} tensor at element offset {}, not a multiple of {block} (its rows start on blocks)",
                self.offset
            )));
        }
        let end = self.checked_end(name)?;
        let quant_bytes = end.saturating_mul(dtype.quant_bits() as u64).div_ceil(8);
        let scale_bytes = 4 * (self.scales as u64).saturating_add(end.div_ceil(2 * block as u64));
        if quant_bytes > 4 * self.scales as u64 || scale_bytes > self.buffer.size() {
            return Err(misuse(format!(
                "{name}: a {dtype} tensor of shape {:?} (offset {}, capacity {}) needs its quants in bytes 0..{quant_bytes}, before its scales at word {}, and its scales up to byte {scale_bytes} of its buffer's {} bytes",
                self.shape,
                self.offset,
                self.capacity,
                self.scales,
                self.buffer.size()
            )));
        }
        if !self.buffer.size().is_multiple_of(16) {
            return Err(misuse(format!(
                "{name}: a {dtype} tensor in a buffer of {} bytes, not a multiple of 16 (the passes read its words as vec4s; make the buffer a few bytes larger)",
                self.buffer.size()
            )));
        }
        if self.buffer.size() / 4 > u32::MAX as u64 {
            return Err(Error::TooLarge {
                what: format!("{name} (word indices past u32)"),
                needed: self.buffer.size(),
                limit: 4 * u32::MAX as u64,
            });
        }
        gpu.check_fits(
            &format!("{name} (a quantized tensor binds its whole buffer)"),
            self.buffer.size(),
        )?;
        Ok(View {
            strides: self.strides(0),
            range: (0, self.buffer.size()),
            whole_vec4s: false,
        })
    }
}

/// What the passes bind of a checked [`DeviceTensor`]: its strides from the start of the bound
/// byte range, the range, and whether the range holds the view's rows as whole vec4s.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    pub strides: RowStrides,
    pub range: (u64, u64),
    pub whole_vec4s: bool,
}
