//! `GpuTensor`: an `f32` tensor that lives in a GPU storage buffer, so attention layers can be
//! chained without a round trip through host memory.
//!
//! Moving data between host and device is always explicit:
//!
//! * [`GpuTensor::upload`] copies a host [`Tensor`] into a new device buffer;
//! * [`GpuTensor::read`] copies it back and blocks until the GPU is done;
//! * [`GpuTensor::read_async`] returns a future for the same copy, for callers that must not block.
//!
//! [`MultiHeadAttention::forward_gpu`](crate::MultiHeadAttention::forward_gpu) takes and returns
//! `GpuTensor`s: it records one command encoder, submits it once and reads nothing back.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::tensor::Tensor;

/// A row-major `f32` tensor in a GPU storage buffer (`STORAGE | COPY_SRC | COPY_DST`).
///
/// The buffer belongs to the device of the [`Gpu`] that made it; pass the same `Gpu` to
/// [`read`](Self::read) and to modules that consume it. Cloning is cheap and shares the buffer.
#[derive(Debug, Clone)]
pub struct GpuTensor {
    shape: Vec<usize>,
    buffer: wgpu::Buffer,
}

fn elements(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl GpuTensor {
    /// Copies a host tensor into a new device buffer (queued; it is on the GPU before any
    /// later submission runs).
    pub fn upload(gpu: &Gpu, tensor: &Tensor) -> Result<Self> {
        let out = Self::zeros(gpu, tensor.shape())?;
        if !tensor.is_empty() {
            gpu.scoped("uploading a tensor", || {
                gpu.queue()
                    .write_buffer(&out.buffer, 0, bytemuck::cast_slice(tensor.data()))
            })?;
        }
        Ok(out)
    }

    /// A new device tensor of zeros.
    pub fn zeros(gpu: &Gpu, shape: &[usize]) -> Result<Self> {
        let what = format!("a GPU tensor of shape {shape:?}");
        let bytes = shape
            .iter()
            .try_fold(4u64, |n, &d| n.checked_mul(d as u64))
            .unwrap_or(u64::MAX);
        gpu.check_fits(&what, bytes)?;
        // New buffers are zero-filled.
        let buffer = gpu.scoped("allocating a GPU tensor", || {
            gpu.storage("GpuTensor", bytes, wgpu::BufferUsages::COPY_SRC)
        })?;
        Ok(GpuTensor {
            shape: shape.to_vec(),
            buffer,
        })
    }

    /// Wraps an existing buffer. It needs `STORAGE | COPY_SRC | COPY_DST` usage and at least
    /// `4 · product(shape)` bytes; both are checked.
    pub fn from_buffer(shape: &[usize], buffer: wgpu::Buffer) -> Result<Self> {
        let bytes = 4 * elements(shape) as u64;
        let needed = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        if !buffer.usage().contains(needed) {
            return Err(Error::Misuse(format!(
                "a GpuTensor buffer needs usage {needed:?}, this one has {:?}",
                buffer.usage()
            )));
        }
        if buffer.size() < bytes {
            return Err(Error::DataLength {
                what: "GPU buffer".into(),
                shape: shape.to_vec(),
                expected: elements(shape),
                got: (buffer.size() / 4) as usize,
            });
        }
        Ok(GpuTensor {
            shape: shape.to_vec(),
            buffer,
        })
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        elements(&self.shape)
    }
    /// Whether it has no elements (some dimension is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Size of the data in bytes (the buffer may be a little larger).
    pub fn byte_len(&self) -> u64 {
        4 * self.len() as u64
    }
    /// The storage buffer, for binding it in your own passes. Element `i` is at byte `4·i`.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Copies the tensor back to the host, blocking until every earlier submission that writes
    /// it has finished.
    pub fn read(&self, gpu: &Gpu) -> Result<Tensor> {
        let staging = self.copy_to_staging(gpu)?;
        let values = gpu.read_f32(&staging, self.len())?;
        Tensor::new(self.shape.clone(), values)
    }

    /// The non-blocking variant of [`read`](Self::read): the copy is submitted now and the
    /// returned future resolves to the host tensor once the GPU has finished.
    ///
    /// On native backends wgpu runs map callbacks only while the device is polled, so each poll of
    /// the future polls the device once (without blocking) and, while the data is not ready,
    /// re-schedules itself; it therefore makes progress on any executor (`pollster::block_on`,
    /// tokio, …) without a helper thread, at the cost of keeping that executor busy while it waits.
    pub fn read_async(&self, gpu: &Gpu) -> ReadFuture {
        let len = self.len();
        let shape = self.shape.clone();
        let staging = match self.copy_to_staging(gpu) {
            Ok(s) => s,
            Err(e) => {
                return ReadFuture {
                    state: ReadState::Failed(e),
                }
            }
        };
        if len == 0 {
            return ReadFuture {
                state: ReadState::Empty(Box::new(EmptyRead {
                    shape,
                    #[cfg(target_arch = "wasm32")]
                    scopes: gpu.deferred_scopes(),
                })),
            };
        }
        let done = Arc::new(Mutex::new(MapSlot::default()));
        let slot = done.clone();
        staging
            .slice(0..4 * len as u64)
            .map_async(wgpu::MapMode::Read, move |r| {
                if let Ok(mut s) = slot.lock() {
                    s.result = Some(r.map_err(|e| e.to_string()));
                    if let Some(w) = s.waker.take() {
                        w.wake();
                    }
                }
            });
        ReadFuture {
            state: ReadState::Mapping(Box::new(Mapping {
                gpu: gpu.clone(),
                staging,
                shape,
                done,
                #[cfg(target_arch = "wasm32")]
                scopes: gpu.deferred_scopes(),
            })),
        }
    }

    /// Records and submits a copy of the data into a new `MAP_READ` buffer.
    fn copy_to_staging(&self, gpu: &Gpu) -> Result<wgpu::Buffer> {
        gpu.scoped("reading a GPU tensor", || {
            let staging = gpu.staging("GpuTensor readback", self.byte_len());
            if self.byte_len() > 0 {
                let mut encoder = gpu.encoder("GpuTensor readback");
                encoder.copy_buffer_to_buffer(&self.buffer, 0, &staging, 0, self.byte_len());
                gpu.queue().submit([encoder.finish()]);
            }
            staging
        })
    }
}

#[derive(Default)]
struct MapSlot {
    result: Option<std::result::Result<(), String>>,
    waker: Option<std::task::Waker>,
}

struct Mapping {
    gpu: Gpu,
    staging: wgpu::Buffer,
    shape: Vec<usize>,
    done: Arc<Mutex<MapSlot>>,
    /// In the browser, the error scopes of everything recorded before this read (see
    /// `gpu::deferred`): their first error is this read's.
    #[cfg(target_arch = "wasm32")]
    scopes: crate::gpu::deferred::ScopeResults,
}

/// A read of an empty tensor: nothing to map, but in the browser the kept error scopes are
/// still this read's to await, as a non-empty read's.
struct EmptyRead {
    shape: Vec<usize>,
    #[cfg(target_arch = "wasm32")]
    scopes: crate::gpu::deferred::ScopeResults,
}

enum ReadState {
    Mapping(Box<Mapping>),
    /// Ready at the first poll.
    Failed(Error),
    /// Ready at the first poll natively; in the browser once the kept scopes have answered.
    Empty(Box<EmptyRead>),
    Finished,
}

/// The future of [`GpuTensor::read_async`]; resolves to the host tensor.
#[must_use = "the copy is only read back when the future is polled"]
pub struct ReadFuture {
    state: ReadState,
}

impl Future for ReadFuture {
    type Output = Result<Tensor>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let readback_error = |message: String| Error::Gpu {
            stage: "readback".into(),
            message,
        };
        match std::mem::replace(&mut self.state, ReadState::Finished) {
            ReadState::Finished => Poll::Ready(Err(readback_error(
                "the future was polled after it finished".into(),
            ))),
            ReadState::Failed(e) => Poll::Ready(Err(e)),
            #[allow(unused_mut)] // mutated in the browser only
            ReadState::Empty(mut empty) => {
                #[cfg(target_arch = "wasm32")]
                match Pin::new(&mut empty.scopes).poll(cx) {
                    Poll::Pending => {
                        self.state = ReadState::Empty(empty);
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(())) => {}
                }
                Poll::Ready(Ok(Tensor::zeros(empty.shape)))
            }
            #[allow(unused_mut)] // mutated in the browser only
            ReadState::Mapping(mut mapping) => {
                #[cfg(target_arch = "wasm32")]
                match Pin::new(&mut mapping.scopes).poll(cx) {
                    Poll::Pending => {
                        self.state = ReadState::Mapping(mapping);
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(())) => {}
                }
                let Mapping {
                    gpu,
                    staging,
                    shape,
                    done,
                    ..
                } = &*mapping;
                let polled = {
                    let _serial = gpu.serialize();
                    gpu.device().poll(wgpu::PollType::Poll)
                };
                if let Err(e) = polled {
                    return Poll::Ready(Err(readback_error(e.to_string())));
                }
                if let Err(e) = gpu.check_alive() {
                    return Poll::Ready(Err(e));
                }
                let result = match done.lock() {
                    Ok(mut slot) => {
                        let r = slot.result.take();
                        if r.is_none() {
                            slot.waker = Some(cx.waker().clone());
                        }
                        r
                    }
                    Err(_) => Some(Err("map state poisoned".into())),
                };
                match result {
                    None => {
                        self.state = ReadState::Mapping(mapping);
                        // Natively nobody else polls the device: ask to be polled again. In the
                        // browser the map's callback wakes us (waking here would spin on the
                        // microtask queue and starve the event loop that answers the map).
                        #[cfg(not(target_arch = "wasm32"))]
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    Some(Err(message)) => Poll::Ready(Err(readback_error(message))),
                    Some(Ok(())) => {
                        let len = elements(shape);
                        let values: Vec<f32> = {
                            let range = staging
                                .slice(0..4 * len as u64)
                                .get_mapped_range()
                                .map_err(|e| readback_error(e.to_string()));
                            match range {
                                Ok(r) => bytemuck::pod_collect_to_vec(&r),
                                Err(e) => return Poll::Ready(Err(e)),
                            }
                        };
                        staging.unmap();
                        Poll::Ready(Tensor::new(shape.clone(), values))
                    }
                }
            }
        }
    }
}
