//! One layer's page pool on the device: `[max_pages, 2, page_size, H_kv, D]` (NHD, the default)
//! or `[max_pages, 2, H_kv, page_size, D]` (HND), f32, f16 or llama.cpp's q8_0 / q4_0 blocks,
//! in one storage buffer; and the ragged append of new keys and values into its pages.
//!
//! A quantized pool is one quantized buffer of the pool's logical elements (see
//! [`crate::kv_dtype`]): the quants of every page, then the scales of every page, from word
//! [`PoolConfig::scales_word`]. That word depends on the pool's page count, which a plan does
//! not know (a plan serves any pool of its shape), so the pool keeps it in a small uniform of
//! its own ([`PagedKvPool::format_buffer`]) that the reading passes bind.

use crate::attention::gpu_tensor::GpuTensor;
use crate::error::{Error, Result};
use crate::gpu::pass::Dispatch;
use crate::gpu::Gpu;
use crate::kernels::paged_append::{self, AppendBindings, PagedAppendParams};
use crate::kv_dtype::{self, KvDtype};

/// New keys and values (f32) in device buffers: token `t`'s head `h` at `offset + t ·
/// row_stride + h · head_stride` (`[total_new, H_kv, D]`, or a module's head-split projection).
pub(crate) struct NewKv<'a> {
    pub keys: &'a wgpu::Buffer,
    pub values: &'a wgpu::Buffer,
    pub k_offset: usize,
    pub v_offset: usize,
    pub row_stride: usize,
    pub head_stride: usize,
    pub tokens: usize,
}

/// Where a page keeps its tokens and heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvLayout {
    /// `[2, page_size, H_kv, D]` per page: token-major (FlashInfer's default).
    #[default]
    Nhd,
    /// `[2, H_kv, page_size, D]` per page: head-major.
    Hnd,
}

impl KvLayout {
    /// The layout `gpu`'s paged decode reads fastest, for pools whose layout is the engine's
    /// choice: HND on a CPU adapter, where a lane walks one KV head's keys and HND keeps them
    /// contiguous in a page (NHD puts the token's other heads between them: on lavapipe HND
    /// steps 1.2–1.6× as fast; `bench --only serve` times both); NHD, FlashInfer's default, on
    /// a GPU, whose lanes share each row (not yet measured on one).
    pub fn preferred(gpu: &Gpu) -> Self {
        match gpu.kernel_class() {
            crate::gpu::KernelClass::Cpu => KvLayout::Hnd,
            crate::gpu::KernelClass::Gpu => KvLayout::Nhd,
        }
    }

    /// `"NHD"` or `"HND"` (any case), FlashInfer's names.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_uppercase().as_str() {
            "NHD" => Ok(KvLayout::Nhd),
            "HND" => Ok(KvLayout::Hnd),
            other => Err(Error::Misuse(format!(
                "kv_layout `{other}`: expected \"NHD\" or \"HND\""
            ))),
        }
    }
}

/// The shape and element type of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Pages in the pool.
    pub max_pages: usize,
    /// Tokens per page: a power of two from 1 to 256.
    pub page_size: usize,
    /// Key/value heads `H_kv`.
    pub kv_heads: usize,
    /// Head size `D`.
    pub head_dim: usize,
    /// Where a page keeps its tokens and heads (NHD or HND).
    pub layout: KvLayout,
    /// The element type: f32, f16 (needs `SHADER_F16`), q8_0 or q4_0 (head sizes of whole
    /// blocks of 32).
    pub dtype: KvDtype,
}

impl PoolConfig {
    /// `max_pages` pages of 16 tokens, NHD, f32.
    pub fn new(max_pages: usize, kv_heads: usize, head_dim: usize) -> Self {
        PoolConfig {
            max_pages,
            page_size: 16,
            kv_heads,
            head_dim,
            layout: KvLayout::Nhd,
            dtype: KvDtype::F32,
        }
    }

    /// Elements of one page (its keys and values).
    pub fn page_elements(&self) -> usize {
        2 * self.page_size * self.kv_heads * self.head_dim
    }

    /// Elements of the whole pool.
    pub fn elements(&self) -> usize {
        self.max_pages * self.page_elements()
    }

    /// Bytes of the pool's buffer (a quantized pool's two planes, whole words each).
    pub fn bytes(&self) -> u64 {
        self.dtype.bytes_for(self.elements())
    }

    /// Bytes one token takes in one layer's pool, its keys and values: the blocks' real bytes
    /// (34 per 32 values in q8_0, 18 in q4_0).
    pub fn bytes_per_token(&self) -> u64 {
        self.dtype.bytes_per(2 * self.kv_heads * self.head_dim)
    }

