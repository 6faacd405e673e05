//! The engine author's contract, on devices an engine makes itself (`Gpu::from_device`):
//!
//! * **Limits as stated**: every path (decode, flash with sinks, multi-pass, and the module)
//!   runs on a device made with `wgpu::Limits::default()`, and on one whose limits are lowered
//!   to exactly what docs/embedding.md states (6 storage buffers per stage, 2 uniform buffers, 16 KiB
//!   of workgroup memory, 256 invocations) — with no wgpu error anywhere.
//! * **An `Err` leaves the encoder as it was**: after each refused call (a buffer of another
//!   device, a destroyed buffer, an f16 view in a buffer whose size is not a multiple of 4, a
//!   view too large for one binding) the caller records its own copy into the same encoder,
//!   submits it, and the copy ran, with no validation error.
//! * **Views into arenas**: a view into a buffer larger than one storage binding runs when its
//!   own extent fits one (the device's binding limit is lowered to 1 MiB to keep this cheap),
//!   on the vec4 and scalar decode loads, the flash and the multi-pass paths.
//! * A property test records random sequences of valid and invalid calls between the caller's
//!   own copies into one encoder, submits it, and checks every output and copy against the f64
//!   reference.
//!
//! Every result is checked against `wgpu_mha::reference` in f64. Devices are made through
//! wgpu's helpers (honouring `WGPU_BACKEND`), so CI's GL pass runs these on GL too. One head
//! size (8) throughout, so the file compiles few pipelines.

mod common;

use common::assert_close;
use common::engine::{
    default_engine, stated_engine, CallerCopy, Engine, Problem, BINDING_LIMIT, D, USAGE,
};
use proptest::prelude::*;
use wgpu_mha::{
    record_scaled_dot_product_attention, reference, AttentionConfig, AttentionPath,
    AttentionWeights, DeviceTensor, Error, ForwardOptions, GpuTensor, KvCache, Layout, Mask,
    MultiHeadAttention, StepOptions, Tensor,
};

/// Sinks on every path; decode (1 and 2 rows), flash (9 rows), multi-pass.
fn every_path() -> Vec<(&'static str, Problem)> {
    let sinks = Some(vec![0.7, -1.3]);
    let with = |lq, f: &dyn Fn(&mut Problem)| {
        let mut p = Problem::new(lq, 11);
        p.options.sinks = sinks.clone();
        p.options.mask = Mask::Causal;
        f(&mut p);
        p
    };
    vec![
        ("decode", with(1, &|_| {})),
        ("decode gqa", with(1, &|p| p.kv_heads = 1)),
        ("flash", with(9, &|_| {})),
        ("multi-pass", with(9, &|p| p.options.return_probs = true)),
        (
            "flash blhd",
            with(9, &|p| {
                p.layout = Layout::Blhd;
                p.options.path = AttentionPath::Fused;
            }),
        ),
    ]
}

/// Every path of `scaled_dot_product_attention` recorded into one encoder with the caller's
/// copies between, and a module with sinks (flash and decode), on `e`.
fn run_every_path(e: &Engine, label: &str) {
    let mut encoder = e.device.create_command_encoder(&Default::default());
    let mut copies = vec![CallerCopy::record(e, &mut encoder, 1)];
    let mut outs = Vec::new();
    for (n, (name, p)) in every_path().into_iter().enumerate() {
        let seed = 10 * n as u64;
        let b = p.buffers(e, seed);
        let [q, k, v, out] = p.tensors([&b[0], &b[1], &b[2], &b[3]]);
        record_scaled_dot_product_attention(&e.gpu, &mut encoder, &q, &k, &v, &out, &p.options)
            .unwrap_or_else(|err| panic!("{label} {name}: {err}"));
        copies.push(CallerCopy::record(e, &mut encoder, 2 + n as u64));
        outs.push((name, p, b, seed));
    }
    e.submit(encoder)
        .unwrap_or_else(|err| panic!("{label}: validation error {err}"));
    for copy in &copies {
        copy.check(e, label);
    }
    for (name, p, b, seed) in &outs {
        p.check_out(e, &b[3], *seed, &format!("{label} {name}"));
    }

    // The module: sinks, flash (9 rows) and decode (a cache step of 1), on the same device.
    let config = AttentionConfig::classic(16, 2)
        .unwrap()
        .with_sinks()
        .unwrap();
    let weights = AttentionWeights::random(&config, 5);
    let mha = MultiHeadAttention::new(&e.gpu, config, &weights)
        .unwrap_or_else(|err| panic!("{label} module: {err}"));
    let x = Tensor::random([1, 9, 16], 6);
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    let got = mha
        .forward(&x, &x, &x, &Mask::Causal)
        .unwrap_or_else(|err| panic!("{label} module: {err}"));
    assert_close(&format!("{label} module"), got.data(), &want.output);
    // A prompt of 9 (flash), then one token (decode).
    let mut cache = KvCache::new(&mha, 1, 16).unwrap();
    mha.forward_step(&mut cache, &x).unwrap();
    let last = Tensor::random([1, 1, 16], 8);
    let got = mha.forward_step(&mut cache, &last).unwrap();
    let mut whole = x.data().to_vec();
    whole.extend_from_slice(last.data());
    let whole = Tensor::new([1, 10, 16], whole).unwrap();
    let want = reference::forward(&config, &weights, &whole, &whole, &whole, &Mask::Causal)
        .unwrap()
        .output;
    assert_close(&format!("{label} module step"), got.data(), &want[9 * 16..]);
    e.assert_no_uncaptured(label);
}

