//! Continuous batching over a page pool: a two-layer toy decoder (random weights, RoPE,
//! grouped-query attention) serves 24 requests. Prompts of 3–700 tokens arrive at different
//! steps; at most 8 requests run at once; each step packs every running request's next tokens
//! — a prefill chunk of up to 256 or one decode token — into one `[tokens, E]` batch that both
//! layers attend through one plan in one submission; two requests share a 300-token prompt
//! through shared pages (copy on write of the partly filled last one); finished requests give
//! their pages back.
//!
//! ```text
//! cargo run --release --example continuous_batching
//! ```
//! It checks every request's outputs against the same request run alone through a `KvCache`
//! (largest error ≤ 1e-5), that the pool is empty at the end and that serving compiled no pass
//! (the layers' `warm_up_paged` compiled them all before the first request), and prints
//! tokens/s and the peak pages used against what contiguous caches would have reserved. Exits
//! with status 1 when a check fails.
//!
//! A toy decoder feeds nothing back: each request's tokens (prompt and "generated") are fixed
//! random rows, so a request's outputs do not depend on what it was batched with — which is
//! exactly what the check asserts.

use std::process::ExitCode;
use std::time::Instant;

use wgpu_mha::model::rope::Rope;
use wgpu_mha::serve::{
    KvLayout, PageAllocator, PagedKvPool, PagedStep, PoolConfig, Sequence, WarmPasses,
};
use wgpu_mha::{
    AttentionConfig, AttentionWeights, Gpu, GpuTensor, KvCache, MultiHeadAttention, Tensor,
};

const WIDTH: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = WIDTH / HEADS;
const REQUESTS: usize = 24;
const MAX_RUNNING: usize = 8;
const CHUNK: usize = 256;
const PAGE: usize = 16;
const SHARED_PROMPT: usize = 300;
const TOLERANCE: f32 = 1e-5;

/// One request: its tokens' input rows, how many of them are its prompt, when it arrives, and
/// (for the second of the pair) the request whose prompt it shares.
struct Request {
    x: Vec<f32>,
    prompt: usize,
    arrives: usize,
    shares_prompt_of: Option<usize>,
}

impl Request {
    fn len(&self) -> usize {
        self.x.len() / WIDTH
    }
}

/// Where a request stands: waiting, running (its pages and tokens done), or done.
enum State {
    Waiting,
    Running(Sequence, usize),
    Done,
}

fn lcg(seed: &mut u64) -> usize {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as usize
}

fn requests() -> Vec<Request> {
    let mut seed = 7u64;
    let mut out: Vec<Request> = (0..REQUESTS)
        .map(|i| {
            let prompt = 3 + lcg(&mut seed) % 698;
            let generated = 4 + lcg(&mut seed) % 12;
            let x = Tensor::random([prompt + generated, WIDTH], 1000 + i as u64);
            Request {
                x: x.data().to_vec(),
                prompt,
                arrives: i / 2,
                shares_prompt_of: None,
            }
        })
        .collect();
    // Requests 4 and 5 share a 300-token prompt: 5 starts from 4's prompt pages.
    out[4].prompt = SHARED_PROMPT;
    out[4].x = Tensor::random([SHARED_PROMPT + 6, WIDTH], 54)
        .data()
        .to_vec();
    let mut shared = out[4].x[..SHARED_PROMPT * WIDTH].to_vec();
    shared.extend_from_slice(Tensor::random([9, WIDTH], 55).data());
    out[5].x = shared;
    out[5].prompt = SHARED_PROMPT;
    out[5].shares_prompt_of = Some(4);
    out[5].arrives = out[4].arrives;
    out
}

