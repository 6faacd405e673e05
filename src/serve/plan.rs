//! Batched attention over a page pool: [`BatchAttention::plan`] once per step (on the host:
//! check the table, split each sequence's keys into chunks that fill the device, upload the
//! work list and size the scratch), then [`BatchAttention::record`] / [`BatchAttention::run`]
//! for every layer, which make no buffer: one `paged_attention` dispatch over the work list
//! and, when some keys were split, one `paged_merge` dispatch.

use crate::attention::gpu_tensor::GpuTensor;
use crate::error::{Error, Result};
use crate::gpu::pass::Pass;
use crate::gpu::timer::PassTimer;
use crate::gpu::{Gpu, KernelClass};
use crate::kernels::paged_attention::{
    self as kernel, PagedBindings, PagedParams, PagedShape, FLAG_ALIBI, FLAG_LSE, FLAG_SINKS,
    ITEM_WORDS, NO_WINDOW,
};
use crate::kernels::paged_merge::{self, MergeParams};
use crate::kv_dtype::KvDtype;
use crate::serve::body::{Bodies, Body};
use crate::serve::inputs::{PlanInputs, QueryLayout};
use crate::serve::pool::{KvLayout, PagedKvPool};
use crate::serve::table::check_qo_indptr;
use crate::serve::work_list::{work_list, Split};
use std::sync::Arc;

/// Work items the plan aims for: enough workgroups to fill the adapter (a GPU's SMs a few
/// times over; a CPU adapter's threads).
fn target_items(class: KernelClass) -> usize {
    match class {
        KernelClass::Gpu => 1024,
        KernelClass::Cpu => 64,
    }
}

/// One step's plan: its work list on the device, its scratch and the two passes' parameters.
/// Reused by every layer of the step; bit-identical outputs for the same inputs.
pub struct BatchAttention {
    gpu: Gpu,
    shape: PagedShape,
    /// The attention's dispatches: each a body over its part of the work list.
    parts: Vec<Part>,
    merge: Arc<Pass>,
    merge_params: wgpu::Buffer,
    plan: wgpu::Buffer,
    scratch: wgpu::Buffer,
    /// Bound as `lse` when the caller asks for none.
    no_lse: wgpu::Buffer,
    merge_groups: Option<[u32; 3]>,
    total_q: usize,
    heads: usize,
    head_dim: usize,
    page_size: usize,
    kv_heads: usize,
    layout: KvLayout,
    dtype: KvDtype,
    max_page: Option<u32>,
    return_lse: bool,
    chunk_keys: usize,
    items: usize,
}

impl std::fmt::Debug for BatchAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchAttention")
            .field("total_q", &self.total_q)
            .field("heads", &self.heads)
            .field("kv_heads", &self.kv_heads)
            .field("head_dim", &self.head_dim)
            .field("page_size", &self.page_size)
            .field("layout", &self.layout)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field(
                "bodies",
                &self.parts.iter().map(|p| p.body).collect::<Vec<_>>(),
            )
            .field("work_items", &self.items)
            .field("chunk_keys", &self.chunk_keys)
            .field("split", &self.merge_groups.is_some())
            .finish_non_exhaustive()
    }
}

/// `Err` unless `h` query heads of `d` elements over `h_kv` KV heads in `dtype` pages can be
/// planned on `gpu`.
pub(super) fn check_heads(
    gpu: &Gpu,
    h: usize,
    h_kv: usize,
    d: usize,
    dtype: KvDtype,
) -> Result<()> {
    if h == 0 || h_kv == 0 || d == 0 || !h.is_multiple_of(h_kv) {
        return Err(Error::Config(format!(
            "num_qo_heads {h} must be a positive multiple of num_kv_heads {h_kv}, head_dim {d} \
             positive"
        )));
    }
    dtype.check_head_dim("head_dim", d)?;
    if dtype == KvDtype::F16 && !gpu.has_f16() {
        return Err(Error::Unsupported {
            adapter: gpu.describe(),
            what: "an f16 page pool needs SHADER_F16; use f32 pages".into(),
        });
    }
    Ok(())
}