#[test]
fn every_path_runs_with_wgpus_default_limits() {
    run_every_path(default_engine(), "Limits::default()");
}

#[test]
fn every_path_runs_with_exactly_the_stated_limits() {
    let e = stated_engine();
    assert_eq!(e.device.limits().max_storage_buffers_per_shader_stage, 6);
    run_every_path(e, "docs/embedding.md's limits");
}

/// A refused call into `encoder`, then the caller's copy, submitted: the call was an `Err`,
/// the copy ran, and nothing failed validation.
fn refused_then_copy(
    e: &Engine,
    label: &str,
    call: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<(), Error>,
    expected: &str,
) {
    let mut encoder = e.device.create_command_encoder(&Default::default());
    let before = CallerCopy::record(e, &mut encoder, 30);
    let err = match call(&mut encoder) {
        Ok(()) => panic!("{label}: accepted"),
        Err(err) => err.to_string(),
    };
    assert!(err.contains(expected), "{label}: {err}");
    let after = CallerCopy::record(e, &mut encoder, 31);
    e.submit(encoder)
        .unwrap_or_else(|v| panic!("{label}: the caller's encoder failed validation: {v}"));
    before.check(e, label);
    after.check(e, label);
    e.assert_no_uncaptured(label);
}

#[test]
fn a_refused_sdpa_call_leaves_the_callers_encoder_as_it_was() {
    let e = stated_engine();
    let p = Problem::new(9, 11);
    let seed = 40;
    let b = p.buffers(e, seed);
    let sdpa = |encoder: &mut wgpu::CommandEncoder, t: [DeviceTensor; 4]| {
        record_scaled_dot_product_attention(&e.gpu, encoder, &t[0], &t[1], &t[2], &t[3], &p.options)
            .map(|_| ())
    };

    // q in a buffer of another device.
    let foreign = default_engine().buffer(&vec![0.0; p.extent(0)]);
    refused_then_copy(
        e,
        "another device's buffer",
        |enc| sdpa(enc, p.tensors([&foreign, &b[1], &b[2], &b[3]])),
        "doesn't match",
    );

    // k in a destroyed buffer.
    let dead = e.buffer(&vec![0.0; p.extent(1)]);
    dead.destroy();
    refused_then_copy(
        e,
        "a destroyed buffer",
        |enc| sdpa(enc, p.tensors([&b[0], &dead, &b[2], &b[3]])),
        "destroyed",
    );

    // An f16 q in a buffer of 2·n + 2 bytes (not a multiple of 4): refused by name.
    let n: usize = p.shapes()[0].iter().product();
    let odd = e.zeros(2 * n as u64 + 2);
    refused_then_copy(
        e,
        "an f16 view in a buffer of an odd number of halves",
        |enc| {
            let mut t = p.tensors([&odd, &b[1], &b[2], &b[3]]);
            t[0] = t[0].f16();
            t[1] = t[1].f16();
            t[2] = t[2].f16();
            sdpa(enc, t)
        },
        if e.gpu.has_f16() {
            "not a multiple of 4"
        } else {
            "f16"
        },
    );

    // A view whose own extent exceeds one binding (at the device's lowered limit).
    let rows = (BINDING_LIMIT as usize / 4) / (p.heads * D) + 1;
    let big = e.zeros(4 * (rows * p.heads * D) as u64);
    refused_then_copy(
        e,
        "a view larger than one binding",
        |enc| {
            let mut t = p.tensors([&b[0], &big, &big, &b[3]]);
            for k in &mut t[1..3] {
                *k = DeviceTensor::new(&big, [1, p.heads, rows, D], Layout::Bhld);
            }
            t[0] = DeviceTensor::new(&b[0], [1, p.heads, p.lq, D], Layout::Bhld);
            t[3] = DeviceTensor::new(&b[3], [1, p.heads, p.lq, D], Layout::Bhld);
            let mut o = p.options.clone();
            o.path = AttentionPath::Fused;
            record_scaled_dot_product_attention(&e.gpu, enc, &t[0], &t[1], &t[2], &t[3], &o)
                .map(|_| ())
        },
        "the aligned range of its buffer its view spans",
    );

    // And the same encoder still takes a valid call afterwards.
    let mut encoder = e.device.create_command_encoder(&Default::default());
    let _ = sdpa(&mut encoder, p.tensors([&foreign, &b[1], &b[2], &b[3]]));
    sdpa(&mut encoder, p.tensors([&b[0], &b[1], &b[2], &b[3]])).unwrap();
    e.submit(encoder).unwrap();
    p.check_out(e, &b[3], seed, "valid after refused");
}

