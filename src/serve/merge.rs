//! `merge_states`: attention over a key set split in two — a shared prompt prefix attended once
//! for many sequences, and each sequence's own suffix — from the two parts' `(out, lse)`
//! states, as if attended at once (cascade attention). Each part's `lse` is the natural log of
//! its softmax denominator, as [`super::BatchAttention`] writes with `return_lse`.

use crate::attention::gpu_tensor::GpuTensor;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::kernels::merge_state::{self, MergeBindings};

/// One part's state: `out [n, H, D]` and `lse [n, H]` (f32).
#[derive(Debug, Clone, Copy)]
pub struct State<'a> {
    /// The part's attention output, `[n, H, D]`.
    pub out: &'a GpuTensor,
    /// The natural log of the part's softmax denominator, `[n, H]`.
    pub lse: &'a GpuTensor,
}

/// Records `merged = a ⊕ b` into `encoder`: `lse = log(exp(lse_a) + exp(lse_b))`, `out =
/// exp(lse_a − lse)·out_a + exp(lse_b − lse)·out_b`. A part that saw no key (lse −inf) weighs
/// nothing. Shapes are checked first; an `Err` leaves `encoder` as it was.
pub fn record_merge_states(
    gpu: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    a: State,
    b: State,
    merged: State,
) -> Result<()> {
    let shape = a.out.shape().to_vec();
    let [n, h, d] = shape[..] else {
        return Err(Error::Shape {
            what: "merge_states out_a".into(),
            expected: "[n, H, D]".into(),
            got: shape,
        });
    };
    for (what, t, want) in [
        ("out_b", b.out, vec![n, h, d]),
        ("merged out", merged.out, vec![n, h, d]),
        ("lse_a", a.lse, vec![n, h]),
        ("lse_b", b.lse, vec![n, h]),
        ("merged lse", merged.lse, vec![n, h]),
    ] {
        if t.shape() != want {
            return Err(Error::Shape {
                what: format!("merge_states {what}"),
                expected: format!("{want:?} (as out_a [n, H, D] = {:?})", [n, h, d]),
                got: t.shape().to_vec(),
            });
        }
    }
    let inputs = [a.out, a.lse, b.out, b.lse];
    if [merged.out, merged.lse]
        .iter()
        .any(|o| inputs.iter().any(|i| i.buffer() == o.buffer()))
        || merged.out.buffer() == merged.lse.buffer()
    {
        return Err(Error::Misuse(
            "merge_states writes its own buffers: the merged out and lse may not be an input's \
             or each other's"
                .into(),
        ));
    }
    if n * h == 0 || d == 0 {
        return Ok(());
    }
    let dispatch = gpu.scoped("recording merge_states", || {
        merge_state::dispatch(
            gpu,
            n * h,
            d,
            &MergeBindings {
                v_a: a.out.buffer(),
                s_a: a.lse.buffer(),
                v_b: b.out.buffer(),
                s_b: b.lse.buffer(),
                v_out: merged.out.buffer(),
                s_out: merged.lse.buffer(),
            },
        )
    })??;
    dispatch.record(encoder, None);
    Ok(())
}

/// [`record_merge_states`], submitted.
pub fn merge_states(gpu: &Gpu, a: State, b: State, merged: State) -> Result<()> {
    let mut encoder = gpu.encoder("merge_states");
    record_merge_states(gpu, &mut encoder, a, b, merged)?;
    gpu.scoped("submitting merge_states", || {
        gpu.queue().submit([encoder.finish()]);
    })
}
