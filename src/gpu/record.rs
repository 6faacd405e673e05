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
//! uncaptured-error handler) — too late for a call to refuse: the caller's whole submission
//! would fail, its own passes included. So the `*_into` forms validate their arguments and
//! build everything that can fail (buffers, pipelines, bind groups) before they record the
//! first command, inside error scopes that are popped and checked first; a caller's buffer
//! that is only copied from (a `GpuTensor` input of the module) is tried in a scratch encoder
//! that is finished inside such a scope and never submitted (`Gpu::check_copy_sources`).
//! A bad argument is then an `Err` and leaves the encoder exactly as it was. Only the small
//! buffers of `Gpu::write_in` are made while recording; if the device runs out of memory
//! there, the call is an `Err` too, and the encoder holds part of it: drop it.

use wgpu::util::DeviceExt;

use crate::error::Result;
use crate::gpu::Gpu;

impl Gpu {
    /// `Err` naming the first of `sources` that wgpu would reject as the source of a copy in
    /// this device's encoders — a buffer of another device, one without `COPY_SRC`, a
    /// destroyed one — found inside an error scope with nothing recorded anywhere that runs:
    /// such a copy in a scratch encoder, finished and dropped unsubmitted (device and usage:
    /// wgpu 30 checks them at `finish`), and a bind group of its first word (liveness: a
    /// destroyed source only fails the copy at `submit`, a bind group at once). The sources
    /// are storage buffers (`GpuTensor`s).
    pub(crate) fn check_copy_sources(&self, sources: &[(&str, &wgpu::Buffer)]) -> Result<()> {
        for (i, (name, buffer)) in sources.iter().enumerate() {
            // The crate's tensors are never under a word; one buffer given twice is tried once.
            if buffer.size() < 4 || sources[..i].iter().any(|(_, b)| b == buffer) {
                continue;
            }
            self.scoped(&format!("checking {name}'s buffer"), || {
                let scratch = self.device().create_buffer(&wgpu::BufferDescriptor {
                    label: Some("source check"),
                    size: 4,
                    usage: wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                let mut encoder = self.encoder("source check");
                encoder.copy_buffer_to_buffer(buffer, 0, &scratch, 0, 4);
                drop(encoder.finish());
                let layout =
                    self.device()
                        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                            label: Some("source check"),
                            entries: &[wgpu::BindGroupLayoutEntry {
                                binding: 0,
                                visibility: wgpu::ShaderStages::COMPUTE,
                                ty: wgpu::BindingType::Buffer {
                                    ty: wgpu::BufferBindingType::Storage { read_only: true },
                                    has_dynamic_offset: false,
                                    min_binding_size: None,
                                },
                                count: None,
                            }],
                        });
                self.device().create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("source check"),
                    layout: &layout,
                    entries: &[wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer,
                            offset: 0,
                            size: wgpu::BufferSize::new(4),
                        }),
                    }],
                })
            })?;
        }
        Ok(())
    }

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
