//! What a forward settles before anything touches the GPU: the inputs' shapes, the mask
//! (checked and lowered), the path, and — once per call — the largest chunks that fit the
//! device's limits.

use crate::error::{Error, Result};
use crate::kernels::flash_attention::{self, carry_stride};
use crate::kernels::mask::EncodedMask;
use crate::kernels::QkvLayout;
use crate::model::config::AttentionConfig;
use crate::model::mask::{AttnDims, Mask};

use super::{AttentionPath, ForwardOptions, MultiHeadAttention, Precision};

/// Which inputs are the same tensor: decides how many projection GEMMs run and how many
/// input buffers a workspace holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Sharing {
    /// query = key = value: one fused QKV GEMM.
    SelfAttention,
    /// key = value (seed 001's `x_k_v`): Q GEMM + fused KV GEMM.
    SharedKeyValue,
    /// Three inputs, three GEMMs.
    Distinct,
}

impl Sharing {
    /// From "is the same tensor" tests of (query, key) and (key, value).
    pub fn of(query_is_key: bool, key_is_value: bool) -> Self {
        match (query_is_key, key_is_value) {
            (true, true) => Sharing::SelfAttention,
            (_, true) => Sharing::SharedKeyValue,
            _ => Sharing::Distinct,
        }
    }

    /// How many distinct input tensors there are.
    pub fn inputs(self) -> usize {
        match self {
            Sharing::SelfAttention => 1,
            Sharing::SharedKeyValue => 2,
            Sharing::Distinct => 3,
        }
    }

    /// The sharing of a block of queries (`nq` of `lq`): a query block is no longer the
    /// key/value tensor.
    pub fn of_query_block(self, nq: usize, lq: usize) -> Self {
        match self {
            Sharing::SelfAttention if nq == lq => Sharing::SelfAttention,
            Sharing::Distinct => Sharing::Distinct,
            _ => Sharing::SharedKeyValue,
        }
    }
}

/// The shape of one workspace: everything its buffers and dispatches depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub batch: usize,
    pub lq: usize,
    pub lk: usize,
    pub sharing: Sharing,
    pub fused: bool,
    pub probs: bool,
}

impl Shape {
    /// Keys the inputs bring: `lk` less the module's appended keys.
    pub fn input_keys(&self, config: &AttentionConfig) -> usize {
        self.lk - config.appended_keys()
    }
}

/// A checked call.
pub(crate) struct Plan {
    pub dims: AttnDims,
    pub mask: EncodedMask,
    pub path: AttentionPath,
    pub whole: Shape,
    /// RoPE positions of the input's keys, `[B, Lk_in]`, for a module with RoPE.
    pub positions: Option<Vec<usize>>,
}

impl Plan {
    /// No rows or no keys: answered on the host (see `run::empty_forward`).
    pub fn is_empty(&self) -> bool {
        self.dims.batch == 0 || self.dims.lq == 0 || self.dims.lk == 0
    }
}

impl MultiHeadAttention {
    /// Checks the input shapes and the mask and chooses the path.
    pub(crate) fn plan(
        &self,
        shapes: [&[usize]; 3],
        sharing: Sharing,
        mask: &Mask,
        options: &ForwardOptions,
    ) -> Result<Plan> {
        let [query, key, value] = shapes;
        self.config.check_inputs(query, key, value)?;
        let input_dims = AttnDims {
            batch: query[0],
            heads: self.config.heads,
            lq: query[1],
            lk: key[1],
        };
        // The mask covers the input's keys; the module's appended keys (bias_k, a zero key)
        // follow them, seen by every query.
        let appended = self.config.appended_keys();
        let widened;
        let mask = match appended {
            0 => mask,
            _ => {
                widened = mask.with_appended_keys(appended, input_dims)?;
                &widened
            }
        };
        let dims = AttnDims {
            lk: key[1] + appended,
            ..input_dims
        };
        let mask = EncodedMask::new(mask, dims)?.with_score_terms(&self.config);
        let positions = self.positions(options, input_dims)?;
        let fused = self.choose_fused(options)?;
        Ok(Plan {
            dims,
            mask,
            path: if fused {
                AttentionPath::Fused
            } else {
                AttentionPath::MultiPass
            },
            whole: Shape {
                batch: dims.batch,
                lq: dims.lq,
                lk: dims.lk,
                sharing,
                fused,
                probs: options.return_probs,
            },
            positions,
        })
    }

