//! A compiled compute pass (pipeline + bind-group layout) and one recorded use of it
//! ([`Dispatch`]: its uniform parameters, its bind group and its workgroup counts).
//!
//! Kernel modules (`src/kernels/`) build both; nothing here knows any shader.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::timer::PassTimer;
use crate::gpu::Gpu;

/// What a binding slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Uniform(u32),
    Read(u32),
    Write(u32),
}

impl Slot {
    pub fn binding(self) -> u32 {
        match self {
            Slot::Uniform(b) | Slot::Read(b) | Slot::Write(b) => b,
        }
    }
}

/// Whether wgpu adds its runtime bounds checks to a shader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checks {
    /// wgpu's default: every storage access is clamped or checked.
    Checked,
    /// No runtime checks. Only for a pass whose host code proves every index in range for
    /// every dispatch it records (the proof is a comment at the call site).
    Unchecked,
}

/// How to build a pass: its label (in timers and errors), entry point, runtime checks and the
/// binding slots of its layout.
#[derive(Debug, Clone, Copy)]
pub struct PassSpec<'a> {
    pub label: &'static str,
    pub entry: &'a str,
    pub checks: Checks,
    pub slots: &'a [Slot],
}

impl<'a> PassSpec<'a> {
    /// Entry point `main`, wgpu's runtime checks on.
    pub const fn main(label: &'static str, slots: &'a [Slot]) -> Self {
        PassSpec {
            label,
            entry: "main",
            checks: Checks::Checked,
            slots,
        }
    }
}

/// A buffer bound to a slot: whole, or a byte range of it (a caller's view into a buffer larger
/// than one binding: see `sdpa::DeviceTensor`). The range's offset is a multiple of
/// `min_storage_buffer_offset_alignment` and its size of 4, within the binding limit; the
/// kernels' element offsets are counted from its start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Binding<'a> {
    pub buffer: &'a wgpu::Buffer,
    /// `(offset, size)` in bytes; `None`: the whole buffer.
    pub range: Option<(u64, u64)>,
}

impl<'a> Binding<'a> {
    pub fn new(buffer: &'a wgpu::Buffer, range: Option<(u64, u64)>) -> Self {
        Binding { buffer, range }
    }

    fn resource(&self) -> wgpu::BindingResource<'a> {
        match self.range {
            None => self.buffer.as_entire_binding(),
            Some((offset, size)) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: self.buffer,
                offset,
                size: wgpu::BufferSize::new(size),
            }),
        }
    }
}

impl<'a> From<&'a wgpu::Buffer> for Binding<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        Binding {
            buffer,
            range: None,
        }
    }
}

/// A compiled pass: its pipeline and the layout its bind groups must follow.
#[derive(Debug)]
pub struct Pass {
    pub label: &'static str,
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    slots: Vec<Slot>,
}

impl Pass {
    /// Compiles `source` (through `cache` where there is one) and builds the layout `spec`
    /// describes.
    pub fn build(
        device: &wgpu::Device,
        spec: &PassSpec,
        source: &str,
        cache: Option<&wgpu::PipelineCache>,
    ) -> Self {
        let PassSpec {
            label,
            entry,
            checks,
            slots,
        } = *spec;
        let entries: Vec<wgpu::BindGroupLayoutEntry> = slots
            .iter()
            .map(|slot| {
                let ty = match *slot {
                    Slot::Uniform(_) => wgpu::BufferBindingType::Uniform,
                    Slot::Read(_) => wgpu::BufferBindingType::Storage { read_only: true },
                    Slot::Write(_) => wgpu::BufferBindingType::Storage { read_only: false },
                };
                wgpu::BindGroupLayoutEntry {
                    binding: slot.binding(),
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
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache,
        });
        Pass {
            label,
            pipeline,
            layout,
            slots: slots.to_vec(),
        }
    }

    /// Storage buffers the pass binds (what `max_storage_buffers_per_shader_stage` must allow).
    pub fn storage_buffers(slots: &[Slot]) -> usize {
        slots
            .iter()
            .filter(|s| matches!(s, Slot::Read(_) | Slot::Write(_)))
            .count()
    }

    /// A bind group from `(binding, buffer)` pairs. Every slot of the layout must be given
    /// exactly once (kernel modules build the pairs from their typed binding structs); a
    /// mismatch is an `Err` naming the pass, never a silently short group.
    pub fn bind(
        &self,
        device: &wgpu::Device,
        buffers: &[(u32, Binding)],
    ) -> Result<wgpu::BindGroup> {
        let mut wanted: Vec<u32> = self.slots.iter().map(|s| s.binding()).collect();
        let mut given: Vec<u32> = buffers.iter().map(|b| b.0).collect();
        wanted.sort_unstable();
        given.sort_unstable();
        if wanted != given {
            return Err(Error::Gpu {
                stage: format!("binding the {} pass", self.label),
                message: format!("bindings {given:?} given, the layout has {wanted:?}"),
            });
        }
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .map(|(binding, buffer)| wgpu::BindGroupEntry {
                binding: *binding,
                resource: buffer.resource(),
            })
            .collect();
        Ok(device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(self.label),
            layout: &self.layout,
            entries: &entries,
        }))
    }
}

impl Pass {
    /// Sets this pass's pipeline and `bind` on a compute pass being recorded (for callers that
    /// keep their bind groups, such as a serving plan's).
    pub(crate) fn set_on(&self, pass: &mut wgpu::ComputePass, bind: &wgpu::BindGroup) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, bind, &[]);
    }
}

/// One dispatch of a pass, ready to record: its uniform parameters, bind group and
/// workgroup counts. Kernel modules make these from a problem description; the modules that
/// chain passes only record them.
#[derive(Debug)]
pub struct Dispatch {
    pass: Arc<Pass>,
    /// Bound at 0; held so the parameters live as long as the dispatch.
    _params: wgpu::Buffer,
    bind: wgpu::BindGroup,
    workgroups: [u32; 3],
}

impl Dispatch {
    /// `params` goes to binding 0 (a uniform); `buffers` fill the other slots. Checks the
    /// workgroup counts against the device's limit.
    pub(crate) fn new<'b, P: bytemuck::Pod, B: Into<Binding<'b>> + Copy>(
        gpu: &Gpu,
        pass: Arc<Pass>,
        params: &P,
        buffers: &[(u32, B)],
        workgroups: [u32; 3],
    ) -> Result<Self> {
        gpu.check_workgroups(pass.label, workgroups)?;
        let params = gpu.uniform(pass.label, params);
        let mut all = vec![(0, Binding::from(&params))];
        all.extend(buffers.iter().map(|&(slot, b)| (slot, b.into())));
        let bind = pass.bind(gpu.device(), &all)?;
        Ok(Dispatch {
            pass,
            _params: params,
            bind,
            workgroups,
        })
    }

    pub fn label(&self) -> &'static str {
        self.pass.label
    }

    /// Records the dispatch in its own compute pass (so each can be timed).
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder, timer: Option<&mut PassTimer>) {
        if self.workgroups.contains(&0) {
            return;
        }
        let timestamp_writes = timer.and_then(|t| t.next(self.pass.label));
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(self.pass.label),
            timestamp_writes,
        });
        pass.set_pipeline(&self.pass.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.workgroups[0], self.workgroups[1], self.workgroups[2]);
    }
}
