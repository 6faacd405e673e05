//! Serving many sequences at once: a page pool per layer ([`PagedKvPool`]), FlashInfer's CSR
//! page table ([`PageTable`]), a host allocator with shared pages and copy on write
//! ([`PageAllocator`]), ragged appends ([`PagedKvPool::record_append`]) and batched attention
//! through a plan made once per step and run by every layer ([`BatchAttention`]), and the
//! merge of two parts' states ([`merge_states`]) for a shared prefix attended once (cascade).
//!
//! A sequence's query rows are its last tokens (bottom-right causal alignment), so one call
//! serves decode rows, a few speculative rows and prefill chunks together. Every index is
//! checked on the host before anything is recorded; a kernel never reads a page its sequence
//! does not list, nor a slot past a sequence's length.

mod allocator;
mod body;
mod inputs;
mod merge;
mod plan;
mod pool;
mod step;
mod table;
mod warm;
mod work_list;

pub use allocator::{Growth, PageAllocator, Sequence};
pub use body::Body;
pub use inputs::{BatchOptions, PlanInputs, QueryLayout};
pub use merge::{merge_states, record_merge_states, State};
pub use plan::BatchAttention;
pub(crate) use pool::NewKv;
pub use pool::{KvLayout, PagedKvPool, PoolConfig, PoolFormat};
pub use step::PagedStep;
pub use table::{check_qo_indptr, PageTable};
pub use warm::WarmPasses;
