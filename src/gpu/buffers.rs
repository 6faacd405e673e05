//! Buffers and the device limits they must respect: one padding rule, one binding limit.

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Bytes a buffer of `bytes` really gets: whole vec4s (16 bytes), never zero. wgpu rejects
/// zero-sized bindings, and vec4 views of a buffer (`linear_vec4`) must cover every element.
pub fn padded_size(bytes: u64) -> u64 {
    bytes.max(16).next_multiple_of(16)
}

impl Gpu {
    /// The most bytes one storage binding (and so one buffer the passes read) may hold.
    pub fn binding_limit(&self) -> u64 {
        let l = self.limits();
        l.max_storage_buffer_binding_size.min(l.max_buffer_size)
    }

    /// `Err(TooLarge)` naming `what` when `bytes` exceed [`binding_limit`](Self::binding_limit).
    pub fn check_fits(&self, what: &str, bytes: u64) -> Result<()> {
        let limit = self.binding_limit();
        if bytes > limit {
            return Err(Error::TooLarge {
                what: what.into(),
                needed: bytes,
                limit,
            });
        }
        Ok(())
    }

    /// `Err(TooLarge)` when a dispatch has more workgroups along a dimension than the device
    /// allows.
    pub fn check_workgroups(&self, what: &str, groups: [u32; 3]) -> Result<()> {
        let max = self.limits().max_compute_workgroups_per_dimension;
        match groups.iter().copied().max() {
            Some(g) if g > max => Err(Error::TooLarge {
                what: format!("a {what} dispatch of {groups:?} workgroups (count, not bytes)"),
                needed: g as u64,
                limit: max as u64,
            }),
            _ => Ok(()),
        }
    }

    /// A zero-filled storage buffer of at least `bytes` (see [`padded_size`]).
    pub fn storage(&self, label: &str, bytes: u64, extra: wgpu::BufferUsages) -> wgpu::Buffer {
        self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded_size(bytes),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | extra,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `data` (zero-padded to [`padded_size`]).
    pub fn upload<T: bytemuck::Pod + Default>(
        &self,
        label: &str,
        data: &[T],
        extra: wgpu::BufferUsages,
    ) -> wgpu::Buffer {
        let elem = std::mem::size_of::<T>();
        let mut padded = data.to_vec();
        padded.resize(
            padded_size(std::mem::size_of_val(data) as u64) as usize / elem,
            T::default(),
        );
        self.device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::cast_slice(&padded),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | extra,
            })
    }

    /// `data` as f16 (`as_f16`) or f32 in a new storage buffer.
    pub fn upload_f32_as(&self, label: &str, data: &[f32], as_f16: bool) -> wgpu::Buffer {
        let none = wgpu::BufferUsages::empty();
        if as_f16 {
            let half: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
            self.upload(label, &half, none)
        } else {
            self.upload(label, data, none)
        }
    }

    /// A uniform buffer holding one parameter struct.
    pub fn uniform<T: bytemuck::Pod>(&self, label: &str, value: &T) -> wgpu::Buffer {
        self.device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::bytes_of(value),
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            })
    }

    /// A `MAP_READ` buffer to copy results into for readback.
    pub fn staging(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded_size(bytes),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::padded_size;

    #[test]
    fn buffers_are_whole_vec4s_and_never_empty() {
        assert_eq!(padded_size(0), 16);
        assert_eq!(padded_size(1), 16);
        assert_eq!(padded_size(16), 16);
        assert_eq!(padded_size(17), 32);
        assert_eq!(padded_size(4 * 1001), 4016);
    }
}
