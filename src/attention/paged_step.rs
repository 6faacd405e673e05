//! The module on a page pool: the new tokens of many sequences, packed as `[tokens, E]`, are
//! projected, rotated at their own positions, appended to the layer's pool and attended
//! through the step's plan, then projected out — the seeds' forward, with a serving step's
//! memory (see `crate::serve`).

use super::chain_buffers::{Bound, Geometry, Placement, RopeTables};
use super::gpu_tensor::GpuTensor;
use super::workspace::{front, output_projection};
use super::{MultiHeadAttention, Precision};
use crate::error::{Error, Result};
use crate::kernels::mask::MaskBuffers;
use crate::kernels::{QkvBuffers, QkvLayout};
use crate::serve::{
    BatchAttention, NewKv, PageTable, PagedKvPool, PagedStep, PoolConfig, WarmPasses,
};

impl MultiHeadAttention {
    /// Records this layer's part of `step` into `encoder`: `x [tokens, model_dim]` (the step's
    /// new tokens, sequence after sequence as its `qo_indptr` orders them) projected to Q, K,
    /// V, rotated by each token's own position, K and V appended to `pool` (this layer's), the
    /// queries attended over every sequence's pages (bottom-right causal), and the output
    /// projection. Returns `[tokens, output_dim]`, the caller's, holding the result once
    /// `encoder` has run. Layers of one step may be recorded into one encoder, each reading
    /// the previous one's output.
    ///
    /// Refused (`Err`, before anything is recorded): modules whose attention a pool does not
    /// hold yet — appended keys (`add_bias_kv`, `add_zero_attn`), latent K = V caches, sinks,
    /// Llama 4's chunked attention and temperature tuning, output gates and norms, f16
    /// precision, separate key/value inputs, query and value head sizes that differ — and a
    /// step or pool of other shapes.
    pub fn record_paged_step(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        step: &PagedStep,
        pool: &PagedKvPool,
        x: &GpuTensor,
    ) -> Result<GpuTensor> {
        self.check_paged(step, pool, x)?;
        let c = &self.config;
        let gpu = &self.gpu;
        let t = step.tokens();
        if t == 0 {
            return GpuTensor::zeros(gpu, &[0, c.output_dim()]);
        }
        let (h, h_kv, d) = (c.heads, c.kv_heads, c.qk_head_dim);
        let layout = QkvLayout {
            q_offset: 0,
            k_offset: (h * t * d) as u32,
            v_offset: ((h + h_kv) * t * d) as u32,
            kv_stride: t as u32,
            kv_group: c.kv_group() as u32,
        };
        let geometry = Geometry {
            batch: 1,
            lq: t,
            lk: t,
            kv_pos: 0,
            appended: 0,
            layout,
            fused: true,
        };
        let table = c.rope.as_ref().map(|rope| {
            let seq_len = crate::model::rope::seq_len(step.positions());
            (rope.table(step.positions(), seq_len), seq_len)
        });
        if let (Some(rope), Some((_, seq_len))) = (&c.rope, &table) {
            rope.check_cached_step(*seq_len)?;
        }
        let out_dim = c.output_dim();
        let prepared = gpu.scoped("recording a paged step", || -> Result<_> {
            let none = wgpu::BufferUsages::empty();
            let qkv = gpu.storage("paged step qkv", 4 * (t * (h + 2 * h_kv) * d) as u64, none);
            let combined = GpuTensor::zeros(gpu, &[t, h * c.v_head_dim])?;
            let output = match self.weights.w_o {
                Some(_) => Some(GpuTensor::zeros(gpu, &[t, out_dim])?),
                None => None,
            };
            let carry = gpu.storage("paged step (no carry)", 16, none);
            let mask = MaskBuffers::new(gpu, 1);
            let rope = table
                .as_ref()
                .map(|(data, _)| gpu.storage("paged step rope", 4 * data.len() as u64, none));
            let bound = Bound {
                query: x.buffer(),
                key: x.buffer(),
                value: x.buffer(),
                qkv: QkvBuffers::packed(&qkv),
                scores: None,
                combined: combined.buffer(),
                gate: None,
                output: output.as_ref().map(|o| o.buffer()),
                carry: &carry,
                mask: &mask,
                rope: rope.as_ref().map(|r| RopeTables { q: r, k: r }),
                chunks: None,
                at: Placement::default(),
            };
            let before = front(self, &geometry, &bound)?;
            let new = NewKv {
                keys: &qkv,
                values: &qkv,
                k_offset: layout.k_offset as usize,
                v_offset: layout.v_offset as usize,
                row_stride: d,
                head_stride: t * d,
                tokens: t,
            };
            let append = pool.append_dispatch(gpu, &new, &step.slots)?;
            let after = output_projection(self, &geometry, &bound, t)?;
            Ok((before, append, after, combined, output, rope, qkv))
        })??;
        let (before, append, after, combined, output, rope, qkv) = prepared;
        // The attention's bind groups, over the buffers just made.
        let attention = gpu.scoped("recording a paged step", || {
            step.plan.prepare(&qkv, pool, combined.buffer(), None)
        })??;
        if let (Some(buffer), Some((data, _))) = (&rope, &table) {
            gpu.write_in(encoder, buffer, 0, bytemuck::cast_slice(data));
        }
        for dispatch in before.iter().chain([&append]) {
            dispatch.record(encoder, None);
        }
        attention.record(encoder, None);
        for dispatch in &after {
            dispatch.record(encoder, None);
        }
        Ok(output.unwrap_or(combined))
    }

