//! One module and one GPU context shared by 8 threads: every forward is correct.
//! `MultiHeadAttention` and `Gpu` are `Send + Sync`: a forward takes a workspace out of the
//! module's cache for its whole duration (upload, dispatch, readback), so concurrent calls
//! never share buffers; wgpu's error scopes are per thread.

mod common;

use std::sync::Arc;

use wgpu_mha::{reference, AttentionConfig, Gpu, Mask, MultiHeadAttention, Tensor};

#[test]
fn module_and_context_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MultiHeadAttention>();
    assert_send_sync::<Gpu>();
}

#[test]
fn eight_threads_share_one_module() {
    let config = AttentionConfig::classic(32, 4).unwrap();
    let (weights, mha) = common::module(config, 8);
    let mha = Arc::new(mha);
    let weights = Arc::new(weights);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let mha = mha.clone();
            let weights = weights.clone();
            std::thread::spawn(move || {
                // Each thread uses its own inputs (and some share shapes, some do not), so a
                // mix-up between threads shows as a wrong answer.
                let len = 5 + (t as usize % 3);
                for i in 0..6u64 {
                    let x = Tensor::random([2, len, 32], t * 100 + i);
                    let mask = if i % 2 == 0 { Mask::Causal } else { Mask::None };
                    let got = mha.forward(&x, &x, &x, &mask).expect("forward");
                    let want = reference::forward(&config, &weights, &x, &x, &x, &mask).unwrap();
                    common::assert_close(&format!("thread {t} call {i}"), got.data(), &want.output);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a worker thread panicked");
    }
}
