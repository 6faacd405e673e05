//! `wgpu-mha check` and `wgpu-mha run`: case files and PyTorch state dicts on the GPU.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use wgpu_mha::io::case::add_zero_attn;
use wgpu_mha::io::files::PendingOutput;
use wgpu_mha::io::hf::HfCheckpoint;
use wgpu_mha::io::masks::read_mask;
use wgpu_mha::io::{layouts::load_weights, safetensors::serialize_safetensors};
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{
    Case, Error, ForwardOptions, Gpu, GpuOptions, MultiHeadAttention, SafetensorsFile, Tensor,
};

use crate::cli::progress::SlowNote;
use crate::cli::run_args::{PathArg, RunArgs};
use crate::cli::torch_layout::InputLayout;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Case files (safetensors, DESIGN.md "Weights and the case file").
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Attention core to run.
    #[arg(long, value_enum, default_value_t)]
    path: PathArg,
}

/// Runs every case file; one line per file, then `N passed, N failed`.
pub fn check(options: &GpuOptions, args: &CheckArgs) -> Result<ExitCode, Error> {
    let _note = SlowNote::start("check");
    let gpu = Gpu::with_options(options)?;
    println!("adapter: {}", gpu.describe());
    let forward_options = args.path.options();
    let (mut passed, mut failed) = (0usize, 0usize);
    for path in &args.files {
        let name = path.display();
        let outcome = Case::from_file(path).and_then(|case| {
            let result = case.run(&gpu, &forward_options)?;
            Ok((case, result))
        });
        match outcome {
            Ok((case, result)) => {
                let verdict = if result.passed() { "PASS" } else { "FAIL" };
                if result.passed() {
                    passed += 1;
                } else {
                    failed += 1;
                }
                let capped = match case.bound_capped() {
                    true => " (the file's err_f32_vs_f64 was capped at 1e-2·(1+max|out_f64|))",
                    false => "",
                };
                println!(
                    "{name}  {}  max_abs_err={:.3e}  bound={:.3e}{capped}  {verdict}",
                    case.describe(),
                    result.max_abs_err,
                    result.bound
                );
            }
            Err(e) => {
                failed += 1;
                println!("{name}  error: {e}  FAIL");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs a case file or weights + inputs and writes `out`.
pub fn run(options: &GpuOptions, args: &RunArgs) -> Result<ExitCode, Error> {
    let _note = SlowNote::start("run");
    let forward_options = ForwardOptions {
        return_probs: args.probs,
        ..args.path.options()
    };
    // Before any work: the output must not be an input, and its directory must take a file.
    // A model directory's inputs are the files in it that are read: config, index, shards.
    let checkpoint_files = match &args.hf {
        Some(hf) => HfCheckpoint::input_files(hf)?,
        None => Vec::new(),
    };
    let inputs: Vec<&std::path::Path> = [&args.case, &args.weights, &args.hf, &args.inputs]
        .into_iter()
        .flatten()
        .chain(&checkpoint_files)
        .map(PathBuf::as_path)
        .collect();
    let pending = PendingOutput::create(&args.out, &inputs)?;
    let (output, weights) = if let Some(case_path) = &args.case {
        let case = Case::from_file(case_path)?;
        let gpu = Gpu::with_options(options)?;
        let result = case.run(&gpu, &forward_options)?;
        println!(
            "{}: {}  max_abs_err={:.3e} vs out_f64 (bound {:.3e})",
            case_path.display(),
            case.describe(),
            result.max_abs_err,
            result.bound
        );
        let probs = result.forward.probs;
        let weights = probs.map(|p| InputLayout::BatchFirst.weights(p, args.average));
        (result.forward.output, weights.transpose()?)
    } else if let Some(hf) = &args.hf {
        crate::cli::hf::run(options, args, hf, &forward_options)?
    } else {
        // clap guarantees --weights and --inputs here; stay defensive without panicking.
        let (Some(weights_path), Some(inputs_path)) = (&args.weights, &args.inputs) else {
            return Err(Error::Misuse(
                "run needs --case FILE, or --weights FILE and --inputs FILE".into(),
            ));
        };
        let weights_file = SafetensorsFile::open(weights_path)?;
        let prefix = args
            .prefix
            .clone()
            .or_else(|| weights_file.metadata("prefix").map(str::to_string))
            .unwrap_or_default();
        let mut loaded = load_weights(&weights_file, &prefix, args.heads)?;
        if let Some(scale) = args.scale {
            loaded.config = loaded.config.with_scale(scale)?;
        }
        if args.add_zero_attn || add_zero_attn(&weights_file)? {
            loaded.config = loaded
                .config
                .with_appended_keys(loaded.config.add_bias_kv, true);
        }
        let inputs = SafetensorsFile::open(inputs_path)?;
        let (query, key, value) = read_inputs(&inputs)?;
        let layout = InputLayout::of(query.shape().len(), args.seq_first)?;
        let query = layout.to_batch_first(query, "query")?;
        let key = layout.to_batch_first(key, "key")?;
        let value = value
            .map(|v| layout.to_batch_first(v, "value"))
            .transpose()?;
        let value_shape = value.as_ref().unwrap_or(&key).shape();
        loaded
            .config
            .check_inputs(query.shape(), key.shape(), value_shape)?;
        let dims = AttnDims {
            batch: query.shape()[0],
            heads: loaded.config.heads,
            lq: query.shape()[1],
            lk: key.shape()[1],
        };
        let mask = read_mask(&inputs, dims)?;
        let gpu = Gpu::with_options(options)?;
        let mha = MultiHeadAttention::new(&gpu, loaded.config, &loaded.weights)?;
        let value = value.as_ref().unwrap_or(&key);
        let forward = mha.forward_with(&query, &key, value, &mask, &forward_options)?;
        println!(
            "{}: {} layout, {} heads, output {:?} ({:?} path)",
            weights_path.display(),
            loaded.layout.name(),
            loaded.config.heads,
            forward.output.shape(),
            forward.path
        );
        let weights = forward.probs.map(|p| layout.weights(p, args.average));
        (layout.output(forward.output)?, weights.transpose()?)
    };
    let mut tensors = vec![("out", &output)];
    if let Some(w) = &weights {
        tensors.push(("attn_weights", w));
    }
    pending.commit(&serialize_safetensors(&tensors, None)?)?;
    for (name, t) in &tensors {
        println!("wrote `{name}` {:?} to {}", t.shape(), args.out.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `(query, key, value)`; `value` is `None` when keys and values share `x_k_v`.
fn read_inputs(file: &SafetensorsFile) -> Result<(Tensor, Tensor, Option<Tensor>), Error> {
    for [q, k, v] in [["query", "key", "value"], ["Q", "K", "V"]] {
        if file.contains(q) {
            return Ok((
                file.tensor_f32(q)?,
                file.tensor_f32(k)?,
                Some(file.tensor_f32(v)?),
            ));
        }
    }
    if file.contains("x_q") {
        return Ok((file.tensor_f32("x_q")?, file.tensor_f32("x_k_v")?, None));
    }
    Err(Error::File {
        source_name: file.name().to_string(),
        problem: "no inputs: expected tensors `query`, `key`, `value` (or `Q`, `K`, `V`), or `x_q`, `x_k_v`"
            .into(),
    })
}
