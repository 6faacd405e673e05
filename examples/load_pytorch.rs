//! Load a PyTorch `nn.MultiheadAttention` from a safetensors state dict and run it on the GPU.
//!
//! ```text
//! cargo run --release --example load_pytorch                        # the embedded default
//! cargo run --release --example load_pytorch -- FILE.safetensors [PREFIX]
//! ```
//! The embedded default is `tests/fixtures/weights/mha_packed_prefixed_e32_h4.safetensors`:
//! an `nn.MultiheadAttention(32, 4, batch_first=True)` inside an encoder layer (names under
//! `encoder.layers.0.self_attn.`), saved by `tools/gen_weights.py` with inputs `query`, `key`,
//! `value` and PyTorch's own f64 answer `out_f64`. Export your own with
//! `safetensors.torch.save_file(model.state_dict(), "model.safetensors", metadata={"num_heads": "8"})`.
//! Exits with status 1 if the GPU disagrees with PyTorch's answer or the CPU reference.

use std::process::ExitCode;

use wgpu_mha::{reference, Gpu, Mask, MultiHeadAttention, SafetensorsFile};

const DEFAULT: &[u8] =
    include_bytes!("../tests/fixtures/weights/mha_packed_prefixed_e32_h4.safetensors");

fn main() -> Result<ExitCode, wgpu_mha::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // 1. The file: a path from the command line, or the embedded default.
    let file = match args.first() {
        Some(path) => SafetensorsFile::open(path)?,
        None => {
            SafetensorsFile::from_bytes("mha_packed_prefixed_e32_h4.safetensors", DEFAULT.to_vec())?
        }
    };
    let prefix = args
        .get(1)
        .cloned()
        .or_else(|| file.metadata("prefix").map(str::to_string))
        .unwrap_or_default();

    // 2. Weights by state-dict name; the config (sizes, heads from metadata `num_heads`) comes
    //    from the tensors' shapes.
    let loaded = wgpu_mha::io::layouts::load_weights(&file, &prefix, None)?;
    let config = loaded.config;
    println!(
        "layout {:?} under prefix {prefix:?}: {config:?}",
        loaded.layout
    );

    // 3. The module on the GPU, and the stored inputs.
    let gpu = Gpu::new()?;
    println!("adapter: {}", gpu.describe());
    let mha = MultiHeadAttention::new(&gpu, config, &loaded.weights)?;
    let (query, key, value) = (
        file.tensor_f32("query")?,
        file.tensor_f32("key")?,
        file.tensor_f32("value")?,
    );
    let out = mha.forward(&query, &key, &value, &Mask::None)?;
    println!("query {:?} -> output {:?}", query.shape(), out.shape());

    // 4. Compare with PyTorch's answer (when the file has one) and with the CPU reference.
    //    A NaN anywhere makes the error NaN, and `NaN <= bound` is false: a NaN never agrees.
    let want = reference::forward(&config, &loaded.weights, &query, &key, &value, &Mask::None)?;
    let bound = 1e-5 * (1.0 + want.max_abs() as f32);
    let err_ref = out.max_abs_diff(&want.output_f32());
    println!("max |GPU - CPU reference| = {err_ref:.2e} (bound {bound:.1e})");
    let mut ok = err_ref <= bound;
    if let Ok((shape, torch)) = file.tensor_f64("out_f64") {
        let torch: Vec<f32> = torch.iter().map(|&v| v as f32).collect();
        let err_torch = out.max_abs_diff(&torch);
        println!("max |GPU - PyTorch f64| = {err_torch:.2e} (bound {bound:.1e})");
        ok &= shape == out.shape() && err_torch <= bound;
    }
    println!("{}", if ok { "AGREE" } else { "DISAGREE" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
