//! Compiling a server's passes before its first step. A plan compiles the bodies it picks the
//! first time it picks them, and a layer its projections the first time it runs, so without
//! this the first steps pay for compiling (on lavapipe 0.6 s of the continuous-batching
//! example's first step, against 3–16 ms for a later one).

use std::sync::Arc;

use crate::error::Result;
use crate::gpu::pass::Pass;
use crate::gpu::Gpu;
use crate::kernels::paged_attention::PagedShape;
use crate::kernels::paged_merge;
use crate::kv_dtype::KvDtype;
use crate::serve::body::Bodies;
use crate::serve::plan::{check_heads, BatchAttention};

/// Compiled passes, held: while this lives the device's cache of compiled passes never drops
/// them as idle, so no later step compiles them again. Keep it for as long as you serve.
#[must_use = "the passes may be dropped from the device's cache once this is dropped"]
pub struct WarmPasses {
    passes: Vec<Arc<Pass>>,
}

impl std::fmt::Debug for WarmPasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.passes.iter().map(|p| p.label).collect();
        f.debug_struct("WarmPasses")
            .field("passes", &labels)
            .finish()
    }
}

impl WarmPasses {
    pub(crate) fn new(passes: Vec<Arc<Pass>>) -> Self {
        WarmPasses { passes }
    }

    /// Passes held.
    pub fn len(&self) -> usize {
        self.passes.len()
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.passes.is_empty()
    }
}

impl BatchAttention {
    /// Compiles every pass a plan for `num_qo_heads` query heads over `num_kv_heads` KV heads
    /// of `head_dim` elements in `dtype` pages can pick on `gpu` — each body at every width
    /// of query rows, and the merge of split keys — so that no [`plan`](Self::plan) of those
    /// heads compiles anything. The same checks as `plan`'s; nothing is dispatched.
    pub fn warm_up(
        gpu: &Gpu,
        num_qo_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> Result<WarmPasses> {
        check_heads(gpu, num_qo_heads, num_kv_heads, head_dim, dtype)?;
        let group = num_qo_heads / num_kv_heads;
        // A plan's tile shape takes its (row, head) slots from the step's most query rows,
        // rounded up to a power of two and capped: every power of two up to past the cap.
        let mut shapes: Vec<PagedShape> = Vec::new();
        for busy in (0..8).map(|i| 1usize << i) {
            let shape = PagedShape::for_device(gpu, head_dim, dtype, busy)?;
            if !shapes.contains(&shape) {
                shapes.push(shape);
            }
        }
        let (compiled, passes) = gpu.passes_used_by(|| {
            gpu.scoped("compiling the paged passes", || {
                for &shape in &shapes {
                    let bodies = Bodies::for_device(gpu, shape, head_dim, dtype, group);
                    for body in [Some(bodies.rows), bodies.decode].into_iter().flatten() {
                        body.pass(gpu);
                    }
                    paged_merge::pass(gpu, shape.d4);
                }
            })
        });
        compiled?;
        Ok(WarmPasses::new(passes))
    }
}