impl BatchAttention {
    /// Checks the table and shapes, splits the keys and uploads the work list. Every bad input
    /// is an `Err` naming it, before anything is made on the device.
    pub fn plan(gpu: &Gpu, inputs: &PlanInputs) -> Result<Self> {
        let (h, h_kv, d, ps) = (
            inputs.num_qo_heads,
            inputs.num_kv_heads,
            inputs.head_dim,
            inputs.page_size,
        );
        check_heads(gpu, h, h_kv, d, inputs.dtype)?;
        if !ps.is_power_of_two() || ps > 256 {
            return Err(Error::Config(format!(
                "page_size {ps} must be a power of two from 1 to 256"
            )));
        }
        let o = &inputs.options;
        if let Some(s) = &o.sinks {
            if s.len() != h {
                return Err(Error::Config(format!(
                    "sinks has {} values, expected one per query head ({h})",
                    s.len()
                )));
            }
        }
        for (name, value) in [("softcap", o.softcap), ("scale", o.scale)] {
            if value.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                return Err(Error::Config(format!(
                    "{name} must be finite and positive, got {value:?}"
                )));
            }
        }
        if o.alibi_max_bias.is_some_and(|m| !m.is_finite()) {
            return Err(Error::Config("alibi_max_bias must be finite".into()));
        }
        // The table's own indices are checked against the pool at run time (its size); here
        // everything but the page ids' bound.
        inputs.table.check(u32::MAX as usize, ps)?;
        let tokens: Vec<usize> = (0..inputs.table.sequences())
            .map(|s| inputs.table.tokens(s, ps))
            .collect();
        let positional = o.causal || o.window_left.is_some() || o.alibi_max_bias.is_some();
        let q_rows = check_qo_indptr(inputs.qo_indptr, &tokens, positional)?;
        let total_q = *inputs.qo_indptr.last().unwrap_or(&0) as usize;

        // Slots no item would fill are left out of the shape (decode batches: one row of the
        // query heads of a KV head).
        let most_rows = q_rows.iter().copied().max().unwrap_or(0);
        let shape = PagedShape::for_device(gpu, d, inputs.dtype, most_rows * (h / h_kv))?;
        // Decode rows in their own part where the adapter gives them their own body.
        let bodies = Bodies::for_device(gpu, shape, d, inputs.dtype, h / h_kv);
        let mut body_list = vec![bodies.rows];
        body_list.extend(bodies.decode);
        let part_of: Vec<usize> = q_rows
            .iter()
            .map(|&rows| usize::from(rows == 1 && bodies.decode.is_some()))
            .collect();
        let software = crate::kernels::is_software(gpu);
        let splits: Vec<Split> = body_list.iter().map(|b| b.split(software)).collect();
        let work = work_list(
            &splits,
            &part_of,
            inputs,
            &tokens,
            &q_rows,
            target_items(gpu.kernel_class()),
        );

        // The plan buffer: items, sequences, page ids, rows, then per-head sinks and slopes.
        let mut words: Vec<u32> = work.items.concat();
        let seqs_at = words.len();
        words.extend_from_slice(&work.seqs);
        let indices_at = words.len();
        words.extend_from_slice(&inputs.table.kv_indices);
        let rows_at = words.len();
        words.extend_from_slice(&work.rows);
        let heads_at = words.len();
        let sinks = o.sinks.clone().unwrap_or_else(|| vec![0.0; h]);
        words.extend(sinks.iter().map(|s| s.to_bits()));
        let slopes: Vec<f32> = (0..h)
            .map(|head| {
                o.alibi_max_bias.map_or(0.0, |m| {
                    crate::model::config::alibi_slope(head, h, m as f64) as f32
                })
            })
            .collect();
        words.extend(slopes.iter().map(|s| s.to_bits()));
        if words.len() > u32::MAX as usize {
            return Err(Error::TooLarge {
                what: "a batch plan (u32 indices)".into(),
                needed: 4 * words.len() as u64,
                limit: u32::MAX as u64,
            });
        }
        gpu.check_fits("a batch plan's work list", 4 * words.len() as u64)?;
        let scratch_floats = work.partial_rows * h * (d + 1);
        gpu.check_fits("a batch plan's partial states", 4 * scratch_floats as u64)?;

