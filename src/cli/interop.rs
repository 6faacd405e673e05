//! `wgpu-mha check` and `wgpu-mha run`: case files and PyTorch state dicts on the GPU.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use wgpu_mha::io::case::add_zero_attn;
use wgpu_mha::io::files::PendingOutput;
use wgpu_mha::io::hf::HfCheckpoint;
use wgpu_mha::io::masks::read_mask;
use wgpu_mha::io::{layouts::load_weights, safetensors::serialize_safetensors};
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::{
    AttentionPath, Case, Error, ForwardOptions, Gpu, GpuOptions, MultiHeadAttention,
    SafetensorsFile, Tensor,
};

use crate::cli::progress::SlowNote;
use crate::cli::torch_layout::InputLayout;

/// Which attention core to run (`auto` = fused unless it cannot be used).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum PathArg {
    #[default]
    Auto,
    Multipass,
    Fused,
}

impl PathArg {
    pub(crate) fn options(self) -> ForwardOptions {
        ForwardOptions {
            return_probs: false,
            path: match self {
                PathArg::Auto => AttentionPath::Auto,
                PathArg::Multipass => AttentionPath::MultiPass,
                PathArg::Fused => AttentionPath::Fused,
            },
            positions: None,
        }
    }
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Case files (safetensors, DESIGN.md "Weights and the case file").
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Attention core to run.
    #[arg(long, value_enum, default_value_t)]
    path: PathArg,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A case file: its weights, inputs and mask are used.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["weights", "hf", "inputs", "prefix", "heads"], required_unless_present_any = ["weights", "hf"])]
    case: Option<PathBuf>,
    /// Weights: a state dict in safetensors (`W_q.*`, `w_q.*`, or nn.MultiheadAttention's
    /// `in_proj_weight`/`q_proj_weight`, `out_proj.*`).
    #[arg(long, value_name = "FILE", requires = "inputs", conflicts_with = "hf")]
    weights: Option<PathBuf>,
    /// A Hugging Face checkpoint as saved: a directory (`config.json` + `model.safetensors` or
    /// its shards) or one safetensors file; pick the module with --layer or --prefix. Inputs:
    /// `hidden_states`, `key_value_states` (cross-attention), `attention_mask` (1 = real token).
    #[arg(long, value_name = "DIR|FILE", requires = "inputs")]
    pub(crate) hf: Option<PathBuf>,
    /// With --hf: the layer whose attention module runs (when the layer has several, use --prefix).
    #[arg(long, requires = "hf", conflicts_with = "prefix")]
    pub(crate) layer: Option<usize>,
    /// Prefix of the attention tensors in the weights file (e.g. `encoder.layers.0.self_attn.`);
    /// default: the file's `prefix` metadata, else none.
    #[arg(long)]
    pub(crate) prefix: Option<String>,
    /// Number of heads (default: the weights file's `num_heads`/`heads` metadata, or config.json).
    #[arg(long)]
    pub(crate) heads: Option<usize>,
    /// Inputs: `query`, `key`, `value` (or `Q`, `K`, `V`), or `x_q`, `x_k_v`; optional mask
    /// `mask` (u8, 0 = masked) or `attn_mask` (bool: true = masked; float: added to the scores),
    /// and `key_padding_mask` `[B, Lk]` (true = padding), as PyTorch takes them.
    #[arg(long, value_name = "FILE")]
    pub(crate) inputs: Option<PathBuf>,
    /// Where to write the output tensor `out` (f32, safetensors).
    #[arg(long, value_name = "FILE")]
    pub(crate) out: PathBuf,
    /// Attention core to run.
    #[arg(long, value_enum, default_value_t)]
    path: PathArg,
    /// Inputs are sequence-first `[L, B, E]` (nn.MultiheadAttention's default,
    /// `batch_first=False`); the output is written the same way. Unbatched `[L, E]` inputs need
    /// no flag.
    #[arg(long, conflicts_with_all = ["case", "hf"])]
    seq_first: bool,
    /// Score scale replacing 1/√d_k (F.scaled_dot_product_attention's `scale`; T5 uses 1).
    /// Not with --hf, whose config.json gives the scale.
    #[arg(long, conflicts_with_all = ["case", "hf"])]
    scale: Option<f32>,
    /// nn.MultiheadAttention(add_zero_attn=True): a zero key and value after the input's (and
    /// after `bias_k`/`bias_v`, which come with the weights). Also read from the weights file's
    /// metadata `add_zero_attn` = "true".
    #[arg(long, conflicts_with_all = ["case", "hf"])]
    add_zero_attn: bool,
    /// Also write the attention weights `attn_weights` `[B, H, Lq, Lk]` (runs the multi-pass
    /// path, which computes them).
    #[arg(long)]
    pub(crate) probs: bool,
    /// With --probs: average the weights over heads, `[B, Lq, Lk]`, as PyTorch's
    /// `average_attn_weights=True`.
    #[arg(long, requires = "probs")]
    pub(crate) average: bool,
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
