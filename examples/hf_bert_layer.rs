//! A BERT attention layer as `transformers` saved it, on the GPU.
//!
//! ```text
//! cargo run --release --example hf_bert_layer                     # the repository's tiny BERT
//! cargo run --release --example hf_bert_layer -- MODEL_DIR LAYER INPUTS.safetensors
//! ```
//! The default is `tests/fixtures/hf_models/bert` (a random-init `BertModel`, `config.json` +
//! `model.safetensors`, made by `tools/gen_hf_cases.py`), layer 1, with the inputs of
//! `tests/fixtures/hf/bert_self_layer1_padding.safetensors`: the `hidden_states` that reach that
//! layer's attention, an `attention_mask` (1 = real token) and `transformers`' own float64
//! answer `out_f64`. Exits with status 1 if the GPU disagrees with it.

use std::path::PathBuf;
use std::process::ExitCode;

use wgpu_mha::io::hf::HfCheckpoint;
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{Gpu, MultiHeadAttention, SafetensorsFile};

fn main() -> Result<ExitCode, wgpu_mha::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let (model, layer, inputs) = match &args[..] {
        [m, l, i] => (PathBuf::from(m), l.parse().unwrap_or(0), PathBuf::from(i)),
        _ => (
            root.join("hf_models/bert"),
            1,
            root.join("hf/bert_self_layer1_padding.safetensors"),
        ),
    };

    // 1. The checkpoint as saved; the layer's attention module found by its tensor names.
    let ckpt = HfCheckpoint::open(&model)?;
    let prefix = ckpt.layer_prefix(layer)?;
    let module = ckpt.attention(&prefix, None)?;
    println!(
        "{}: {:?} attention at {prefix:?}, {} heads",
        ckpt.name(),
        module.family,
        module.config.heads
    );

    // 2. Its inputs, and the mask transformers applies: the padding of attention_mask.
    let file = SafetensorsFile::open(&inputs)?;
    let hidden = file.tensor_f32("hidden_states")?;
    let padding = file.mask_tensor("attention_mask").ok();
    let dims = AttnDims {
        batch: hidden.shape()[0],
        heads: module.config.heads,
        lq: hidden.shape()[1],
        lk: hidden.shape()[1],
    };
    let mask = module.mask(dims, padding.as_ref())?;

    // 3. On the GPU.
    let gpu = Gpu::new()?;
    println!("adapter: {}", gpu.describe());
    let mha = MultiHeadAttention::new(&gpu, module.config, &module.weights)?;
    let out = mha.forward(&hidden, &hidden, &hidden, &mask)?;

    // 4. Against transformers' float64 answer; a NaN never agrees.
    let (_, want) = file.tensor_f64("out_f64")?;
    let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
    let err = out.max_abs_diff(&want);
    let bound = 1e-5;
    println!(
        "output {:?}: max |GPU - transformers f64| = {err:.2e} (bound {bound:.0e})",
        out.shape()
    );
    let ok = err <= bound;
    println!("{}", if ok { "AGREE" } else { "DISAGREE" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
