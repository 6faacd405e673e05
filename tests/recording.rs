//! Recording into the caller's command encoder (issue 26 item 3): N calls recorded into one
//! encoder and submitted once equal the same N calls each submitted on its own, bit for bit —
//! for the module forward on device tensors (mixed shapes, masks of every kind, RoPE
//! positions, GQA, probabilities: every per-call buffer) and for the KV cache step (plain,
//! multi-pass and chunked caches). Per-call data written with `queue.write_buffer` would make
//! every recorded call sharing a workspace see the last call's mask, tables and inputs.

mod common;

use common::{bits, gpu, gqa_rope, module};
use wgpu_mha::{
    AttentionPath, ForwardOptions, GpuTensor, KvCache, Mask, MaskTensor, MultiHeadAttention,
    StepOptions, Tensor,
};

fn encoder() -> wgpu::CommandEncoder {
    gpu().device().create_command_encoder(&Default::default())
}

fn read(t: &GpuTensor) -> Tensor {
    t.read(gpu()).expect("readback")
}

/// Asserts two tensors are equal bit for bit.
fn assert_bits(label: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{label}: shape");
    let differ = got
        .data()
        .iter()
        .zip(want.data())
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "{label}: {differ} values differ");
}

/// A keep mask `[b, lk]` with at least the first key of every sequence real.
fn keep(b: usize, lk: usize, seed: u64) -> MaskTensor {
    let mut k: Vec<u8> = bits(b * lk, seed).iter().map(|&x| (!x) as u8).collect();
    for bi in 0..b {
        k[bi * lk] = 1;
    }
    MaskTensor::new([b, lk], k).unwrap()
}

/// One forward call: inputs (self-attention, shared key/value or distinct), mask, options.
struct Call {
    inputs: Vec<GpuTensor>,
    mask: Mask,
    options: ForwardOptions,
}

impl Call {
    fn qkv(&self) -> [&GpuTensor; 3] {
        match &self.inputs[..] {
            [x] => [x, x, x],
            [q, kv] => [q, kv, kv],
            [q, k, v] => [q, k, v],
            _ => unreachable!(),
        }
    }
}

/// Call `i`: five shapes in turn (so calls share workspaces within one encoder), masks of
/// every kind in turn (so a workspace's mask buffer grows mid-encoder), own positions.
fn call(i: usize) -> Call {
    let seed = 1000 + i as u64;
    // (batch, lq, lk, distinct inputs, probabilities, path)
    let shapes = [
        (2, 5, 5, 1, false, AttentionPath::Auto),
        (1, 3, 6, 2, false, AttentionPath::Auto),
        (2, 2, 7, 3, false, AttentionPath::Fused),
        (1, 8, 8, 1, true, AttentionPath::MultiPass),
        (2, 1, 4, 2, false, AttentionPath::Auto),
    ];
    let (b, lq, lk, distinct, probs, path) = shapes[i % shapes.len()];
    let x = |rows: usize, s: u64| GpuTensor::upload(gpu(), &Tensor::random([b, rows, 16], s));
    let inputs: Vec<GpuTensor> = match distinct {
        1 => vec![x(lq, seed).unwrap()],
        2 => vec![x(lq, seed).unwrap(), x(lk, seed + 1).unwrap()],
        _ => vec![
            x(lq, seed).unwrap(),
            x(lk, seed + 1).unwrap(),
            x(lk, seed + 2).unwrap(),
        ],
    };
    let mask = match (i / shapes.len()) % 7 {
        0 => Mask::Causal,
        1 => Mask::SlidingWindow(1 + i % 3),
        2 => Mask::KeyPadding((0..b).map(|bi| 1 + (i + bi) % lk).collect()),
        3 => Mask::causal_with_padding(Some(2 + i % 3), &keep(b, lk, seed)),
        4 => {
            let m: Vec<u8> = bits(b * lq * lk, seed).iter().map(|&x| x as u8).collect();
            Mask::Block(MaskTensor::new([b, lq, lk], m).unwrap())
        }
        5 => Mask::Bias(Tensor::random([b, 1, lq, lk], seed + 3)),
        _ => Mask::None,
    };
    // Keys at their own positions from an offset of the call's own (queries the last lq).
    let positions = (i % 4 != 3).then(|| {
        (0..b)
            .flat_map(|bi| (0..lk).map(move |j| (i * 3 + bi * 5) % 17 + j))
            .collect()
    });
    Call {
        inputs,
        mask,
        options: ForwardOptions {
            return_probs: probs,
            path,
            positions,
        },
    }
}

