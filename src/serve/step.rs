//! One serving step of a decoder: which sequences run how many new tokens (`qo_indptr`), the
//! page table that already holds room for them, and everything every layer of the step
//! shares — each new token's position and slot, and the attention plan. A layer records its
//! part with [`crate::MultiHeadAttention::record_paged_step`].

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::config::AttentionConfig;
use crate::serve::inputs::{BatchOptions, PlanInputs, QueryLayout};
use crate::serve::plan::BatchAttention;
use crate::serve::pool::PoolConfig;
use crate::serve::table::{check_qo_indptr, PageTable};

/// A step of many sequences through a decoder's layers, each on its own pool of the same shape.
pub struct PagedStep {
    pub(crate) plan: BatchAttention,
    /// Each new token's position in its sequence (RoPE rotates by it).
    pub(crate) positions: Vec<usize>,
    /// Each new token's slot in the pools (i32), on the device once for every layer.
    pub(crate) slots: wgpu::Buffer,
    pub(crate) pool: PoolConfig,
    /// The attention settings the plan was made for (every layer must share them).
    pub(crate) heads: usize,
    pub(crate) scale: f32,
    pub(crate) softcap: Option<f32>,
    pub(crate) alibi: Option<f32>,
}

impl PagedStep {
    /// The step in which sequence `s` runs `qo_indptr[s + 1] − qo_indptr[s]` new tokens, its
    /// last tokens in `table` (grow the sequences first, e.g. with
    /// [`super::PageAllocator::grow`]). `config` is the layers' attention (heads, head size,
    /// scale, softcap, ALiBi); `window_left` a sliding window, as FlashInfer's. Every index is
    /// checked against `pool`.
    pub fn new(
        gpu: &Gpu,
        config: &AttentionConfig,
        pool: &PoolConfig,
        qo_indptr: &[u32],
        table: &PageTable,
        window_left: Option<usize>,
    ) -> Result<Self> {
        table.check(pool.max_pages, pool.page_size)?;
        let n = table.sequences();
        let tokens: Vec<usize> = (0..n).map(|s| table.tokens(s, pool.page_size)).collect();
        let rows = check_qo_indptr(qo_indptr, &tokens, true)?;
        let ps = pool.page_size;
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        for s in 0..n {
            let pages = table.pages(s);
            for pos in tokens[s] - rows[s]..tokens[s] {
                positions.push(pos);
                slots.push((pages[pos / ps] as usize * ps + pos % ps) as i32);
            }
        }
        if config.qk_head_dim != pool.head_dim || config.kv_heads != pool.kv_heads {
            return Err(Error::Misuse(format!(
                "the layers' heads (kv_heads {}, head size {}) are not the pool's (kv_heads {}, \
                 head_dim {})",
                config.kv_heads, config.qk_head_dim, pool.kv_heads, pool.head_dim
            )));
        }
        let options = BatchOptions {
            causal: true,
            window_left,
            scale: Some(config.scale()),
            softcap: config.softcap,
            alibi_max_bias: config.alibi,
            q_layout: QueryLayout::HeadMajor,
            ..Default::default()
        };
        let plan = BatchAttention::plan(
            gpu,
            &PlanInputs {
                qo_indptr,
                table,
                num_qo_heads: config.heads,
                num_kv_heads: config.kv_heads,
                head_dim: pool.head_dim,
                page_size: ps,
                layout: pool.layout,
                dtype: pool.dtype,
                options,
            },
        )?;
        let slot_buffer = gpu.scoped("uploading a step's slots", || {
            gpu.upload("paged step slots", &slots, wgpu::BufferUsages::empty())
        })?;
        Ok(PagedStep {
            plan,
            positions,
            slots: slot_buffer,
            pool: *pool,
            heads: config.heads,
            scale: config.scale(),
            softcap: config.softcap,
            alibi: config.alibi,
        })
    }

    /// The step with its new tokens rotated (RoPE) at `positions` instead of their indices
    /// in their sequences — e.g. a checkpoint's `position_ids` after left padding. Only the
    /// rotation changes: which keys a query sees still follows the pages.
    pub fn with_rope_positions(mut self, positions: &[usize]) -> Result<Self> {
        if positions.len() != self.positions.len() {
            return Err(Error::Shape {
                what: "rope positions".into(),
                expected: format!("one per new token ({})", self.positions.len()),
                got: vec![positions.len()],
            });
        }
        self.positions = positions.to_vec();
        Ok(self)
    }

    /// New tokens in the step (rows of its hidden states).
    pub fn tokens(&self) -> usize {
        self.positions.len()
    }

    /// Each new token's position in its sequence (or as [`Self::with_rope_positions`] set it).
    pub fn positions(&self) -> &[usize] {
        &self.positions
    }
}