    /// The keys' RoPE positions (`options.positions`, or `0..Lk` per sequence), checked; `None`
    /// for a module without RoPE, which must not be given any.
    fn positions(&self, options: &ForwardOptions, d: AttnDims) -> Result<Option<Vec<usize>>> {
        match (&self.config.rope, &options.positions) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(Error::Misuse(
                "positions were given, but the module has no rotary embedding (RoPE)".into(),
            )),
            (Some(_), _) if d.lq > d.lk => Err(Error::Misuse(format!(
                "with RoPE the queries take the positions of the last Lq keys, but Lq = {} > Lk = {}",
                d.lq, d.lk
            ))),
            (Some(_), Some(p)) if p.len() != d.batch * d.lk => Err(Error::shape(
                "positions",
                format!("[B, Lk] = [{}, {}] (row-major)", d.batch, d.lk),
                &[p.len()],
            )),
            (Some(_), Some(p)) => Ok(Some(p.clone())),
            (Some(_), None) => Ok(Some((0..d.batch).flat_map(|_| 0..d.lk).collect())),
        }
    }

    /// Fused (`true`) or multi-pass, refusing requests that cannot run.
    fn choose_fused(&self, options: &ForwardOptions) -> Result<bool> {
        let fused_ok = self.flash.is_some();
        let multi_pass = options.return_probs || options.path == AttentionPath::MultiPass;
        if self.precision == Precision::F16 && multi_pass {
            return Err(Error::Unsupported {
                adapter: self.gpu.describe(),
                what: "the multi-pass path (attention probabilities or AttentionPath::MultiPass) in an f16 module; build it with Precision::F32".into(),
            });
        }
        match options.path {
            AttentionPath::Fused if options.return_probs => Err(Error::Misuse(
                "the fused path cannot return attention probabilities; use Auto or MultiPass"
                    .into(),
            )),
            AttentionPath::Fused if !fused_ok => Err(self.no_fused_kernel()),
            AttentionPath::Fused => Ok(true),
            AttentionPath::MultiPass => Ok(false),
            AttentionPath::Auto => Ok(fused_ok && !options.return_probs),
        }
    }

    /// Why the fused path is unavailable for this module's head sizes.
    pub(crate) fn no_fused_kernel(&self) -> Error {
        Error::Unsupported {
            adapter: self.gpu.describe(),
            what: format!(
                "fused attention with head sizes q/k {} + v {} (a tile of {} K/V rows must fit the {} bytes of workgroup memory)",
                self.config.qk_head_dim,
                self.config.v_head_dim,
                flash_attention::KEY_GROUP,
                self.gpu.limits().max_compute_workgroup_storage_size
            ),
        }
    }

    /// The largest (batch, query) block sizes whose workspace fits the device: whole batches
    /// first, then query blocks (queries are independent given all keys). `Err(TooLarge)` only
    /// when one batch of one query does not fit.
    pub(crate) fn plan_chunks(&self, plan: &Plan) -> Result<(usize, usize)> {
        let fits = |s: Shape| self.check_limits(s, plan.mask.window_len(s.batch, s.lq));
        chunk_sizes(plan.whole, fits)
    }

    /// Floats of the fused path's state between dispatches: the decode pass's per-split
    /// state, or the flash pass's carry when its keys are split over several dispatches.
    pub(crate) fn carry_len(&self, shape: Shape) -> usize {
        let (rows, dv) = (
            shape.batch * self.config.heads * shape.lq,
            self.config.v_head_dim,
        );
        match &self.flash {
            Some(_) if shape.fused && self.decodes(shape.lq) => {
                let c = &self.config;
                let (group, lq, lk) = (c.kv_group(), shape.lq, shape.lk);
                crate::kernels::decode::partials_for(
                    &self.gpu,
                    group,
                    lq,
                    rows,
                    lk,
                    c.qk_head_dim,
                    dv,
                )
            }
            Some(f) if shape.fused && f.key_ranges(shape.lk).len() > 1 => rows * carry_stride(dv),
            _ => 0,
        }
    }

    /// Bytes per element of the projected Q/K/V buffer.
    pub(crate) fn qkv_elem_bytes(&self) -> u64 {
        match self.precision {
            Precision::F16 => 2,
            _ => 4,
        }
    }

    /// Whether one shape's workspace (with `mask_words` of mask) and dispatches fit the
    /// device's limits.
    pub(crate) fn check_limits(&self, shape: Shape, mask_words: usize) -> Result<()> {
        let c = &self.config;
        let (b, lq, lk, h) = (shape.batch, shape.lq, shape.lk, c.heads);
        let lk_in = shape.input_keys(c);
        let (dk, dv) = (c.qk_head_dim, c.v_head_dim);
        let carry = self.carry_len(shape);
        let scores = if shape.fused { 0 } else { b * h * lq * lk };
        let sizes = [
            ("query input", 4 * b * lq * c.model_dim),
            ("key input", 4 * b * lk_in * c.key_dim),
            ("value input", 4 * b * lk_in * c.value_dim),
            // One buffer each when packed they would not fit (see `workspace::split_qkv`).
            (
                "projected Q",
                self.qkv_elem_bytes() as usize * b * h * lq * dk,
            ),
            (
                "projected K",
                self.qkv_elem_bytes() as usize * b * c.kv_heads * lk * dk,
            ),
            (
                "projected V",
                self.qkv_elem_bytes() as usize * b * c.kv_heads * lk * dv,
            ),
            ("combined heads", 4 * b * lq * c.v_width()),
            ("output", 4 * b * lq * c.output_dim()),
            ("attention scores", 4 * scores),
            ("flash carry state", 4 * carry),
            ("the mask", 4 * mask_words),
        ];
        for (what, bytes) in sizes {
            self.gpu.check_fits(what, bytes as u64)?;
        }
        // Largest workgroup count along one dimension: (batch, head) pairs for the attention
        // passes, 64-row tiles for the projections.
        let groups = (b * h).max((b * lq.max(lk)).div_ceil(64));
        self.gpu
            .check_workgroups("forward", [groups.min(u32::MAX as usize) as u32, 1, 1])
    }
}