    /// The word where a quantized pool's scales plane starts (0 for a float pool).
    pub fn scales_word(&self) -> usize {
        self.dtype.scales_word(self.elements())
    }

    /// The byte ranges `(offset, size)` of one page in the buffer: its elements for a float
    /// pool; its quants, then its scales, for a quantized one (whole words: a page holds an
    /// even number of blocks, as its head size is whole blocks).
    fn page_ranges(&self, page: u64) -> Vec<(u64, u64)> {
        let n = self.page_elements() as u64;
        match self.dtype {
            KvDtype::F32 | KvDtype::F16 => {
                let size = self.dtype.bytes_per(self.page_elements());
                vec![(page * size, size)]
            }
            q => {
                let quants = n * q.quant_bits() as u64 / 8;
                let scales = 2 * n / kv_dtype::BLOCK as u64;
                let plane = 4 * self.scales_word() as u64;
                vec![(page * quants, quants), (plane + page * scales, scales)]
            }
        }
    }

    /// The host index of element `d` of token `offset`, head `kvh`, of K (`which` 0) or V (1)
    /// of `page`, in the layout (what the shaders compute).
    pub fn index(&self, page: usize, which: usize, offset: usize, kvh: usize, d: usize) -> usize {
        let (ps, h, dim) = (self.page_size, self.kv_heads, self.head_dim);
        let base = (page * 2 + which) * ps * h * dim;
        match self.layout {
            KvLayout::Nhd => base + (offset * h + kvh) * dim + d,
            KvLayout::Hnd => base + (kvh * ps + offset) * dim + d,
        }
    }

    /// `Err(Config)` naming what is wrong: a page size that is not a power of two in 1 ..= 256,
    /// no pages, heads or head size, a quantized pool's head size not whole blocks of 32;
    /// `Err(TooLarge)` past one storage binding or u32 indices; `Err(Unsupported)` for f16
    /// without `SHADER_F16`.
    pub fn check(&self, gpu: &Gpu) -> Result<()> {
        if !self.page_size.is_power_of_two() || self.page_size > 256 {
            return Err(Error::Config(format!(
                "page_size {} must be a power of two from 1 to 256",
                self.page_size
            )));
        }
        if self.max_pages == 0 || self.kv_heads == 0 || self.head_dim == 0 {
            return Err(Error::Config(format!(
                "a page pool needs pages, KV heads and a head size (got max_pages {}, kv_heads \
                 {}, head_dim {})",
                self.max_pages, self.kv_heads, self.head_dim
            )));
        }
        self.dtype.check_head_dim("head_dim", self.head_dim)?;
        let elements = [2, self.page_size, self.kv_heads, self.head_dim]
            .iter()
            .try_fold(self.max_pages as u64, |n, &k| n.checked_mul(k as u64));
        // Past 2^48 elements no device holds it: report the bytes as saturated.
        let bytes = match elements {
            Some(e) if e < 1 << 48 => {
                usize::try_from(e).map_or(u64::MAX, |e| self.dtype.bytes_for(e))
            }
            _ => u64::MAX,
        };
        let what = format!("a page pool of {} pages", self.max_pages);
        gpu.check_fits(&what, bytes)?;
        if elements.is_none_or(|e| e > u32::MAX as u64) {
            return Err(Error::TooLarge {
                what: format!("{what} (u32 element indices)"),
                needed: bytes,
                limit: u32::MAX as u64,
            });
        }
        if self.dtype == KvDtype::F16 && !gpu.has_f16() {
            return Err(Error::Unsupported {
                adapter: gpu.describe(),
                what: "an f16 page pool needs SHADER_F16; use f32 pages".into(),
            });
        }
        Ok(())
    }
}

/// One layer's pages on the device.
#[derive(Debug)]
pub struct PagedKvPool {
    config: PoolConfig,
    buffer: wgpu::Buffer,
    /// `PoolFormat` of `paged_rows_quant.wgsl`: where the scales plane starts (quantized
    /// pools; the float passes do not bind it).
    format: wgpu::Buffer,
}

/// Mirrors `PoolFormat` in `paged_rows_quant.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PoolFormat {
    /// The word where the scales plane starts.
    pub scales: u32,
    /// Padding to 16 bytes.
    pub _pad0: u32,
    /// Padding to 16 bytes.
    pub _pad1: u32,
    /// Padding to 16 bytes.
    pub _pad2: u32,
}

impl PagedKvPool {
    /// A pool of zeros.
    pub fn new(gpu: &Gpu, config: PoolConfig) -> Result<Self> {
        config.check(gpu)?;
        let (buffer, format) = gpu.scoped("allocating a page pool", || {
            (
                gpu.storage("page pool", config.bytes(), wgpu::BufferUsages::COPY_SRC),
                Self::format_uniform(gpu, &config),
            )
        })?;
        Ok(PagedKvPool {
            config,
            buffer,
            format,
        })
    }

