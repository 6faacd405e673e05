//! What a plan is asked ([`PlanInputs`]): one step's page table, query rows and shapes, and
//! every option of the attention core ([`BatchOptions`]). Read by the plan and by the work
//! list it builds.

use crate::kv_dtype::KvDtype;
use crate::serve::pool::KvLayout;
use crate::serve::table::PageTable;

/// What a plan computes besides the table: every option of the attention core.
#[derive(Debug, Clone, Default)]
pub struct BatchOptions {
    /// Bottom-right causal: a sequence's query rows are its last tokens, row `i` of `q` rows
    /// at position `tokens − q + i` sees keys `j ≤` its position.
    pub causal: bool,
    /// FlashInfer's `window_left`: the query at position `i` sees keys `j ≥ i − window_left`
    /// (`None`: no window).
    pub window_left: Option<usize>,
    /// Multiplies `q·kᵀ`; `None` = `1/√D`.
    pub scale: Option<f32>,
    /// Logit soft-cap `c`: `c · tanh(s / c)` of the scaled score (Gemma 2; FlashInfer's
    /// `logits_soft_cap`).
    pub softcap: Option<f32>,
    /// ALiBi's `max_bias` (slopes as [`crate::model::config::alibi_slope`]), the bias
    /// `slope · (j − i)` for the query at position `i`.
    pub alibi_max_bias: Option<f32>,
    /// One logit per query head joining each row's softmax denominator only.
    pub sinks: Option<Vec<f32>>,
    /// Write each row's log-sum-exp (natural log) to the `lse` tensor given to `run`.
    pub return_lse: bool,
    /// How `q` holds its rows: `[total_q, H, D]` (the default) or head-major.
    pub q_layout: QueryLayout,
}

/// Where query row `r` of head `h` lies in `q`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueryLayout {
    /// `[total_q, H, D]`: FlashInfer's packed rows.
    #[default]
    TokenMajor,
    /// `[H, total_q, D]`: what a module's head-split projection writes (see
    /// `MultiHeadAttention::record_paged_step`).
    HeadMajor,
}

/// The shapes and table of one step.
#[derive(Debug, Clone)]
pub struct PlanInputs<'a> {
    /// Query rows per sequence as prefix sums `[n + 1]`.
    pub qo_indptr: &'a [u32],
    /// Each sequence's pages in the pool (FlashInfer's CSR page table).
    pub table: &'a PageTable,
    /// Query heads `H`: a positive multiple of `num_kv_heads`.
    pub num_qo_heads: usize,
    /// Key/value heads `H_kv` of the pool.
    pub num_kv_heads: usize,
    /// Head size `D` of queries, keys and values.
    pub head_dim: usize,
    /// Tokens per page of the pool: a power of two from 1 to 256.
    pub page_size: usize,
    /// The pool's page layout (NHD or HND).
    pub layout: KvLayout,
    /// The pool's element type (f32, f16 with `SHADER_F16`, q8_0 or q4_0 with a head size of
    /// whole blocks of 32).
    pub dtype: KvDtype,
    /// Masking, scaling and output options of the attention.
    pub options: BatchOptions,
}
