//! `scaled_dot_product_attention` on caller buffers: both layouts, offsets into larger buffers,
//! KV slabs with spare rows, GQA, every mask kind and both causal alignments, soft-cap, ALiBi,
//! sinks, f16, every path — each against the f64 reference core — and every argument error.
//! Recording many calls into one encoder equals submitting them one by one, bit for bit.

mod common;

use common::{assert_within, gpu, relative_tolerance, run_sdpa_core};
use wgpu::util::DeviceExt;
use wgpu_mha::{
    record_scaled_dot_product_attention, scaled_dot_product_attention, AttentionPath,
    CausalAlignment, DeviceTensor, Error, Gpu, Layout, Mask, SdpaOptions, Tensor,
};

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// A `[B, L, H, D]`-ordered logical tensor (the reference's layout) placed in a buffer.
struct Placed {
    buffer: wgpu::Buffer,
    shape: [usize; 4],
    layout: Layout,
    offset: usize,
    capacity: usize,
    f16: bool,
}

impl Placed {
    /// `data` is `[B, L, H, D]` row-major; it goes at `offset` in `layout` with `capacity` rows,
    /// every other element of the buffer a NaN that must never be read.
    fn new(
        gpu: &Gpu,
        data: &[f32],
        [b, h, l, d]: [usize; 4],
        layout: Layout,
        (offset, capacity): (usize, usize),
        f16: bool,
    ) -> Self {
        let at = |bi, hi, li| index(layout, [b, h, l, d], offset, capacity, (bi, hi, li));
        let len = offset + b * h * capacity * d + 3;
        let mut host = vec![f32::NAN; len];
        for bi in 0..b {
            for li in 0..l {
                for hi in 0..h {
                    let dst = at(bi, hi, li);
                    let src = ((bi * l + li) * h + hi) * d;
                    host[dst..dst + d].copy_from_slice(&data[src..src + d]);
                }
            }
        }
        let bytes: Vec<u8> = if f16 {
            let half: Vec<half::f16> = host.iter().map(|&v| half::f16::from_f32(v)).collect();
            bytemuck::cast_slice(&half).to_vec()
        } else {
            bytemuck::cast_slice(&host).to_vec()
        };
        let buffer = gpu
            .device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("sdpa test tensor"),
                contents: &bytes,
                usage: USAGE,
            });
        Placed {
            buffer,
            shape: [b, h, l, d],
            layout,
            offset,
            capacity,
            f16,
        }
    }

    fn tensor(&self) -> DeviceTensor<'_> {
        let t = DeviceTensor::new(&self.buffer, self.shape, self.layout)
            .at_offset(self.offset)
            .with_capacity(self.capacity);
        if self.f16 {
            t.f16()
        } else {
            t
        }
    }

    /// The tensor's elements back in `[B, L, H, D]` order.
    fn read(&self, gpu: &Gpu) -> Vec<f32> {
        let host = read_buffer(gpu, &self.buffer);
        let [b, h, l, d] = self.shape;
        let mut out = Vec::with_capacity(b * l * h * d);
        for bi in 0..b {
            for li in 0..l {
                for hi in 0..h {
                    let at = index(
                        self.layout,
                        self.shape,
                        self.offset,
                        self.capacity,
                        (bi, hi, li),
                    );
                    out.extend_from_slice(&host[at..at + d]);
                }
            }
        }
        out
    }
}

/// First element of row `l` of head `h` of batch `b` (the layout rule, written out again).
fn index(
    layout: Layout,
    [_, heads, _, d]: [usize; 4],
    offset: usize,
    cap: usize,
    (b, h, l): (usize, usize, usize),
) -> usize {
    offset
        + match layout {
            Layout::Bhld => b * heads * cap * d + h * cap * d + l * d,
            Layout::Blhd => b * cap * heads * d + l * heads * d + h * d,
        }
}

fn read_buffer(gpu: &Gpu, buffer: &wgpu::Buffer) -> Vec<f32> {
    let staging = gpu.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = gpu.device().create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, buffer.size());
    gpu.queue().submit([encoder.finish()]);
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    gpu.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let view = staging.slice(..).get_mapped_range().expect("mapped range");
    let values = bytemuck::cast_slice(&view).to_vec();
    values
}

/// One problem: sizes, layouts and options.
#[derive(Clone)]
struct Case {
    label: String,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    layouts: [Layout; 4],
    /// (offset, spare rows) of q, k, v, out.
    placement: [(usize, usize); 4],
    f16: bool,
    options: SdpaOptions,
}

impl Case {
    fn new(label: &str, lq: usize, lk: usize) -> Self {
        Case {
            label: label.into(),
            batch: 2,
            heads: 4,
            kv_heads: 2,
            lq,
            lk,
            d: 8,
            dv: 12,
            layouts: [Layout::Bhld; 4],
            placement: [(0, 0); 4],
            f16: false,
            options: SdpaOptions::default(),
        }
    }
    fn with(mut self, f: impl FnOnce(&mut Case)) -> Self {
        f(&mut self);
        self
    }