    fn format_uniform(gpu: &Gpu, config: &PoolConfig) -> wgpu::Buffer {
        let format = PoolFormat {
            scales: config.scales_word() as u32,
            ..Default::default()
        };
        gpu.uniform("page pool format", &format)
    }

    /// A pool holding `data`, the host array in the pool's layout (`[max_pages, 2, page_size,
    /// H_kv, D]` for NHD), converted to f16 for an f16 pool, quantized (as the append would)
    /// for a quantized one.
    pub fn upload(gpu: &Gpu, config: PoolConfig, data: &[f32]) -> Result<Self> {
        config.check(gpu)?;
        if data.len() != config.elements() {
            return Err(Error::DataLength {
                what: "page pool data".into(),
                shape: vec![
                    config.max_pages,
                    2,
                    config.page_size,
                    config.kv_heads,
                    config.head_dim,
                ],
                expected: config.elements(),
                got: data.len(),
            });
        }
        // COPY_SRC as `new`'s pool has: `read` and `record_copy_pages` copy out of it.
        let words = match config.dtype {
            KvDtype::F32 | KvDtype::F16 => None,
            q => Some(kv_dtype::quantize(q, data)?),
        };
        let (buffer, format) = gpu.scoped("uploading a page pool", || {
            let copy_src = wgpu::BufferUsages::COPY_SRC;
            let buffer = match (config.dtype, &words) {
                (_, Some(words)) => gpu.upload("page pool", words, copy_src),
                (KvDtype::F16, None) => {
                    let half: Vec<half::f16> =
                        data.iter().map(|&v| half::f16::from_f32(v)).collect();
                    gpu.upload("page pool", &half, copy_src)
                }
                _ => gpu.upload("page pool", data, copy_src),
            };
            (buffer, Self::format_uniform(gpu, &config))
        })?;
        Ok(PagedKvPool {
            config,
            buffer,
            format,
        })
    }

    /// The pool's shape and element type.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The storage buffer (elements as [`PoolConfig::index`] lays them out).
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// The uniform a quantized pool's readers bind (`PoolFormat`: its scales plane).
    pub fn format_buffer(&self) -> &wgpu::Buffer {
        &self.format
    }

    /// The whole pool back on the host, as f32 (blocking); a quantized pool's blocks
    /// dequantized (see [`Self::read_words`] for the words themselves).
    pub fn read(&self, gpu: &Gpu) -> Result<Vec<f32>> {
        let c = &self.config;
        match c.dtype {
            KvDtype::F32 | KvDtype::F16 => {}
            q => return kv_dtype::dequantize(q, &self.read_words(gpu)?, c.elements()),
        }
        let raw = self.read_raw(gpu)?;
        Ok(if c.dtype == KvDtype::F16 {
            bytemuck::cast_slice::<u8, half::f16>(&raw)
                .iter()
                .map(|h| h.to_f32())
                .collect()
        } else {
            bytemuck::cast_slice::<u8, f32>(&raw).to_vec()
        })
    }