    /// [`record_paged_step`](Self::record_paged_step), submitted.
    pub fn forward_paged_step(
        &self,
        step: &PagedStep,
        pool: &PagedKvPool,
        x: &GpuTensor,
    ) -> Result<GpuTensor> {
        let mut encoder = self.gpu.encoder("paged step");
        let out = self.record_paged_step(&mut encoder, step, pool, x)?;
        self.gpu.scoped("submitting a paged step", || {
            self.gpu.queue().submit([encoder.finish()]);
        })?;
        Ok(out)
    }

    /// Compiles every pass this layer's paged steps over pools of `pool`'s shape can run —
    /// projections, RoPE, the append, each attention body at every width of query rows and
    /// the merge — so that no step compiles anything, and returns them held: keep the result
    /// for as long as you serve. The projections and the append are compiled by running one
    /// token of zeros through a one-page pool of `pool`'s shape (made and dropped here); the
    /// caller's pools are not touched. Refused as [`record_paged_step`](Self::record_paged_step)
    /// refuses a module or pool.
    pub fn warm_up_paged(&self, pool: &PoolConfig) -> Result<WarmPasses> {
        self.check_paged_config(pool)?;
        let c = &self.config;
        let gpu = &self.gpu;
        let (warmed, passes) = gpu.passes_used_by(|| -> Result<()> {
            // Its passes are in the list `passes_used_by` returns.
            let _attention =
                BatchAttention::warm_up(gpu, c.heads, c.kv_heads, c.qk_head_dim, pool.dtype)?;
            let scratch_config = PoolConfig {
                max_pages: 1,
                ..*pool
            };
            let scratch = PagedKvPool::new(gpu, scratch_config)?;
            let table = PageTable {
                kv_indptr: vec![0, 1],
                kv_indices: vec![0],
                kv_last_page_len: vec![1],
            };
            let step = PagedStep::new(gpu, c, &scratch_config, &[0, 1], &table, None)?;
            let x = GpuTensor::zeros(gpu, &[1, c.model_dim])?;
            // Read back so that the step has run (and any error of it is this call's).
            self.forward_paged_step(&step, &scratch, &x)?.read(gpu)?;
            Ok(())
        });
        warmed?;
        Ok(WarmPasses::new(passes))
    }

    fn check_paged(&self, step: &PagedStep, pool: &PagedKvPool, x: &GpuTensor) -> Result<()> {
        self.check_paged_config(pool.config())?;
        let c = &self.config;
        if *pool.config() != step.pool {
            return Err(Error::Misuse(format!(
                "the pool {:?} is not of the step's shape {:?}",
                pool.config(),
                step.pool
            )));
        }
        let planned = (step.heads, step.scale, step.softcap, step.alibi);
        let ours = (c.heads, c.scale(), c.softcap, c.alibi);
        if planned != ours {
            return Err(Error::Misuse(format!(
                "this layer's attention (heads, scale, softcap, ALiBi) = {ours:?} is not the \
                 step's {planned:?}"
            )));
        }
        let want = [step.tokens(), c.model_dim];
        if x.shape() != want {
            return Err(Error::Shape {
                what: "paged step input".into(),
                expected: format!("[tokens {}, model_dim {}]", want[0], want[1]),
                got: x.shape().to_vec(),
            });
        }
        Ok(())
    }

    /// `Err` unless this module can run on a pool of `pool`'s shape.
    fn check_paged_config(&self, pool: &PoolConfig) -> Result<()> {
        let c = &self.config;
        let refuse = |what: &str| {
            Err(Error::Unsupported {
                adapter: self.gpu.describe(),
                what: format!("{what} on a page pool (use a KvCache)"),
            })
        };
        if c.appended_keys() > 0 {
            return refuse("appended keys (add_bias_kv, add_zero_attn)");
        }
        if c.values_from_keys {
            return refuse("a latent cache whose values are its keys");
        }
        if c.sinks {
            return refuse("attention sinks");
        }
        if let Some(chunk) = c.chunked {
            return refuse(&format!(
                "Llama 4's chunked attention (chunks of {chunk} positions; a step takes a window)"
            ));
        }
        if c.temperature.is_some() {
            return refuse("Llama 4's attention temperature tuning");
        }
        if c.output_gate || c.output_norm.is_some() {
            return refuse("an output gate or norm");
        }
        if self.precision == Precision::F16 {
            return refuse("an f16-precision module");
        }
        if c.model_dim != c.key_dim || c.key_dim != c.value_dim {
            return refuse("separate key/value inputs (key_dim or value_dim ≠ model_dim)");
        }
        if c.qk_head_dim != c.v_head_dim {
            return refuse("value heads of another size than query heads");
        }
        if c.kv_heads != pool.kv_heads || c.qk_head_dim != pool.head_dim {
            return Err(Error::Misuse(format!(
                "this layer's kv_heads {} / head size {} are not the pool's ({} / {})",
                c.kv_heads, c.qk_head_dim, pool.kv_heads, pool.head_dim
            )));
        }
        Ok(())
    }
}