    fn inputs(&self, seed: u64) -> [Vec<f32>; 3] {
        let (b, h, kh) = (self.batch, self.heads, self.kv_heads);
        let mut data = [
            Tensor::random([b * self.lq * h * self.d], seed)
                .data()
                .to_vec(),
            Tensor::random([b * self.lk * kh * self.d], seed + 1)
                .data()
                .to_vec(),
            Tensor::random([b * self.lk * kh * self.dv], seed + 2)
                .data()
                .to_vec(),
        ];
        if self.f16 {
            // The reference sees what the device stores.
            for x in data.iter_mut().flatten() {
                *x = half::f16::from_f32(*x).to_f32();
            }
        }
        data
    }

    fn shapes(&self) -> [[usize; 4]; 4] {
        let (b, h, kh) = (self.batch, self.heads, self.kv_heads);
        [
            [b, h, self.lq, self.d],
            [b, kh, self.lk, self.d],
            [b, kh, self.lk, self.dv],
            [b, h, self.lq, self.dv],
        ]
    }

    /// The placed q, k, v and out (out filled with NaN).
    fn place(&self, gpu: &Gpu, seed: u64) -> [Placed; 4] {
        let [q, k, v] = self.inputs(seed);
        let s = self.shapes();
        let p = |i: usize, data: &[f32], f16: bool| {
            let (offset, spare) = self.placement[i];
            Placed::new(
                gpu,
                data,
                s[i],
                self.layouts[i],
                (offset, s[i][2] + spare),
                f16,
            )
        };
        let out = vec![f32::NAN; s[3].iter().product()];
        [
            p(0, &q, self.f16),
            p(1, &k, self.f16),
            p(2, &v, self.f16),
            p(3, &out, false),
        ]
    }

    fn reference(&self, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let (b, h, kh) = (self.batch, self.heads, self.kv_heads);
        let dims = [b, h, kh, self.lq, self.lk, self.d, self.dv];
        run_sdpa_core(dims, &self.options, self.inputs(seed))
    }

    /// Runs on the device and checks output (and probabilities) against the reference.
    fn check(&self, seed: u64) {
        let gpu = gpu();
        let placed = self.place(gpu, seed);
        let [q, k, v, out] = placed.each_ref().map(Placed::tensor);
        let result = scaled_dot_product_attention(gpu, &q, &k, &v, &out, &self.options)
            .unwrap_or_else(|e| panic!("{}: {e}", self.label));
        let got = placed[3].read(gpu);
        let (want, probs) = self.reference(seed);
        let relative = if self.f16 { 2e-3 } else { 1e-5 };
        assert_within(
            &self.label,
            &got,
            &want,
            relative_tolerance(relative, &want),
        );
        if let Some(p) = result.probs {
            let got = p.read(gpu).expect("probs").data().to_vec();
            assert_within(&format!("{} probs", self.label), &got, &probs, 1e-5);
        }
    }
}

const LAYOUTS: [Layout; 2] = [Layout::Bhld, Layout::Blhd];

#[test]
fn every_path_and_layout_matches_the_reference() {
    // Decode (1 and 3 query rows), flash (9 rows), multi-pass: each with every tensor in
    // either layout, inside a larger buffer, K/V in slabs with spare rows.
    for (path_label, lq, lk, probs) in [
        ("decode", 1, 11, false),
        ("decode3", 3, 11, false),
        ("flash", 9, 11, false),
        ("multipass", 9, 11, true),
    ] {
        for (n, layouts) in [
            [Layout::Bhld; 4],
            [Layout::Blhd; 4],
            [Layout::Blhd, Layout::Bhld, Layout::Blhd, Layout::Bhld],
            [Layout::Bhld, Layout::Blhd, Layout::Bhld, Layout::Blhd],
        ]
        .into_iter()
        .enumerate()
        {
            Case::new(&format!("{path_label} layouts {layouts:?}"), lq, lk)
                .with(|c| {
                    c.layouts = layouts;
                    c.placement = [(5, 0), (3 + n, 4), (7, 2), (1, 0)];
                    c.options.return_probs = probs;
                    c.options.mask = Mask::Causal;
                })
                .check(10 + n as u64);
        }
    }
}

