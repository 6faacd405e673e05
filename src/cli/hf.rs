//! `wgpu-mha inspect` and `wgpu-mha run --hf`: Hugging Face checkpoints as saved.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use wgpu_mha::attention::mla_stage::MlaStage;
use wgpu_mha::io::hf::case::read_positions;
use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::model::mask::AttnDims;
use wgpu_mha::model::rope::RopeScaling;
use wgpu_mha::{
    Error, ForwardOptions, Gpu, GpuOptions, MultiHeadAttention, SafetensorsFile, Tensor,
};

use crate::cli::run_args::RunArgs;
use crate::cli::torch_layout::InputLayout;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A model directory (`config.json` + `model.safetensors` or shards) or a safetensors file.
    #[arg(value_name = "DIR|FILE")]
    path: PathBuf,
}

/// Lists every attention module found: family, prefix, how it attends, sizes, position scheme,
/// and whether it runs (or exactly why not).
pub fn inspect(args: &InspectArgs) -> Result<ExitCode, Error> {
    let ckpt = HfCheckpoint::open(&args.path)?;
    let modules = ckpt.modules();
    let model_type = ckpt.config().and_then(|c| c.model_type()).unwrap_or("?");
    let model_type_or = |family: &'static str| match model_type {
        "?" => family.to_string(),
        known => known.to_string(),
    };
    println!(
        "{}: model_type {model_type}, {} tensors, {} attention modules",
        ckpt.name(),
        ckpt.names().len(),
        modules.len()
    );
    for (family, prefix) in &modules {
        let line = match ckpt.attention(prefix, None) {
            Ok(m) => format!("{}  runs", describe(&m)),
            Err(e) => format!("{} {prefix}  NOT RUN: {e}", model_type_or(family.name())),
        };
        println!("  {line}");
    }
    if modules.is_empty() {
        println!("  (no attention module recognised; DESIGN.md lists the families)");
    }
    Ok(ExitCode::SUCCESS)
}

fn describe(m: &HfAttention) -> String {
    let c = &m.config;
    let mut s = format!(
        "{} {}  {}{}  E={} heads={} head_dim={}",
        m.model_type.as_deref().unwrap_or(m.family.name()),
        m.prefix,
        if m.cross { "cross" } else { "self" },
        if m.causal { " causal" } else { "" },
        c.model_dim,
        c.heads,
        c.qk_head_dim
    );
    if let Some(block) = m.local_block {
        s.push_str(&format!(" local(block={block})"));
    }
    if m.gated_bias.is_some() {
        s.push_str(" gated_relative_bias");
    }
    if let Some(b) = &m.grid_bias {
        s.push_str(&format!(" grid_bias(tokens={})", b.shape()[2]));
    }
    if let Some(norm) = &m.input_norm {
        s.push_str(&format!(
            " input_norm={norm} (not computed: inputs are its output)"
        ));
    }
    if let Some(scale) = c.scale {
        s.push_str(&format!(" scale={scale}"));
    }
    if let Some(cap) = c.softcap {
        s.push_str(&format!(" softcap={cap}"));
    }
    if c.sinks {
        s.push_str(" sinks");
    }
    if let Some(eps) = c.output_norm {
        s.push_str(&format!(" output_norm(Rms, eps={eps})"));
    }
    if c.output_gate {
        s.push_str(" output_gate(sigmoid)");
    }
    if let Some(clip) = c.clip_qkv {
        s.push_str(&format!(" clip_qkv={clip}"));
    }
    if let Some(m) = c.alibi {
        s.push_str(&format!(" alibi(max_bias={m})"));
    }
    if let Some(n) = &c.qk_norm {
        let biased = m
            .weights
            .qk_norm
            .as_ref()
            .is_some_and(|w| !w.q_bias.is_empty());
        s.push_str(&format!(
            " qk_norm({:?} {:?}, eps={}{}{})",
            n.kind,
            n.scope,
            n.eps,
            if biased { ", bias" } else { "" },
            if n.after_rope { ", after rope" } else { "" }
        ));
    }
    if let Some(mla) = &m.mla {
        // The core's head_dim and kv_heads=1 are the absorbed form's: the latent is the key.
        let d = mla.dims();
        s.push_str(&format!(
            " mla(q_lora_rank={}, kv_lora_rank={}, qk_nope_head_dim={}, qk_rope_head_dim={}, \
             v_head_dim={}; cache {} floats/token)",
            d.q_lora_rank.map_or("none".into(), |r| r.to_string()),
            d.kv_lora_rank,
            d.qk_nope_head_dim,
            d.qk_rope_head_dim,
            d.v_head_dim,
            d.latent_width()
        ));
    } else if c.kv_heads != c.heads {
        s.push_str(&format!(" kv_heads={}", c.kv_heads));
    }
    if let Some(r) = &c.rope {
        let scaling = match r.scaling {
            RopeScaling::None => "default".to_string(),
            RopeScaling::Linear { factor } => format!("linear×{factor}"),
            RopeScaling::Llama3 { factor, .. } => format!("llama3×{factor}"),
            RopeScaling::Yarn {
                factor,
                attention_factor,
                ..
            } => format!("yarn×{factor} attention_factor={attention_factor}"),
            RopeScaling::Dynamic {
                factor,
                max_positions,
            } => format!("dynamic×{factor} past {max_positions}"),
            RopeScaling::LongRope {
                original_max_positions,
                attention_factor,
                ..
            } => format!(
                "longrope past {original_max_positions} attention_factor={attention_factor}"
            ),
        };
        s.push_str(&format!(
            " rope(θ={}, rotary_dims={}, {scaling}{})",
            r.theta,
            r.rotary_dims,
            if r.interleaved { ", interleaved" } else { "" }
        ));
    } else if m.is_nope_layer() {
        s.push_str(" nope");
    }
    if let Some(w) = m.window {
        // An encoder's window reaches both ways (ModernBERT: |i − j| ≤ w).
        let both = if m.causal { "" } else { "±" };
        s.push_str(&format!(" window={both}{w}"));
    }
    if let Some(c) = m.chunk {
        s.push_str(&format!(" chunked={c}"));
    }
    if let Some(t) = c.temperature {
        s.push_str(&format!(
            " temperature(floor_scale={}, attn_scale={})",
            t.floor_scale, t.attn_scale
        ));
    }
    if let Some(b) = &m.relative_bias {
        s.push_str(&format!(
            " relative_bias(buckets={}, max_distance={}, {})",
            b.buckets,
            b.max_distance,
            if b.bidirectional {
                "bidirectional"
            } else {
                "one-way"
            }
        ));
    }
    s
}

