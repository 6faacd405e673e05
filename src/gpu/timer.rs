//! Per-pass GPU times from timestamp queries (when the adapter has TIMESTAMP_QUERY).

use crate::error::Result;
use crate::gpu::Gpu;

/// Hands out a begin/end timestamp pair to each compute pass of one forward.
pub struct PassTimer {
    query_set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    capacity: u32,
    labels: Vec<&'static str>,
}

impl PassTimer {
    /// `None` when the adapter cannot time passes.
    pub fn new(gpu: &Gpu, max_passes: u32) -> Option<Self> {
        if !gpu.has_timestamps() {
            return None;
        }
        let capacity = max_passes * 2;
        let device = gpu.device();
        let query_set = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("pass timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        let bytes = capacity as u64 * 8;
        let resolve = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamp resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamp readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Some(PassTimer {
            query_set,
            resolve,
            staging,
            capacity,
            labels: Vec::new(),
        })
    }

    /// Timestamp writes for the next pass, or `None` once the set is full.
    pub(crate) fn next(
        &mut self,
        label: &'static str,
    ) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let index = self.labels.len() as u32 * 2;
        if index + 2 > self.capacity {
            return None;
        }
        self.labels.push(label);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.query_set,
            beginning_of_pass_write_index: Some(index),
            end_of_pass_write_index: Some(index + 1),
        })
    }

    /// Records the resolve and copy at the end of the forward's encoder.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let n = self.labels.len() as u32 * 2;
        if n == 0 {
            return;
        }
        encoder.resolve_query_set(&self.query_set, 0..n, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.staging, 0, n as u64 * 8);
    }

    /// After the submit: milliseconds per pass, in dispatch order. Clears the labels.
    pub fn read(&mut self, gpu: &Gpu) -> Result<Vec<(&'static str, f64)>> {
        let n = self.labels.len() * 2;
        if n == 0 {
            return Ok(Vec::new());
        }
        let raw = gpu.read_bytes(&self.staging, (n * 8) as u64)?;
        let ticks: &[u64] = bytemuck::cast_slice(&raw);
        let period_ns = gpu.queue().get_timestamp_period() as f64;
        let times = self
            .labels
            .drain(..)
            .enumerate()
            .map(|(i, label)| {
                let dt = ticks[2 * i + 1].wrapping_sub(ticks[2 * i]) as f64;
                (label, dt * period_ns / 1e6)
            })
            .collect();
        Ok(times)
    }
}