        let items = seqs_at / ITEM_WORDS;
        let merge_groups = if work.partial_rows > 0 {
            Some(paged_merge::workgroups(
                gpu,
                total_q * h * shape.d4 as usize,
            )?)
        } else {
            None
        };
        let flags = (o.sinks.is_some() as u32 * FLAG_SINKS)
            | (o.alibi_max_bias.is_some() as u32 * FLAG_ALIBI)
            | (o.return_lse as u32 * FLAG_LSE);
        let params = PagedParams {
            heads: h as u32,
            kv_heads: h_kv as u32,
            head_dim: d as u32,
            page_size: ps as u32,
            hnd: (inputs.layout == KvLayout::Hnd) as u32,
            causal: o.causal as u32,
            window_left: o
                .window_left
                .map_or(NO_WINDOW, |w| w.min(u32::MAX as usize - 1) as u32),
            flags,
            scale: o.scale.unwrap_or(1.0 / (d as f32).sqrt()),
            softcap: o.softcap.unwrap_or(0.0),
            groups_x: 0,
            items: 0,
            seqs_at: seqs_at as u32,
            indices_at: indices_at as u32,
            heads_at: heads_at as u32,
            partial_rows: work.partial_rows as u32,
            q_offset: 0,
            q_row: match o.q_layout {
                QueryLayout::TokenMajor => (h * d) as u32,
                QueryLayout::HeadMajor => d as u32,
            },
            q_head: match o.q_layout {
                QueryLayout::TokenMajor => d as u32,
                QueryLayout::HeadMajor => (total_q * d) as u32,
            },
            page_shift: ps.trailing_zeros(),
            item_base: 0,
            _pad0: 0,
            _pad1: 0,
            _pad2: 0,
        };
        let merge_params = MergeParams {
            total_q: total_q as u32,
            heads: h as u32,
            head_dim: d as u32,
            rows_at: rows_at as u32,
            partial_rows: work.partial_rows as u32,
            write_lse: o.return_lse as u32,
            groups_x: merge_groups.map_or(1, |(_, x)| x),
            _pad: 0,
        };
        let built = gpu.scoped("planning a batch", || {
            let none = wgpu::BufferUsages::empty();
            (
                paged_merge::pass(gpu, shape.d4),
                gpu.uniform("paged_merge params", &merge_params),
                gpu.upload("batch plan", &words, none),
                gpu.storage("batch plan scratch", 4 * scratch_floats as u64, none),
                gpu.storage("batch plan (no lse)", 4, none),
            )
        })?;
        let (merge, merge_params, plan, scratch, no_lse) = built;
        let mut parts = Vec::new();
        let mut item_base = 0;
        for (body, items) in body_list.iter().zip(&work.items) {
            let n = items.len() / ITEM_WORDS;
            if n > 0 {
                parts.push(Part::new(gpu, *body, params, item_base, n)?);
            }
            item_base += n;
        }
        Ok(BatchAttention {
            gpu: gpu.clone(),
            shape,
            parts,
            merge,
            merge_params,
            plan,
            scratch,
            no_lse,
            merge_groups: merge_groups.map(|(g, _)| g),
            total_q,
            heads: h,
            head_dim: d,
            page_size: ps,
            kv_heads: h_kv,
            layout: inputs.layout,
            dtype: inputs.dtype,
            max_page: inputs.table.kv_indices.iter().copied().max(),
            return_lse: o.return_lse,
            chunk_keys: work.chunk_keys,
            items,
        })
    }

    /// Query rows of the step.
    pub fn total_q(&self) -> usize {
        self.total_q
    }
    /// Work items (workgroups of the attention dispatch).
    pub fn work_items(&self) -> usize {
        self.items
    }
    /// Most keys one work item covers.
    pub fn chunk_keys(&self) -> usize {
        self.chunk_keys
    }
    /// Whether the plan runs the lane-keys decode body (`paged_decode`: a decode batch on a
    /// CPU adapter) rather than the tiles of [`shape`](Self::shape).
    pub fn lane_keys(&self) -> bool {
        self.bodies().any(|b| matches!(b, Body::LaneKeys(_)))
    }

    /// Whether the plan runs the register-tiled body (`paged_prefill`: any other batch on a CPU
    /// adapter) rather than the tiles of [`shape`](Self::shape).
    pub fn register_tiled(&self) -> bool {
        self.bodies().any(|b| matches!(b, Body::RegisterTiled(_)))
    }

    /// The bodies the plan's dispatches run, in order.
    pub fn bodies(&self) -> impl Iterator<Item = Body> + '_ {
        self.parts.iter().map(|p| p.body)
    }

    /// The tile pass's shape (what runs unless [`lane_keys`](Self::lane_keys) or
    /// [`register_tiled`](Self::register_tiled)).
    pub fn shape(&self) -> PagedShape {
        self.shape
    }

    /// Records the step's attention for one layer into `encoder`: `q [total_q, H, D]` over
    /// `pool`'s pages into `out [total_q, H, D]` and, when the plan was asked for it, `lse
    /// [total_q, H]`. Makes no buffer. An `Err` (a tensor of the wrong shape, a pool of
    /// another shape or too small for the table, a buffer wgpu rejects) leaves `encoder` as
    /// it was.
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        q: &GpuTensor,
        pool: &PagedKvPool,
        out: &GpuTensor,
        lse: Option<&GpuTensor>,
    ) -> Result<()> {
        self.record_timed(encoder, q, pool, out, lse, None)
    }

    /// [`record`](Self::record) with a begin/end timestamp pair on each of its dispatches when
    /// a timer is given (see [`run_timed`](Self::run_timed)).
    pub fn record_timed(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        q: &GpuTensor,
        pool: &PagedKvPool,
        out: &GpuTensor,
        lse: Option<&GpuTensor>,
        timer: Option<&mut PassTimer>,
    ) -> Result<()> {
        self.check(q, pool, out, lse)?;
        let prepared = self.gpu.scoped("recording batched paged attention", || {
            self.prepare(q.buffer(), pool, out.buffer(), lse.map(|t| t.buffer()))
        })??;
        prepared.record(encoder, timer);
        Ok(())
    }

    /// The bind groups of one run over these buffers (q at the plan's [`QueryLayout`], `out`
    /// `[total_q, H, D]`), for a caller that checked them and makes them inside its error
    /// scope. Makes no buffer.
    pub(crate) fn prepare(
        &self,
        q: &wgpu::Buffer,
        pool: &PagedKvPool,
        out: &wgpu::Buffer,
        lse: Option<&wgpu::Buffer>,
    ) -> Result<PreparedRun<'_>> {
        let gpu = &self.gpu;
        self.check_pool(pool)?;
        let lse = lse.unwrap_or(&self.no_lse);
        let attention = self
            .parts
            .iter()
            .map(|part| {
                kernel::bind(
                    gpu,
                    &part.pass,
                    &PagedBindings {
                        params: &part.params,
                        q,
                        pool: pool.buffer(),
                        plan: &self.plan,
                        out,
                        lse,
                        scratch: &self.scratch,
                        pool_format: pool.format_buffer(),
                    },
                    part.body.quantized(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let merge = match self.merge_groups {
            Some(groups) => Some((
                paged_merge::bind(
                    gpu,
                    &self.merge,
                    &self.merge_params,
                    &self.plan,
                    &self.scratch,
                    out,
                    lse,
                )?,
                groups,
            )),
            None => None,
        };
        Ok(PreparedRun {
            plan: self,
            attention,
            merge,
        })
    }

    /// Dispatches one run records (a timer for [`run_timed`](Self::run_timed) needs as many).
    pub fn passes(&self) -> u32 {
        self.parts.len() as u32 + self.merge_groups.is_some() as u32
    }

    /// [`run`](Self::run), waited for; with a timer, each dispatch's GPU milliseconds in
    /// dispatch order (what `wgpu-mha bench --only serve` times).
    pub fn run_timed(
        &self,
        q: &GpuTensor,
        pool: &PagedKvPool,
        out: &GpuTensor,
        lse: Option<&GpuTensor>,
        mut timer: Option<&mut PassTimer>,
    ) -> Result<Vec<(&'static str, f64)>> {
        let gpu = &self.gpu;
        let mut encoder = gpu.encoder("batched paged attention (timed)");
        self.record_timed(&mut encoder, q, pool, out, lse, timer.as_deref_mut())?;
        if let Some(t) = timer.as_deref() {
            t.resolve(&mut encoder);
        }
        gpu.scoped("submitting batched paged attention", || {
            gpu.queue().submit([encoder.finish()]);
        })?;
        gpu.wait()?;
        match timer {
            Some(t) => t.read(gpu),
            None => Ok(Vec::new()),
        }
    }

    /// [`record`](Self::record), submitted.
    pub fn run(
        &self,
        q: &GpuTensor,
        pool: &PagedKvPool,
        out: &GpuTensor,
        lse: Option<&GpuTensor>,
    ) -> Result<()> {
        let mut encoder = self.gpu.encoder("batched paged attention");
        self.record(&mut encoder, q, pool, out, lse)?;
        self.gpu.scoped("submitting batched paged attention", || {
            self.gpu.queue().submit([encoder.finish()]);
        })
    }

    fn check(
        &self,
        q: &GpuTensor,
        pool: &PagedKvPool,
        out: &GpuTensor,
        lse: Option<&GpuTensor>,
    ) -> Result<()> {
        let (tq, h, d) = (self.total_q, self.heads, self.head_dim);
        let rows = [tq, h, d];
        for (what, t) in [("q", q), ("out", out)] {
            if t.shape() != rows {
                return Err(Error::Shape {
                    what: what.into(),
                    expected: format!("[total_q {tq}, H {h}, D {d}] as planned"),
                    got: t.shape().to_vec(),
                });
            }
        }
        match (lse, self.return_lse) {
            (Some(t), true) if t.shape() != [tq, h] => {
                return Err(Error::Shape {
                    what: "lse".into(),
                    expected: format!("[total_q {tq}, H {h}] as planned"),
                    got: t.shape().to_vec(),
                })
            }
            (None, true) => {
                return Err(Error::Misuse(
                    "the plan was made with return_lse: pass an lse tensor [total_q, H]".into(),
                ))
            }
            (Some(_), false) => {
                return Err(Error::Misuse(
                    "an lse tensor was given, but the plan was made without return_lse".into(),
                ))
            }
            _ => {}
        }
        if out.buffer() == q.buffer() || lse.is_some_and(|l| l.buffer() == out.buffer()) {
            return Err(Error::Misuse(
                "out (and lse) must be buffers of their own, not q's or each other's".into(),
            ));
        }
        self.check_pool(pool)
    }

    /// `Err` unless `pool` is of the planned shape and holds every page the table lists.
    fn check_pool(&self, pool: &PagedKvPool) -> Result<()> {
        let d = self.head_dim;
        let c = pool.config();
        if (c.page_size, c.kv_heads, c.head_dim, c.layout, c.dtype)
            != (self.page_size, self.kv_heads, d, self.layout, self.dtype)
        {
            return Err(Error::Misuse(format!(
                "the pool (page_size {}, kv_heads {}, head_dim {}, {:?}, {}) is not the one \
                 planned for (page_size {}, kv_heads {}, head_dim {d}, {:?}, {})",
                c.page_size,
                c.kv_heads,
                c.head_dim,
                c.layout,
                c.dtype,
                self.page_size,
                self.kv_heads,
                self.layout,
                self.dtype
            )));
        }
        if let Some(page) = self.max_page.filter(|&p| p as usize >= c.max_pages) {
            return Err(Error::PageTable(format!(
                "the table lists page {page}, past the pool's {} pages",
                c.max_pages
            )));
        }
        Ok(())
    }
}

/// One run's bind groups, ready to record (recording cannot fail).
pub(crate) struct PreparedRun<'a> {
    plan: &'a BatchAttention,
    attention: Vec<wgpu::BindGroup>,
    merge: Option<(wgpu::BindGroup, [u32; 3])>,
}

impl PreparedRun<'_> {
    /// Records the run; with a timer, a timestamp pair on each dispatch.
    pub(crate) fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        mut timer: Option<&mut PassTimer>,
    ) {
        let plan = self.plan;
        for (part, bind) in plan.parts.iter().zip(&self.attention) {
            let writes = timer.as_deref_mut().and_then(|t| t.next(part.pass.label));
            record_one(encoder, &part.pass, bind, part.groups, writes);
        }
        if let Some((bind, groups)) = &self.merge {
            let writes = timer.and_then(|t| t.next(plan.merge.label));
            record_one(encoder, &plan.merge, bind, *groups, writes);
        }
    }
}