/// `run --hf`: the module picked by `--layer`/`--prefix` on `hidden_states` (and
/// `key_value_states` for cross-attention) with its own causal mask, the `attention_mask`
/// padding and T5's relative bias. Returns the output and, with `--probs`, the weights.
pub fn run(
    options: &GpuOptions,
    args: &RunArgs,
    hf: &Path,
    forward_options: &ForwardOptions,
) -> Result<(Tensor, Option<Tensor>), Error> {
    let ckpt = HfCheckpoint::open(hf)?;
    let prefix = match (args.layer, &args.prefix) {
        (Some(layer), _) => ckpt.layer_prefix(layer)?,
        (None, Some(p)) => p.clone(),
        (None, None) => {
            return Err(Error::Misuse(
                "run --hf needs --layer N or --prefix P (`wgpu-mha inspect` lists the modules)"
                    .into(),
            ))
        }
    };
    let module = ckpt.attention(&prefix, args.heads)?;
    let Some(inputs_path) = &args.inputs else {
        return Err(Error::Misuse("run --hf needs --inputs FILE".into()));
    };
    let inputs = SafetensorsFile::open(inputs_path)?;
    let hidden = inputs.tensor_f32("hidden_states")?;
    let kv = match (module.cross, inputs.contains("key_value_states")) {
        (true, true) => Some(inputs.tensor_f32("key_value_states")?),
        (true, false) => {
            return Err(Error::File {
                source_name: inputs.name().into(),
                problem: format!("`{prefix}` is a cross-attention module: give `key_value_states`"),
            })
        }
        (false, true) => {
            return Err(Error::File {
                source_name: inputs.name().into(),
                problem: format!(
                    "`{prefix}` is a self-attention module, but `key_value_states` is given"
                ),
            })
        }
        (false, false) => None,
    };
    // MLA's core runs on its pre-stage's query input and latent (made on the device).
    let mut device = None;
    let (hidden, latent) = match &module.mla {
        Some(mla) => {
            let gpu = Gpu::with_options(options)?;
            let inputs = MlaStage::new(&gpu, mla).of(&hidden)?;
            device = Some(gpu);
            inputs
        }
        None => (hidden.clone(), hidden),
    };
    let key = kv.as_ref().unwrap_or(&latent);
    let c = &module.config;
    c.check_inputs(hidden.shape(), key.shape(), key.shape())?;
    let dims = AttnDims {
        batch: hidden.shape()[0],
        heads: c.heads,
        lq: hidden.shape()[1],
        lk: key.shape()[1],
    };
    let padding = match inputs.contains("attention_mask") {
        true => Some(inputs.mask_tensor("attention_mask")?),
        false => None,
    };
    let mask = module.mask_for(&hidden, dims, padding.as_ref())?;
    let forward_options = &ForwardOptions {
        positions: read_positions(&inputs, &module.config, dims.batch, dims.lk)?,
        ..forward_options.clone()
    };
    let gpu = match device {
        Some(gpu) => gpu,
        None => Gpu::with_options(options)?,
    };
    let mha = MultiHeadAttention::new(&gpu, module.config, &module.weights)?;
    let forward = mha.forward_with(&hidden, key, key, &mask, forward_options)?;
    println!(
        "{}: {} ({:?} path)",
        ckpt.name(),
        describe(&module),
        forward.path
    );
    let weights = forward
        .probs
        .map(|p| InputLayout::BatchFirst.weights(p, args.average))
        .transpose()?;
    Ok((forward.output, weights))
}