#[test]
fn recorded_forwards_equal_submitted_ones_bit_for_bit() {
    let (_, mha) = module(gqa_rope(), 3);
    for n in [1, 9, 64] {
        let calls: Vec<Call> = (0..n).map(call).collect();
        // Each call submitted on its own, read back.
        let want: Vec<(Tensor, Option<Tensor>)> = calls
            .iter()
            .map(|c| {
                let [q, k, v] = c.qkv();
                let out = mha.forward_gpu_with(q, k, v, &c.mask, &c.options).unwrap();
                (read(&out.output), out.probs.as_ref().map(read))
            })
            .collect();
        // All recorded into one encoder, submitted once.
        let mut enc = encoder();
        let recorded: Vec<_> = calls
            .iter()
            .map(|c| {
                let [q, k, v] = c.qkv();
                mha.forward_gpu_into(&mut enc, q, k, v, &c.mask, &c.options)
                    .unwrap()
            })
            .collect();
        gpu().queue().submit([enc.finish()]);
        for (i, (got, (out, probs))) in recorded.iter().zip(&want).enumerate() {
            let label = format!("{n} calls, call {i} ({:?})", calls[i].mask.kind_name());
            assert_bits(&label, &read(&got.output), out);
            match (&got.probs, probs) {
                (Some(g), Some(p)) => assert_bits(&format!("{label} probs"), &read(g), p),
                (None, None) => {}
                _ => panic!("{label}: probabilities on one side only"),
            }
        }
    }
}

/// Step `t` of a decode: (new tokens, mask, positions, cross input) for a batch of 2.
fn step_options(t: usize, len: usize, n: usize) -> (Option<Mask>, Option<Vec<usize>>, bool) {
    let lk = len + n;
    let mask = match t % 3 {
        1 => Some(Mask::causal_with_padding(None, &keep(2, lk, t as u64))),
        2 => Some(Mask::causal_with_padding(
            Some(3),
            &keep(2, lk, 7 + t as u64),
        )),
        _ => None,
    };
    // The second sequence's positions start 4 later (a left-padded prompt's shift).
    let positions = (t % 2 == 1).then(|| {
        (0..2)
            .flat_map(|b| (len..lk).map(move |p| p + 4 * b))
            .collect()
    });
    (mask, positions, t % 4 == 2)
}

/// Makes a cache of a kind for a module and a capacity (batch 2).
type MakeCache = fn(&MultiHeadAttention, usize) -> KvCache;

const STEPS: [usize; 8] = [3, 1, 1, 2, 1, 4, 1, 1];

/// Runs the decode of [`STEPS`] on `cache`, recording every step into one encoder
/// (`record`) or submitting each; returns the outputs read back.
fn decode(mha: &MultiHeadAttention, cache: &mut KvCache, record: bool) -> Vec<Tensor> {
    let mut enc = encoder();
    let mut outs = Vec::new();
    for (t, &n) in STEPS.iter().enumerate() {
        let len = cache.len();
        let x = GpuTensor::upload(gpu(), &Tensor::random([2, n, 16], 50 + t as u64)).unwrap();
        let kv = GpuTensor::upload(gpu(), &Tensor::random([2, n, 16], 90 + t as u64)).unwrap();
        let (mask, positions, cross) = step_options(t, len, n);
        let options = StepOptions {
            x_k_v: cross.then_some(&kv),
            mask: mask.as_ref(),
            positions: positions.as_deref(),
        };
        let out = match record {
            true => mha.forward_step_gpu_into(&mut enc, cache, &x, &options),
            false => mha.forward_step_gpu_with(cache, &x, &options),
        };
        outs.push(out.unwrap());
        assert_eq!(cache.len(), len + n, "the cache counts the step at once");
    }
    gpu().queue().submit([enc.finish()]);
    outs.iter().map(read).collect()
}