#[test]
fn a_refused_module_call_leaves_the_callers_encoder_as_it_was() {
    let e = stated_engine();
    let config = AttentionConfig::classic(16, 2).unwrap();
    let weights = AttentionWeights::random(&config, 50);
    let mha = MultiHeadAttention::new(&e.gpu, config, &weights).unwrap();
    // One row: the decode pass every other test here compiles too.
    let x = Tensor::random([1, 1, 16], 51);
    let good = GpuTensor::upload(&e.gpu, &x).unwrap();
    let other = GpuTensor::upload(&default_engine().gpu, &x).unwrap();
    let dead = GpuTensor::upload(&e.gpu, &x).unwrap();
    dead.buffer().destroy();
    for (name, bad) in [
        ("another device's tensor", &other),
        ("a destroyed tensor", &dead),
    ] {
        refused_then_copy(
            e,
            &format!("forward_gpu_into with {name}"),
            |enc| {
                mha.forward_gpu_into(
                    enc,
                    &good,
                    bad,
                    bad,
                    &Mask::Causal,
                    &ForwardOptions::default(),
                )
                .map(|_| ())
            },
            "key",
        );
        let mut cache = KvCache::new(&mha, 1, 8).unwrap();
        refused_then_copy(
            e,
            &format!("forward_step_gpu_into with {name}"),
            |enc| {
                mha.forward_step_gpu_into(enc, &mut cache, bad, &StepOptions::default())
                    .map(|_| ())
            },
            "step input",
        );
        assert_eq!(cache.len(), 0, "{name}: the cache did not advance");
    }
    // The module still runs right on this device afterwards, recorded.
    let mut encoder = e.device.create_command_encoder(&Default::default());
    let out = mha
        .forward_gpu_into(
            &mut encoder,
            &good,
            &good,
            &good,
            &Mask::Causal,
            &Default::default(),
        )
        .unwrap();
    e.submit(encoder).unwrap();
    let want = reference::forward(&config, &weights, &x, &x, &x, &Mask::Causal).unwrap();
    assert_close(
        "module after refusals",
        out.output.read(&e.gpu).unwrap().data(),
        &want.output,
    );
}

/// q, k and v as small views deep inside one arena larger than a binding (1 MiB here): each
/// binds only the aligned range it spans. Decode with vec4 loads (offsets multiples of 4) and
/// scalar ones (odd offsets), flash and multi-pass.
#[test]
fn views_into_an_arena_larger_than_a_binding_run() {
    let e = stated_engine();
    let arena_len = 4 * BINDING_LIMIT as usize / 4; // 4 MiB of f32
    for (n, (name, lq, base, probs)) in [
        ("decode vec4", 1, 600_000, false),
        ("decode scalar", 1, 600_003, false),
        ("flash", 9, 700_001, false),
        ("multi-pass", 9, 500_002, true),
    ]
    .into_iter()
    .enumerate()
    {
        let mut p = Problem::new(lq, 11);
        p.options.return_probs = probs;
        p.options.mask = Mask::Causal;
        // q, k and v one after another from `base` (k and v in the second MiB and past it).
        p.offsets = [base, base + 60_000, base + 200_000, 5];
        let seed = 60 + n as u64;
        let data = p.inputs(seed);
        let mut host = vec![f32::NAN; arena_len];
        for (i, x) in data.iter().enumerate() {
            p.place(i, x, &mut host);
        }
        let arena = e.buffer(&host);
        assert!(arena.size() > 2 * BINDING_LIMIT);
        let out = e.zeros(4 * (p.extent(3) as u64 + 1));
        let label = format!("arena {name}");
        p.run_and_check(e, [&arena, &arena, &arena, &out], seed, &label);
    }
    // An f32 q in a buffer of 4·n + 2 bytes (sizes need not be words; bindings must be).
    let p = Problem::new(1, 11);
    let seed = 70;
    let [_, k, v, out] = p.buffers(e, seed);
    let n = p.extent(0);
    let q = e.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("odd-sized q"),
        size: 4 * n as u64 + 2,
        usage: USAGE,
        mapped_at_creation: false,
    });
    let mut host = vec![0.0; n];
    p.place(0, &p.inputs(seed)[0], &mut host);
    e.queue.write_buffer(&q, 0, bytemuck::cast_slice(&host));
    p.run_and_check(
        e,
        [&q, &k, &v, &out],
        seed,
        "f32 view in an odd-sized buffer",
    );
    e.assert_no_uncaptured("arenas");
}

