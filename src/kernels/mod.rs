//! One module per pass: each owns its WGSL source, its `#[repr(C)]` parameter struct, its
//! bind-group layout, its pipeline and its dispatch geometry.
//!
//! Binding numbers are shared across passes so the layouts read alike:
//! 0 = uniform params, 1–3 = read-only inputs, 4 = the output, 6 = mask words.

pub mod av_combine;
pub mod flash_attention;
pub mod linear;
pub mod scores;
pub mod softmax;
pub mod standalone;

/// Sources shared by several passes (prepended by the host; WGSL has no `#include`).
pub const GEMM_TILE_WGSL: &str = include_str!("../../shaders/gemm_tile.wgsl");
pub const MASK_WGSL: &str = include_str!("../../shaders/mask.wgsl");

/// Mirrors `MaskParams` in `mask.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MaskParams {
    pub kind: u32,
    pub causal_offset: i32,
    pub base: u32,
    pub batch_base: u32,
    pub strides: [u32; 4],
}

impl MaskParams {
    pub(crate) fn from_resolved(m: &crate::model::mask::ResolvedMask) -> Self {
        MaskParams {
            kind: m.kind as u32,
            causal_offset: m.causal_offset.clamp(i32::MIN as i64, i32::MAX as i64) as i32,
            base: m.base,
            batch_base: m.batch_base,
            strides: m.strides,
        }
    }
}

/// What a binding slot holds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Slot {
    Uniform(u32),
    Read(u32),
    Write(u32),
}

/// Whether wgpu adds its runtime bounds checks to a shader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checks {
    /// wgpu's default: every storage access is clamped or checked.
    Checked,
    /// No runtime checks. Only for a pass whose host code proves every index in range for
    /// every dispatch it records (the proof is a comment at the call site).
    Unchecked,
}

/// A compiled pass: its pipeline and the layout its bind groups must follow.
#[derive(Debug)]
pub(crate) struct Pass {
    pub label: &'static str,
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    slots: Vec<Slot>,
}

impl Pass {
    /// Compiles `source` (entry point `main`, wgpu's runtime bounds checks on) and builds a
    /// layout with the given slots.
    pub fn new(device: &wgpu::Device, label: &'static str, source: &str, slots: &[Slot]) -> Self {
        Self::build(device, label, source, "main", Checks::Checked, slots)
    }

    /// `new` with a chosen entry point and runtime checks.
    pub fn build(
        device: &wgpu::Device,
        label: &'static str,
        source: &str,
        entry_point: &str,
        checks: Checks,
        slots: &[Slot],
    ) -> Self {
        let entries: Vec<wgpu::BindGroupLayoutEntry> = slots
            .iter()
            .map(|slot| {
                let (binding, ty) = match *slot {
                    Slot::Uniform(b) => (b, wgpu::BufferBindingType::Uniform),
                    Slot::Read(b) => (b, wgpu::BufferBindingType::Storage { read_only: true }),
                    Slot::Write(b) => (b, wgpu::BufferBindingType::Storage { read_only: false }),
                };
                wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                }
            })
            .collect();
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(label),
            entries: &entries,
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(label),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let module = match checks {
            Checks::Checked => device.create_shader_module(desc),
            // SAFETY: only passes whose every buffer index the host proves in range ask for
            // this (see `Checks::Unchecked`); the shader is still validated by naga.
            Checks::Unchecked => unsafe {
                device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            },
        };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(entry_point),
            compilation_options: Default::default(),
            cache: None,
        });
        Pass {
            label,
            pipeline,
            layout,
            slots: slots.to_vec(),
        }
    }

    /// A bind group whose buffers are given in slot order.
    pub fn bind(&self, device: &wgpu::Device, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = self
            .slots
            .iter()
            .zip(buffers)
            .map(|(slot, buffer)| wgpu::BindGroupEntry {
                binding: match *slot {
                    Slot::Uniform(b) | Slot::Read(b) | Slot::Write(b) => b,
                },
                resource: buffer.as_entire_binding(),
            })
            .collect();
        device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(self.label),
            layout: &self.layout,
            entries: &entries,
        })
    }

    /// Records one dispatch in its own compute pass (so each pass can be timed).
    pub fn dispatch(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        bind_group: &wgpu::BindGroup,
        workgroups: [u32; 3],
        timer: Option<&mut crate::gpu::timer::PassTimer>,
    ) {
        let timestamp_writes = timer.and_then(|t| t.next(self.label));
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(self.label),
            timestamp_writes,
        });
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, bind_group, &[]);
        pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
    }
}

/// A uniform buffer holding one parameter struct.
pub(crate) fn uniform_buffer<T: bytemuck::Pod>(
    device: &wgpu::Device,
    label: &str,
    value: &T,
) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytemuck::bytes_of(value),
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    })
}