#[test]
fn recorded_steps_equal_submitted_ones_bit_for_bit() {
    let (_, mha) = module(gqa_rope(), 5);
    let cap = STEPS.iter().sum();
    let caches: [(&str, MakeCache); 3] = [
        ("fused", |m, cap| KvCache::new(m, 2, cap).unwrap()),
        ("multi-pass", |m, cap| {
            KvCache::with_path(m, 2, cap, AttentionPath::MultiPass).unwrap()
        }),
        ("chunked", |m, cap| KvCache::chunked(m, 2, cap, 1).unwrap()),
    ];
    for (label, make) in caches {
        let want = decode(&mha, &mut make(&mha, cap), false);
        let got = decode(&mha, &mut make(&mha, cap), true);
        for (t, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_bits(&format!("{label} cache, step {t}"), g, w);
        }
    }
}

/// The host step and the device step are one code path: equal bit for bit.
#[test]
fn host_and_device_steps_agree_bit_for_bit() {
    let (_, mha) = module(gqa_rope(), 5);
    let (mut host, mut device) = (
        KvCache::new(&mha, 2, 8).unwrap(),
        KvCache::new(&mha, 2, 8).unwrap(),
    );
    for (t, n) in [3, 1, 2].into_iter().enumerate() {
        let x = Tensor::random([2, n, 16], 7 + t as u64);
        let want = mha.forward_step(&mut host, &x).unwrap();
        let xg = GpuTensor::upload(gpu(), &x).unwrap();
        let got = mha.forward_step_gpu(&mut device, &xg).unwrap();
        assert_bits(&format!("step {t}"), &read(&got), &want);
    }
}

#[test]
fn bad_arguments_record_nothing_and_an_unsubmitted_step_rolls_back() {
    let (_, mha) = module(gqa_rope(), 9);
    let g = gpu();
    let x = GpuTensor::upload(g, &Tensor::random([2, 3, 16], 1)).unwrap();
    let bad = GpuTensor::upload(g, &Tensor::random([2, 3, 12], 2)).unwrap();
    let options = ForwardOptions::default();
    let mut cache = KvCache::new(&mha, 2, 8).unwrap();

    // Errors come before any command: the encoder still records and runs a good call.
    let mut enc = encoder();
    assert!(mha
        .forward_gpu_into(&mut enc, &x, &bad, &bad, &Mask::Causal, &options)
        .is_err());
    let wrong_mask = Mask::KeyPadding(vec![9, 9]);
    assert!(mha
        .forward_gpu_into(&mut enc, &x, &x, &x, &wrong_mask, &options)
        .is_err());
    assert!(mha
        .forward_step_gpu_into(&mut enc, &mut cache, &bad, &StepOptions::default())
        .is_err());
    let long = GpuTensor::upload(g, &Tensor::random([2, 9, 16], 3)).unwrap();
    assert!(mha
        .forward_step_gpu_into(&mut enc, &mut cache, &long, &StepOptions::default())
        .is_err());
    assert_eq!(cache.len(), 0, "a refused step leaves the cache as it was");
    let got = mha
        .forward_gpu_into(&mut enc, &x, &x, &x, &Mask::Causal, &options)
        .unwrap();
    g.queue().submit([enc.finish()]);
    let want = mha.forward_gpu(&x, &x, &x, &Mask::Causal).unwrap();
    assert_bits("after refused calls", &read(&got.output), &read(&want));

    // A step recorded into an encoder that is dropped: the cache counted it; truncating
    // rolls it back, and the decode goes on as if it had never been recorded.
    let first = mha.forward_step_gpu(&mut cache, &x).unwrap();
    let mut dropped = encoder();
    let y = GpuTensor::upload(g, &Tensor::random([2, 1, 16], 4)).unwrap();
    mha.forward_step_gpu_into(&mut dropped, &mut cache, &y, &StepOptions::default())
        .unwrap();
    drop(dropped);
    assert_eq!(cache.len(), 4);
    assert!(cache.truncate(5).is_err(), "a cache only shrinks");
    cache.truncate(3).unwrap();
    let second = mha.forward_step_gpu(&mut cache, &y).unwrap();

    let mut fresh = KvCache::new(&mha, 2, 8).unwrap();
    assert_bits(
        "first step",
        &read(&first),
        &read(&mha.forward_step_gpu(&mut fresh, &x).unwrap()),
    );
    assert_bits(
        "step after the rollback",
        &read(&second),
        &read(&mha.forward_step_gpu(&mut fresh, &y).unwrap()),
    );
}