    /// The pool's buffer as u32 words (blocking): a quantized pool's two planes (see
    /// [`crate::kv_dtype`]), the raw bits of a float pool's elements.
    pub fn read_words(&self, gpu: &Gpu) -> Result<Vec<u32>> {
        let raw = self.read_raw(gpu)?;
        Ok(raw
            .chunks(4)
            .map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(w)
            })
            .collect())
    }

    fn read_raw(&self, gpu: &Gpu) -> Result<Vec<u8>> {
        let bytes = self.config.bytes();
        let staging = gpu.staging("page pool readback", bytes);
        gpu.scoped("reading a page pool", || {
            let mut encoder = gpu.encoder("page pool readback");
            encoder.copy_buffer_to_buffer(&self.buffer, 0, &staging, 0, bytes.next_multiple_of(4));
            gpu.queue().submit([encoder.finish()]);
        })?;
        let mut raw = gpu.read_bytes(&staging, bytes)?;
        raw.truncate(bytes as usize);
        Ok(raw)
    }

    /// Records copies of whole pages (`(from, to)` page ids), as an allocator's copy on write
    /// asks for. `Err` naming a page past the pool, before anything is recorded.
    pub fn record_copy_pages(
        &self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        copies: &[(u32, u32)],
    ) -> Result<()> {
        for &(from, to) in copies {
            for page in [from, to] {
                if page as usize >= self.config.max_pages {
                    return Err(Error::PageTable(format!(
                        "page copy {from} → {to}: page {page} is past the pool's {} pages",
                        self.config.max_pages
                    )));
                }
            }
        }
        if copies.is_empty() {
            return Ok(());
        }
        // wgpu copies between two buffers only: through a staging buffer of the pages (each
        // page one range of a float pool, its quants and its scales of a quantized one).
        let page_bytes: u64 = self.config.page_ranges(0).iter().map(|r| r.1).sum();
        let bytes = page_bytes * copies.len() as u64;
        let staging = gpu.scoped("copying pages", || {
            gpu.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("page copies"),
                size: bytes,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        for (i, &(from, _)) in copies.iter().enumerate() {
            let mut at = i as u64 * page_bytes;
            for (offset, size) in self.config.page_ranges(from as u64) {
                encoder.copy_buffer_to_buffer(&self.buffer, offset, &staging, at, size);
                at += size;
            }
        }
        for (i, &(_, to)) in copies.iter().enumerate() {
            let mut at = i as u64 * page_bytes;
            for (offset, size) in self.config.page_ranges(to as u64) {
                encoder.copy_buffer_to_buffer(&staging, at, &self.buffer, offset, size);
                at += size;
            }
        }
        Ok(())
    }

    /// Records the append of `keys` and `values` (`[total_new, H_kv, D]` f32) into `slots`
    /// (one per new token: `page · page_size + offset`, or negative to skip it; vLLM's slot
    /// mapping) into `encoder`. Every slot is checked against the pool first; the slots reach
    /// the device inside the encoder.
    pub fn record_append(
        &self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        keys: &GpuTensor,
        values: &GpuTensor,
        slots: &[i64],
    ) -> Result<()> {
        let c = &self.config;
        let want = [slots.len(), c.kv_heads, c.head_dim];
        for (what, t) in [("append keys", keys), ("append values", values)] {
            if t.shape() != want {
                return Err(Error::Shape {
                    what: what.into(),
                    expected: format!("[total_new {}, H_kv {}, D {}]", want[0], want[1], want[2]),
                    got: t.shape().to_vec(),
                });
            }
        }
        let capacity = c.max_pages * c.page_size;
        let mut words = Vec::with_capacity(slots.len());
        for (i, &slot) in slots.iter().enumerate() {
            if slot >= capacity as i64 {
                return Err(Error::PageTable(format!(
                    "slot_mapping[{i}] is {slot}: past the pool's {} pages of {} tokens",
                    c.max_pages, c.page_size
                )));
            }
            words.push(slot.max(-1) as i32);
        }
        if slots.is_empty() {
            return Ok(());
        }
        let new = NewKv {
            keys: keys.buffer(),
            values: values.buffer(),
            k_offset: 0,
            v_offset: 0,
            row_stride: c.kv_heads * c.head_dim,
            head_stride: c.head_dim,
            tokens: slots.len(),
        };
        let (dispatch, slot_buffer) = gpu.scoped("recording a page append", || {
            let slot_buffer = gpu.storage(
                "append slots",
                4 * words.len() as u64,
                wgpu::BufferUsages::empty(),
            );
            self.append_dispatch(gpu, &new, &slot_buffer)
                .map(|d| (d, slot_buffer))
        })??;
        gpu.write_in(encoder, &slot_buffer, 0, bytemuck::cast_slice(&words));
        dispatch.record(encoder, None);
        Ok(())
    }

    /// The append dispatch of `new` into the slots `slots` holds (i32 each, checked by the
    /// caller against the pool).
    pub(crate) fn append_dispatch(
        &self,
        gpu: &Gpu,
        new: &NewKv,
        slots: &wgpu::Buffer,
    ) -> Result<Dispatch> {
        let c = &self.config;
        let params = PagedAppendParams {
            tokens: new.tokens as u32,
            kv_heads: c.kv_heads as u32,
            head_dim: c.head_dim as u32,
            page_size: c.page_size as u32,
            hnd: (c.layout == KvLayout::Hnd) as u32,
            k_offset: new.k_offset as u32,
            v_offset: new.v_offset as u32,
            row_stride: new.row_stride as u32,
            head_stride: new.head_stride as u32,
            scales: c.scales_word() as u32,
            ..Default::default()
        };
        let bindings = AppendBindings {
            keys: new.keys,
            values: new.values,
            slots,
            pool: &self.buffer,
        };
        paged_append::dispatch(gpu, c.dtype, params, &bindings)
    }

    /// [`record_append`](Self::record_append), submitted.
    pub fn append(
        &self,
        gpu: &Gpu,
        keys: &GpuTensor,
        values: &GpuTensor,
        slots: &[i64],
    ) -> Result<()> {
        let mut encoder = gpu.encoder("page append");
        self.record_append(gpu, &mut encoder, keys, values, slots)?;
        gpu.scoped("submitting a page append", || {
            gpu.queue().submit([encoder.finish()]);
        })
    }
}