fn record_one(
    encoder: &mut wgpu::CommandEncoder,
    pass: &Pass,
    bind: &wgpu::BindGroup,
    groups: [u32; 3],
    timestamp_writes: Option<wgpu::ComputePassTimestampWrites<'_>>,
) {
    let mut p = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some(pass.label),
        timestamp_writes,
    });
    pass.set_on(&mut p, bind);
    p.dispatch_workgroups(groups[0], groups[1], groups[2]);
}

/// One dispatch of the attention: a body over its range of the work list, with its own
/// parameters (the range's first item and count).
struct Part {
    body: Body,
    pass: Arc<Pass>,
    params: wgpu::Buffer,
    groups: [u32; 3],
}

impl Part {
    fn new(
        gpu: &Gpu,
        body: Body,
        params: PagedParams,
        item_base: usize,
        items: usize,
    ) -> Result<Self> {
        let groups = kernel::workgroups(gpu, items)?;
        let params = PagedParams {
            groups_x: groups[0],
            items: items as u32,
            item_base: item_base as u32,
            ..params
        };
        let (pass, params) = gpu.scoped("planning a batch", || {
            (
                body.pass(gpu),
                gpu.uniform("paged_attention params", &params),
            )
        })?;
        Ok(Part {
            body,
            pass,
            params,
            groups,
        })
    }
}