/// The request alone: both layers over all its tokens through `KvCache` steps.
fn alone(layers: &[MultiHeadAttention], r: &Request) -> wgpu_mha::Result<Vec<f32>> {
    let mut h = Tensor::new([1, r.len(), WIDTH], r.x.clone())?;
    for layer in layers {
        let mut cache = KvCache::new(layer, 1, r.len())?;
        h = layer.forward_step(&mut cache, &h)?;
    }
    Ok(h.data().to_vec())
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("continuous_batching: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> wgpu_mha::Result<bool> {
    let gpu = Gpu::new()?;
    let config = AttentionConfig::classic(WIDTH, HEADS)?
        .with_kv_heads(KV_HEADS)?
        .with_rope(Rope::new(10_000.0, HEAD_DIM))?;
    let layers: Vec<MultiHeadAttention> = (0..2)
        .map(|seed| MultiHeadAttention::new(&gpu, config, &AttentionWeights::random(&config, seed)))
        .collect::<wgpu_mha::Result<_>>()?;
    let requests = requests();
    let longest = requests.iter().map(Request::len).max().unwrap_or(0);
    // The pools are this server's own: their layout is whichever the adapter reads fastest.
    let pool_config = PoolConfig {
        page_size: PAGE,
        layout: KvLayout::preferred(&gpu),
        ..PoolConfig::new(MAX_RUNNING * longest.div_ceil(PAGE), KV_HEADS, HEAD_DIM)
    };
    let pools = [
        PagedKvPool::new(&gpu, pool_config)?,
        PagedKvPool::new(&gpu, pool_config)?,
    ];
    // A server compiles its passes before its first request; otherwise its first steps pay
    // for that (most of a second on a software adapter).
    let warming = Instant::now();
    let _warm: Vec<WarmPasses> = layers
        .iter()
        .map(|layer| layer.warm_up_paged(&pool_config))
        .collect::<wgpu_mha::Result<_>>()?;
    let warm_seconds = warming.elapsed().as_secs_f64();
    let compiled_before = gpu.cached_passes();
    let mut pages = PageAllocator::new(pool_config.max_pages, PAGE);
    let mut state: Vec<State> = requests.iter().map(|_| State::Waiting).collect();
    let mut got: Vec<Vec<f32>> = requests.iter().map(|r| vec![f32::NAN; r.x.len()]).collect();
    let (mut step, mut tokens_run, mut peak_pages, mut steps_run) = (0, 0, 0, 0);
    let mut copied = 0;
    let started = Instant::now();
    while state.iter().any(|s| !matches!(s, State::Done)) {
        admit(&requests, &mut state, &mut pages, &mut got, step);
        // Each running request's next tokens, its pages grown for them (copies first).
        let mut batch = Vec::new(); // (request, first token, count)
        let mut copies = Vec::new();
        for (i, s) in state.iter_mut().enumerate() {
            if let State::Running(seq, done) = s {
                let count = if *done < requests[i].prompt {
                    (requests[i].prompt - *done).min(CHUNK)
                } else {
                    1
                };
                let grown = pages.grow(seq, count)?;
                copies.extend(grown.copies);
                batch.push((i, *done, count));
            }
        }
        peak_pages = peak_pages.max(pages.used_pages());
        if batch.is_empty() {
            step += 1;
            continue;
        }
        let seqs: Vec<&Sequence> = batch
            .iter()
            .filter_map(|&(i, ..)| match &state[i] {
                State::Running(seq, _) => Some(seq),
                _ => None,
            })
            .collect();
        let table = pages.table(&seqs);
        let mut qo_indptr = vec![0u32];
        let mut x = Vec::new();
        for &(i, first, count) in &batch {
            qo_indptr.push(qo_indptr[qo_indptr.len() - 1] + count as u32);
            x.extend_from_slice(&requests[i].x[first * WIDTH..(first + count) * WIDTH]);
        }
        let tokens = x.len() / WIDTH;
        copied += copies.len();
        let plan = PagedStep::new(&gpu, &config, &pool_config, &qo_indptr, &table, None)?;
        let x = GpuTensor::upload(&gpu, &Tensor::new([tokens, WIDTH], x)?)?;
        // The whole step, both layers, one submission.
        let mut encoder = gpu.device().create_command_encoder(&Default::default());
        for pool in &pools {
            pool.record_copy_pages(&gpu, &mut encoder, &copies)?;
        }
        let h1 = layers[0].record_paged_step(&mut encoder, &plan, &pools[0], &x)?;
        let h2 = layers[1].record_paged_step(&mut encoder, &plan, &pools[1], &h1)?;
        gpu.queue().submit([encoder.finish()]);
        let out = h2.read(&gpu)?;
        let mut row = 0;
        for &(i, first, count) in &batch {
            got[i][first * WIDTH..(first + count) * WIDTH]
                .copy_from_slice(&out.data()[row * WIDTH..(row + count) * WIDTH]);
            row += count;
            if let State::Running(seq, done) = &mut state[i] {
                *done += count;
                if *done == requests[i].len() {
                    pages.release(std::mem::take(seq));
                    state[i] = State::Done;
                }
            }
        }
        tokens_run += tokens;
        steps_run += 1;
        step += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    let compiled_serving = gpu.cached_passes() - compiled_before;

    let mut worst = 0.0f32;
    for (r, g) in requests.iter().zip(&got) {
        let want = alone(&layers, r)?;
        let err = g
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        worst = if err.is_nan() {
            f32::NAN
        } else {
            worst.max(err)
        };
    }
    let contiguous = MAX_RUNNING * longest;
    println!(
        "{REQUESTS} requests, {tokens_run} tokens in {steps_run} steps on {}, {:?} pages: {:.0} \
         tokens/s (both layers, host reads included)",
        gpu.describe(),
        pool_config.layout,
        tokens_run as f64 / seconds
    );
    println!(
        "peak pages: {peak_pages} of {PAGE} tokens = {} token slots, against {contiguous} that \
         {MAX_RUNNING} contiguous caches of the longest request ({longest}) would reserve ({:.0}%)",
        peak_pages * PAGE,
        100.0 * (peak_pages * PAGE) as f64 / contiguous as f64
    );
    println!(
        "passes compiled before the first request: {compiled_before} in {:.0} ms; while \
         serving: {compiled_serving}",
        warm_seconds * 1e3
    );
    let empty = pages.used_pages() == 0;
    println!(
        "shared prompt: {SHARED_PROMPT} tokens attended from shared pages, {copied} page(s) \
         copied on write"
    );
    println!(
        "largest error against each request alone through KvCache: {worst:.2e} (tolerance \
         {TOLERANCE:.0e}); pool empty at the end: {empty}"
    );
    Ok(worst <= TOLERANCE && empty && copied > 0 && compiled_serving == 0)
}

/// Starts waiting requests that have arrived while fewer than `MAX_RUNNING` run. A request
/// sharing another's prompt starts once that prompt has run: from a fork of its pages, with
/// the prompt's outputs (the same rows) already known.
fn admit(
    requests: &[Request],
    state: &mut [State],
    pages: &mut PageAllocator,
    got: &mut [Vec<f32>],
    step: usize,
) {
    for i in 0..requests.len() {
        let running = state
            .iter()
            .filter(|s| matches!(s, State::Running(..)))
            .count();
        if running >= MAX_RUNNING || !matches!(state[i], State::Waiting) {
            continue;
        }
        if requests[i].arrives > step {
            continue;
        }
        match requests[i].shares_prompt_of {
            None => state[i] = State::Running(pages.sequence(), 0),
            Some(parent) => {
                let State::Running(seq, done) = &state[parent] else {
                    continue;
                };
                if *done != requests[parent].prompt {
                    continue;
                }
                let fork = pages.fork(seq);
                let prompt = requests[i].prompt * WIDTH;
                let rows = got[parent][..prompt].to_vec();
                got[i][..prompt].copy_from_slice(&rows);
                state[i] = State::Running(fork, requests[i].prompt);
            }
        }
    }
}