/// One step of a recorded sequence.
#[derive(Debug, Clone)]
enum Op {
    /// The caller's own copy.
    Copy,
    /// A valid call: (query rows, key/value heads, layout, offset, sinks, probabilities).
    Valid(usize, usize, bool, usize, bool, bool),
    /// An invalid one: 0 another device's buffer, 1 a destroyed buffer, 2 `out` sharing q's
    /// buffer, 3 a wrong `k` shape, 4 an f16 view in an odd-sized buffer.
    Invalid(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Copy),
        (
            prop::sample::select(vec![1usize, 9]),
            1usize..=2,
            any::<bool>(),
            0usize..9,
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(lq, kh, blhd, off, sinks, probs)| Op::Valid(
                lq, kh, blhd, off, sinks, probs
            )),
        (0u8..5).prop_map(Op::Invalid),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random sequences of valid and invalid calls between the caller's copies, in one encoder:
    /// every invalid call is an `Err`, and after one submit every valid output and every copy
    /// matches, with no validation error.
    #[test]
    fn recorded_sequences_of_valid_and_invalid_calls_hold(ops in prop::collection::vec(op(), 1..7)) {
        let e = stated_engine();
        let mut encoder = e.device.create_command_encoder(&Default::default());
        let mut copies = Vec::new();
        let mut valid = Vec::new();
        let foreign = default_engine().buffer(&[0.0; 256]);
        for (n, op) in ops.iter().enumerate() {
            let seed = 100 + 7 * n as u64;
            match *op {
                Op::Copy => copies.push(CallerCopy::record(e, &mut encoder, seed)),
                Op::Valid(lq, kv_heads, blhd, off, sinks, probs) => {
                    let mut p = Problem::new(lq, 5 + off);
                    p.kv_heads = kv_heads;
                    p.layout = if blhd { Layout::Blhd } else { Layout::Bhld };
                    // Offsets multiples of 4: the vec4 decode loads (fewer pipelines).
                    p.offsets = [4 * off, 8 * off, 4 * off + 4, 3];
                    p.options.mask = Mask::Causal;
                    p.options.sinks = sinks.then(|| vec![0.5, -0.25]);
                    p.options.return_probs = probs;
                    let b = p.buffers(e, seed);
                    let t = p.tensors([&b[0], &b[1], &b[2], &b[3]]);
                    let r = record_scaled_dot_product_attention(
                        &e.gpu, &mut encoder, &t[0], &t[1], &t[2], &t[3], &p.options,
                    );
                    prop_assert!(r.is_ok(), "{op:?}: {:?}", r.err());
                    valid.push((p, b, seed));
                }
                Op::Invalid(kind) => {
                    let p = Problem::new(1, 5);
                    let b = p.buffers(e, seed);
                    let dead = e.zeros(256);
                    dead.destroy();
                    let odd = e.zeros(2 * 16 + 2);
                    let mut t = p.tensors([&b[0], &b[1], &b[2], &b[3]]);
                    match kind {
                        0 => t[1].buffer = &foreign,
                        1 => t[2].buffer = &dead,
                        2 => t[3].buffer = &b[0],
                        3 => t[1].shape[3] = D + 1,
                        _ => {
                            t[0].buffer = &odd;
                            for x in &mut t[..3] {
                                *x = x.f16();
                            }
                        }
                    }
                    let r = record_scaled_dot_product_attention(
                        &e.gpu, &mut encoder, &t[0], &t[1], &t[2], &t[3], &p.options,
                    );
                    prop_assert!(r.is_err(), "{op:?} was accepted");
                }
            }
        }
        let submitted = e.submit(encoder);
        prop_assert!(submitted.is_ok(), "{ops:?}: {submitted:?}");
        for copy in &copies {
            copy.check(e, "property");
        }
        for (p, b, seed) in &valid {
            p.check_out(e, &b[3], *seed, &format!("{p:?}"));
        }
        e.assert_no_uncaptured("property");
    }
}