/// [`MultiHeadAttention::plan_chunks`] on any limit check: halve the batch until a shape fits,
/// then (one batch at a time) halve the query block.
fn chunk_sizes(whole: Shape, fits: impl Fn(Shape) -> Result<()>) -> Result<(usize, usize)> {
    let mut batch = whole.batch;
    loop {
        match fits(Shape { batch, ..whole }) {
            Ok(()) => return Ok((batch, whole.lq)),
            Err(_) if batch > 1 => batch = batch.div_ceil(2),
            Err(_) => break,
        }
    }
    let mut queries = whole.lq;
    loop {
        let shape = Shape {
            batch: 1,
            lq: queries,
            sharing: whole.sharing.of_query_block(queries, whole.lq),
            ..whole
        };
        match fits(shape) {
            Ok(()) => return Ok((1, queries)),
            Err(e) if queries == 1 => return Err(e),
            Err(_) => queries = queries.div_ceil(2),
        }
    }
}

/// Where Q, K, V of `shape` lie: packed one after the other, or each at 0 of its own buffer.
pub(super) fn qkv_layout(mha: &MultiHeadAttention, s: Shape, split: bool) -> QkvLayout {
    let c = &mha.config;
    let q_elems = s.batch * c.heads * s.lq * c.qk_head_dim;
    let k_elems = s.batch * c.kv_heads * s.lk * c.qk_head_dim;
    let (k_offset, v_offset) = match split {
        true => (0, 0),
        false => (q_elems, q_elems + k_elems),
    };
    QkvLayout {
        q_offset: 0,
        k_offset: k_offset as u32,
        v_offset: v_offset as u32,
        kv_stride: s.lk as u32,
        kv_group: c.kv_group() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, lq: usize) -> Shape {
        Shape {
            batch,
            lq,
            lk: 100,
            sharing: Sharing::SelfAttention,
            fused: true,
            probs: false,
        }
    }

    /// A device that holds `limit` query rows (batch · lq) at once.
    fn rows_limit(limit: usize) -> impl Fn(Shape) -> Result<()> {
        move |s: Shape| match s.batch * s.lq <= limit {
            true => Ok(()),
            false => Err(Error::TooLarge {
                what: "rows".into(),
                needed: (s.batch * s.lq) as u64,
                limit: limit as u64,
            }),
        }
    }

    #[test]
    fn whole_problems_that_fit_are_not_split() {
        assert_eq!(
            chunk_sizes(shape(8, 100), rows_limit(800)).unwrap(),
            (8, 100)
        );
    }

    #[test]
    fn batches_halve_before_queries() {
        // One row less than the whole problem: half the batch.
        assert_eq!(
            chunk_sizes(shape(8, 100), rows_limit(799)).unwrap(),
            (4, 100)
        );
        assert_eq!(
            chunk_sizes(shape(8, 100), rows_limit(100)).unwrap(),
            (1, 100)
        );
        // Odd batches round up.
        assert_eq!(chunk_sizes(shape(5, 10), rows_limit(30)).unwrap(), (3, 10));
    }

    #[test]
    fn queries_split_only_at_one_batch_and_fail_below_one_query() {
        assert_eq!(chunk_sizes(shape(8, 100), rows_limit(99)).unwrap(), (1, 50));
        assert_eq!(chunk_sizes(shape(8, 100), rows_limit(1)).unwrap(), (1, 1));
        assert!(matches!(
            chunk_sizes(shape(8, 100), rows_limit(0)),
            Err(Error::TooLarge { .. })
        ));
    }

    #[test]
    fn query_blocks_stop_sharing_the_key_value_input() {
        let seen = std::cell::RefCell::new(Vec::new());
        let fits = |s: Shape| {
            seen.borrow_mut().push(s.sharing);
            rows_limit(50)(s)
        };
        chunk_sizes(shape(1, 100), fits).unwrap();
        let seen = seen.into_inner();
        assert_eq!(seen[0], Sharing::SelfAttention);
        assert_eq!(*seen.last().unwrap(), Sharing::SharedKeyValue);
        assert_eq!(Sharing::Distinct.of_query_block(1, 100), Sharing::Distinct);
    }
}