#[test]
fn every_mask_kind_and_alignment_matches_the_reference() {
    let (lq, lk, b, h) = (5, 9, 2, 4);
    let keep: Vec<u8> = (0..b * lk).map(|i| (i % 9 != 7) as u8).collect();
    let masks = [
        Mask::None,
        Mask::Causal,
        Mask::SlidingWindow(3),
        Mask::KeyPadding(vec![9, 4]),
        Mask::attend(
            vec![b, 1, lq, lk],
            (0..b * lq * lk).map(|i| (i % 3 != 0) as u8).collect(),
        )
        .unwrap(),
        Mask::block(
            vec![lq, lk],
            &(0..lq * lk).map(|i| i % 4 == 1).collect::<Vec<_>>(),
        )
        .unwrap(),
        Mask::bias(Tensor::random([b, h, lq, lk], 77)),
        Mask::CausalKeep {
            window: Some(4),
            keep: wgpu_mha::MaskTensor::new(vec![b, lk], keep).unwrap(),
        },
    ];
    for mask in masks {
        for align in [CausalAlignment::BottomRight, CausalAlignment::TopLeft] {
            for (path, lq) in [
                (AttentionPath::Fused, lq),
                (AttentionPath::Fused, 1),
                (AttentionPath::MultiPass, lq),
            ] {
                let mask = match (&mask, lq) {
                    // Tensor masks are per query row.
                    (Mask::Attend(_) | Mask::Block(_) | Mask::Bias(_), 1) => continue,
                    (m, _) => m.clone(),
                };
                let label = format!("{} {align:?} {path:?} lq {lq}", mask.kind_name());
                Case::new(&label, lq, lk)
                    .with(|c| {
                        c.layouts = [Layout::Blhd, Layout::Bhld, Layout::Blhd, Layout::Blhd];
                        c.options.mask = mask;
                        c.options.causal_alignment = align;
                        c.options.path = path;
                    })
                    .check(3);
            }
        }
    }
}

#[test]
fn score_terms_softcap_alibi_sinks_and_scale_match_the_reference() {
    for (path, lq) in [
        (AttentionPath::Fused, 6),
        (AttentionPath::Fused, 1),
        (AttentionPath::MultiPass, 6),
    ] {
        let options = [
            SdpaOptions {
                softcap: Some(0.7),
                scale: Some(2.5),
                ..Default::default()
            },
            SdpaOptions {
                alibi_max_bias: Some(8.0),
                mask: Mask::Causal,
                ..Default::default()
            },
            SdpaOptions {
                sinks: Some(vec![0.5, -1.0, 2.0, 0.0]),
                mask: Mask::SlidingWindow(4),
                ..Default::default()
            },
        ];
        for (n, o) in options.into_iter().enumerate() {
            Case::new(&format!("score terms {n} {path:?} lq {lq}"), lq, 10)
                .with(|c| {
                    c.heads = 4;
                    c.kv_heads = 1;
                    c.options = SdpaOptions { path, ..o };
                })
                .check(20 + n as u64);
        }
    }
}

#[test]
fn f16_inputs_accumulate_in_f32() {
    if !gpu().has_f16() {
        eprintln!("no SHADER_F16 on this adapter: the f16 case is checked on Vulkan");
        return;
    }
    for (lq, layouts) in [(1, [Layout::Bhld; 4]), (7, [Layout::Blhd; 4])] {
        Case::new(&format!("f16 lq {lq}"), lq, 13)
            .with(|c| {
                c.f16 = true;
                c.layouts = layouts;
                c.placement = [(2, 0), (6, 3), (4, 0), (0, 0)];
                c.options.mask = Mask::KeyPadding(vec![13, 6]);
            })
            .check(40);
    }
}

