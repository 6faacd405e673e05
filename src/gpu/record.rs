//! Recording into a command encoder, the caller's or the crate's: how per-call data reaches
//! the buffers the recorded passes read.
//!
//! Every GPU entry point records its passes into a `wgpu::CommandEncoder`; the `*_into` forms
//! take the caller's, the others make one, record, submit (one code path). Two rules make
//! several calls recorded into one encoder before it is submitted correct:
//!
//! * **Per-call data is written inside the encoder** (`Gpu::write_in`): the bytes go into a
//!   new `MAP_WRITE | COPY_SRC` buffer, and a `copy_buffer_to_buffer` command into the destination is
//!   recorded. `queue.write_buffer` would not do: it takes effect at the next submit, *before*
//!   every command buffer of that submit, so two recorded calls sharing a buffer would both see
//!   the second call's data. Commands of one encoder run in order (wgpu inserts the barriers),
//!   so each call's masks, tables and inputs are in place exactly when its passes run, and a
//!   buffer (a cached workspace, a KV cache's step buffers) can be reused by the next call
//!   recorded into the same encoder. What is written once when such a buffer is made (the
//!   per-shape uniforms of a dispatch chain, built with `create_buffer_init`) never changes.
//! * **Results are copied out inside the encoder** into buffers the caller owns (new
//!   `GpuTensor`s), so the next call may overwrite the scratch they came from.
//!
//! Lifetimes: in wgpu 30 a recorded command holds its own reference to every buffer and bind
//! group it uses (wgpu-core's `ArcCommand` keeps an `Arc` of each), and a submitted command
//! buffer keeps them until the GPU has finished it. The crate may therefore drop or replace
//! a buffer a recorded command uses (a mask buffer that grows, the staging buffer of a
//! `Gpu::write_in`) at once; nothing is freed under the GPU. An encoder that is dropped
//! without being submitted releases those references, and nothing else happens.
//!
//! Errors: wgpu 30 checks recorded commands when the encoder is *finished* and reports a
//! failure to the error scope of the thread that calls `finish` (or to the device's
//! uncaptured-error handler). The `*_into` forms validate their arguments and build everything
//! that can fail (buffers, bind groups) before they record the first command, inside the
//! crate's error scopes, so a bad argument is an `Err` and leaves the encoder as it was. Only
//! the small buffers of `Gpu::write_in` are made while recording; if the device runs out of
//! memory there, the call is an `Err` too, and the encoder holds part of it: drop it.

use wgpu::util::DeviceExt;

use crate::gpu::Gpu;

impl Gpu {
    /// Records a write of `bytes` into `dst` at byte `offset` as a command of `encoder` (see the
    /// module docs for why not `queue.write_buffer`). `offset` and `bytes.len()` are multiples
    /// of 4 (`wgpu::COPY_BUFFER_ALIGNMENT`), as every f32/u32 payload of the crate is; `dst`
    /// needs `COPY_DST`. Nothing is recorded for no bytes.
    pub(crate) fn write_in(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        dst: &wgpu::Buffer,
        offset: u64,
        bytes: &[u8],
    ) {
        if bytes.is_empty() {
            return;
        }
        let src = self
            .device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("per-call data"),
                contents: bytes,
                // MAP_WRITE: mapped at creation in host-visible memory and filled in place, no
                // staging copy behind it (what `queue.write_buffer` costs, too).
                usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            });
        // The recorded copy keeps `src` alive until the GPU has run it (module docs).
        encoder.copy_buffer_to_buffer(&src, 0, dst, offset, bytes.len() as u64);
    }
}