/// Every argument error is an `Err` naming the argument, and nothing is recorded.
#[test]
fn bad_arguments_are_refused_by_name() {
    let gpu = gpu();
    let case = Case::new("errors", 4, 6);
    let placed = case.place(gpu, 1);
    let [q, k, v, out] = placed.each_ref().map(Placed::tensor);
    let uniform = gpu.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 4096,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let o = SdpaOptions::default();
    let cases: Vec<(&str, [DeviceTensor; 4], SdpaOptions, &str)> = vec![
        (
            "k batch",
            [
                q,
                DeviceTensor {
                    shape: [1, 2, 6, 8],
                    ..k
                },
                v,
                out,
            ],
            o.clone(),
            "k has shape",
        ),
        (
            "heads not divisible",
            [
                q,
                DeviceTensor {
                    shape: [2, 3, 6, 8],
                    ..k
                },
                v,
                out,
            ],
            o.clone(),
            "H_kv dividing",
        ),
        (
            "v length",
            [
                q,
                k,
                DeviceTensor {
                    shape: [2, 2, 5, 12],
                    ..v
                },
                out,
            ],
            o.clone(),
            "v has shape",
        ),
        (
            "out shape",
            [
                q,
                k,
                v,
                DeviceTensor {
                    shape: [2, 4, 4, 8],
                    ..out
                },
            ],
            o.clone(),
            "out has shape",
        ),
        (
            "mixed elements",
            [q, k.f16(), v, out],
            o.clone(),
            "one element type",
        ),
        (
            "f16 out",
            [q, k, v, out.f16()],
            o.clone(),
            "out must be f32",
        ),
        (
            "past the buffer",
            [q.at_offset(100_000), k, v, out],
            o.clone(),
            "q: shape",
        ),
        (
            "capacity",
            [q, k.with_capacity(3), v, out],
            o.clone(),
            "k: capacity",
        ),
        (
            "no STORAGE",
            [
                q,
                k,
                v,
                DeviceTensor {
                    buffer: &uniform,
                    ..out
                },
            ],
            o.clone(),
            "without STORAGE",
        ),
        (
            "out is q",
            [
                q,
                k,
                v,
                DeviceTensor {
                    buffer: q.buffer,
                    shape: [2, 4, 4, 12],
                    ..out
                },
            ],
            o.clone(),
            "shares its buffer with q",
        ),
        (
            "sinks",
            [q, k, v, out],
            SdpaOptions {
                sinks: Some(vec![0.0; 3]),
                ..Default::default()
            },
            "sinks: 3 logits",
        ),
        (
            "mask",
            [q, k, v, out],
            SdpaOptions {
                mask: Mask::KeyPadding(vec![1]),
                ..Default::default()
            },
            "mask",
        ),
        (
            "softcap",
            [q, k, v, out],
            SdpaOptions {
                softcap: Some(-1.0),
                ..Default::default()
            },
            "softcap",
        ),
        (
            "probs fused",
            [q, k, v, out],
            SdpaOptions {
                return_probs: true,
                path: AttentionPath::Fused,
                ..Default::default()
            },
            "return_probs",
        ),
    ];
    for (label, [q, k, v, out], options, needle) in cases {
        let mut encoder = gpu.device().create_command_encoder(&Default::default());
        let err =
            record_scaled_dot_product_attention(gpu, &mut encoder, &q, &k, &v, &out, &options)
                .expect_err(label);
        let text = err.to_string();
        assert!(text.contains(needle), "{label}: {text}");
        assert!(
            !matches!(err, Error::Gpu { .. }),
            "{label}: caught only by wgpu: {text}"
        );
    }
    // The output was never written.
    assert!(placed[3].read(gpu).iter().all(|v| v.is_nan()));
}

/// Calls recorded into one encoder and submitted once equal the same calls submitted one by
/// one, bit for bit: 64 calls of mixed shapes, masks and paths, into one output buffer each.
#[test]
fn recording_many_calls_equals_submitting_each() {
    let gpu = gpu();
    let cases: Vec<Case> = (0..64)
        .map(|n| {
            let lq = [1, 2, 5, 9][n % 4];
            let lk = 4 + n % 7 + lq;
            Case::new(&format!("call {n}"), lq, lk).with(|c| {
                c.batch = 1 + n % 2;
                c.kv_heads = [1, 2, 4][n % 3];
                c.layouts = [
                    LAYOUTS[n % 2],
                    LAYOUTS[(n / 2) % 2],
                    LAYOUTS[(n / 4) % 2],
                    LAYOUTS[n % 2],
                ];
                c.options.mask = match n % 4 {
                    0 => Mask::Causal,
                    1 => Mask::SlidingWindow(1 + n % 5),
                    2 => Mask::KeyPadding(vec![lk - n % 3; c.batch]),
                    _ => Mask::None,
                };
                c.options.return_probs = n % 8 == 7;
            })
        })
        .collect();
    let one_by_one: Vec<[Placed; 4]> = cases
        .iter()
        .enumerate()
        .map(|(n, c)| c.place(gpu, n as u64))
        .collect();
    for (c, p) in cases.iter().zip(&one_by_one) {
        let [q, k, v, out] = p.each_ref().map(Placed::tensor);
        scaled_dot_product_attention(gpu, &q, &k, &v, &out, &c.options).expect(&c.label);
    }
    let recorded: Vec<[Placed; 4]> = cases
        .iter()
        .enumerate()
        .map(|(n, c)| c.place(gpu, n as u64))
        .collect();
    let mut encoder = gpu.device().create_command_encoder(&Default::default());
    for (c, p) in cases.iter().zip(&recorded) {
        let [q, k, v, out] = p.each_ref().map(Placed::tensor);
        record_scaled_dot_product_attention(gpu, &mut encoder, &q, &k, &v, &out, &c.options)
            .expect(&c.label);
    }
    gpu.queue().submit([encoder.finish()]);
    for (n, ((c, a), b)) in cases.iter().zip(&one_by_one).zip(&recorded).enumerate() {
        let (a, b) = (a[3].read(gpu), b[3].read(gpu));
        let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{}: recorded differs from submitted", c.label);
        let (want, _) = c.reference(n as u64);
        assert_within(&c.label, &a, &want, relative_tolerance(1e-5, &want));
    }
}
