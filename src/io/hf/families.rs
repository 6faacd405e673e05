//! Attention modules of Hugging Face checkpoints, recognised by tensor names under a prefix
//! (DESIGN.md's families table), and loaded into the crate's `[out, in]` projections.

use crate::error::{Error, Result};

pub use super::family::Family;
pub use super::model_table::MODEL_TYPES;
use super::model_table::{GPT2, REFUSED_TYPES};
pub use super::model_types::{Biases, Causality, ModelType, NormTensors, QkNormRule};

/// `(family, the tensor whose name marks the module, a tensor that must sit beside it)`.
const MARKERS: [(Family, &str, Option<&str>); 15] = [
    (
        Family::Mla,
        "kv_a_proj_with_mqa.weight",
        Some("o_proj.weight"),
    ),
    (
        Family::Bert,
        "self.query.weight",
        Some("output.dense.weight"),
    ),
    (
        Family::Vit,
        "attention.query.weight",
        Some("output.dense.weight"),
    ),
    (Family::DistilBert, "q_lin.weight", Some("out_lin.weight")),
    (Family::Gpt2, "c_attn.weight", Some("c_proj.weight")),
    (Family::Bart, "q_proj.weight", Some("out_proj.weight")),
    (Family::Llama, "q_proj.weight", Some("o_proj.weight")),
    (Family::Phi3, "qkv_proj.weight", Some("o_proj.weight")),
    (
        Family::GptNeox,
        "query_key_value.weight",
        Some("dense.weight"),
    ),
    (Family::T5, "q.weight", Some("o.weight")),
    (Family::Phi, "q_proj.weight", Some("dense.weight")),
    (Family::Albert, "query.weight", Some("dense.weight")),
    (Family::Mpt, "Wqkv.weight", Some("out_proj.weight")),
    (Family::CodeGen, "qkv_proj.weight", Some("out_proj.weight")),
    (Family::ModernBert, "Wqkv.weight", Some("Wo.weight")),
];

impl Family {
    /// The name used by `inspect` and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::Vit => "vit",
            Family::DistilBert => "distilbert",
            Family::Gpt2 => "gpt2",
            Family::Bart => "bart",
            Family::T5 => "t5",
            Family::Llama => "llama",
            Family::Phi3 => "phi3",
            Family::GptNeox => "gpt_neox",
            Family::Phi => "phi",
            Family::Albert => "albert",
            Family::Mpt => "mpt",
            Family::CodeGen => "codegen",
            Family::ModernBert => "modernbert",
            Family::Mla => "mla",
        }
    }

    /// Whether the family rotates queries and keys (RoPE).
    pub fn uses_rope(self) -> bool {
        matches!(
            self,
            Family::Llama
                | Family::Phi3
                | Family::GptNeox
                | Family::Phi
                | Family::CodeGen
                | Family::ModernBert
        )
    }

    /// The model type a module of this layout runs as: `model_type` must be on the family's
    /// allow-list ([`MODEL_TYPES`]): the model types known to compute exactly what this loader
    /// computes with these tensor names. Without a `model_type` only GPT-2's Conv1D layout is
    /// taken (no other model saves a `c_attn [E, 3E]` + `c_proj` pair); every other layout is
    /// shared by models whose attention differs (GPT-J and GPT-Neo under bart's names, RoFormer
    /// and BigBird under bert's, BEiT under vit's, UMT5 and LongT5 under t5's, Cohere and
    /// Granite under llama's, BLOOM and Falcon under gpt_neox's), so it is refused.
    pub fn model_type(self, model_type: Option<&str>, prefix: &str) -> Result<&'static ModelType> {
        let module = format!("{} attention `{prefix}`", self.name());
        let accepted = || {
            MODEL_TYPES
                .iter()
                .filter(|t| t.family == self)
                .map(|t| t.name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some(name) = model_type else {
            return match self {
                Family::Gpt2 => Ok(&MODEL_TYPES[GPT2]),
                _ => Err(Error::UnsupportedModule {
                    module,
                    what: "a module without `model_type` in config.json".into(),
                    why: format!(
                        "other models save these tensor names with other attention ({}); \
                         give config.json (or case metadata hf_config) with its model_type, one \
                         of: {}",
                        self.look_alikes(),
                        accepted()
                    ),
                }),
            };
        };
        if let Some(t) = MODEL_TYPES
            .iter()
            .find(|t| t.name == name && t.family == self)
        {
            return Ok(t);
        }
        let why = match REFUSED_TYPES.iter().find(|(n, _)| *n == name) {
            Some((_, why)) => format!("{name}: {why}"),
            None => match MODEL_TYPES.iter().find(|t| t.name == name) {
                Some(t) => {
                    let mut theirs = projection_names(t.family).to_vec();
                    theirs.dedup();
                    format!(
                        "a {name} checkpoint holds {} attention tensors, not {} ones ({} under \
                         the module)",
                        t.family.name(),
                        self.name(),
                        theirs.join(", ")
                    )
                }
                None => format!(
                    "{name}'s attention is not known to be what {} tensor names compute; the \
                     model types taken with these names: {}",
                    self.name(),
                    accepted()
                ),
            },
        };
        Err(Error::UnsupportedModule {
            module,
            what: format!("model_type {name:?}"),
            why,
        })
    }

    /// Model types that save this family's tensor names with other attention, for messages.
    fn look_alikes(self) -> &'static str {
        match self {
            Family::Bert => "RoFormer's rotary embeddings, BigBird's block-sparse attention",
            Family::Vit => "BEiT's relative position bias",
            Family::DistilBert => "XLM's and FlauBERT's causal mode",
            Family::Gpt2 => "GPT-BigCode's Linear c_attn with multi-query packing",
            Family::Phi
            | Family::Albert
            | Family::Mpt
            | Family::CodeGen
            | Family::ModernBert
            | Family::Mla => "none known",
            Family::Bart => {
                "GPT-J's interleaved rotary embeddings, GPT-Neo's unscaled local layers"
            }
            Family::T5 => "UMT5's per-layer relative bias, LongT5's local attention",
            Family::Llama => {
                "Cohere's interleaved RoPE, Granite's attention_multiplier, Gemma2's soft-capping"
            }
            Family::Phi3 => "other packings of qkv_proj",
            Family::GptNeox => {
                "BLOOM's ALiBi, Falcon's grouped packing, GPT-NeoX-Japanese's rotary"
            }
        }
    }

    /// Tensors under a module's prefix this family reads, or that do not enter the attention's
    /// answer (a LayerNorm after it, saved buffers): `(name after the prefix)`.
    fn understood(self, rest: &str) -> bool {
        let projections: &[&str] = match self {
            Family::Bert => &["self.query", "self.key", "self.value", "output.dense"],
            Family::Vit => &[
                "attention.query",
                "attention.key",
                "attention.value",
                "output.dense",
            ],
            Family::DistilBert => &["q_lin", "k_lin", "v_lin", "out_lin"],
            Family::Gpt2 => &["c_attn", "c_proj"],
            Family::Bart => &["q_proj", "k_proj", "v_proj", "out_proj"],
            Family::T5 => &["q", "k", "v", "o", "relative_attention_bias"],
            Family::Llama => &["q_proj", "k_proj", "v_proj", "o_proj"],
            Family::Phi3 => &["qkv_proj", "o_proj"],
            Family::GptNeox => &["query_key_value", "dense"],
            Family::Phi => &["q_proj", "k_proj", "v_proj", "dense"],
            // ALBERT keeps the LayerNorm after its output projection under the prefix.
            Family::Albert => &["query", "key", "value", "dense", "LayerNorm"],
            Family::Mpt => &["Wqkv", "out_proj"],
            Family::CodeGen => &["qkv_proj", "out_proj"],
            Family::ModernBert => &["Wqkv", "Wo"],
            Family::Mla => &[
                "q_proj",
                "q_a_proj",
                "q_a_layernorm",
                "q_b_proj",
                "kv_a_proj_with_mqa",
                "kv_a_layernorm",
                "kv_b_proj",
                "o_proj",
            ],
        };
        let harmless = [
            "output.LayerNorm.weight", // BERT: after the attention's output
            "output.LayerNorm.bias",
            "rotary_emb.inv_freq", // older checkpoints save RoPE's frequencies
            "bias",                // GPT-2 / GPT-NeoX causal-mask buffers
            "masked_bias",
        ];
        harmless.contains(&rest)
            || projections.iter().any(|p| {
                rest.strip_prefix(p)
                    .is_some_and(|r| r == ".weight" || r == ".bias")
            })
    }
}

/// Whether the module at `prefix` attends to another sequence (by the names families give
/// their cross-attention).
pub fn is_cross_attention(prefix: &str) -> bool {
    [
        "encoder_attn",
        "EncDecAttention",
        "crossattention",
        "cross_attn",
        "cross_attention",
    ]
    .iter()
    .any(|n| prefix.contains(n))
}

/// `Err` naming the first tensor under `prefix` that `family` (with the model type's `extra`
/// tensors, its q/k norms) does not understand: it may change the answer (q/k normalisation of
/// another model type, relative distance embeddings, …), so it is never ignored.
pub fn check_understood(
    family: Family,
    prefix: &str,
    names: &[&str],
    extra: &dyn Fn(&str) -> bool,
) -> Result<()> {
    let unknown = names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix))
        .find(|rest| !family.understood(rest) && !extra(rest));
    match unknown {
        None => Ok(()),
        Some(rest) => Err(Error::UnsupportedModule {
            module: format!("{} attention `{prefix}`", family.name()),
            what: format!("tensor `{prefix}{rest}`"),
            why: format!(
                "a {} attention module has no such tensor here; whatever it does would be \
                 ignored, and it may change the answer",
                family.name()
            ),
        }),
    }
}

/// Every attention module among `names`, as `(family, prefix)`, sorted by prefix.
pub fn find_modules(names: &[&str]) -> Vec<(Family, String)> {
    let set: std::collections::HashSet<&str> = names.iter().copied().collect();
    let mut found: Vec<(Family, String)> = names
        .iter()
        .filter_map(|name| {
            MARKERS.iter().find_map(|&(family, marker, companion)| {
                let prefix = name.strip_suffix(marker)?;
                // A marker starts a name or follows a dot (`q.weight` is not `…seq.weight`).
                if !(prefix.is_empty() || prefix.ends_with('.')) {
                    return None;
                }
                let beside =
                    companion.is_none_or(|c| set.contains(format!("{prefix}{c}").as_str()));
                beside.then(|| (family, prefix.to_string()))
            })
        })
        .collect();
    found.sort_by(|a, b| a.1.cmp(&b.1));
    found.dedup();
    // An MLA module without q LoRA also holds llama's `q_proj` + `o_proj` pair: it is MLA.
    let mla: std::collections::HashSet<String> = found
        .iter()
        .filter(|(f, _)| *f == Family::Mla)
        .map(|(_, p)| p.clone())
        .collect();
    found.retain(|(f, p)| *f == Family::Mla || !mla.contains(p));
    found
}

/// The stored names of a family's q, k, v and output projections (before `.weight`/`.bias`);
/// a packed projection is named for each of q, k and v.
pub fn projection_names(family: Family) -> [&'static str; 4] {
    match family {
        Family::Bert => ["self.query", "self.key", "self.value", "output.dense"],
        Family::Vit => [
            "attention.query",
            "attention.key",
            "attention.value",
            "output.dense",
        ],
        Family::DistilBert => ["q_lin", "k_lin", "v_lin", "out_lin"],
        Family::Bart => ["q_proj", "k_proj", "v_proj", "out_proj"],
        Family::T5 => ["q", "k", "v", "o"],
        Family::Llama => ["q_proj", "k_proj", "v_proj", "o_proj"],
        Family::Gpt2 => ["c_attn", "c_attn", "c_attn", "c_proj"],
        Family::Phi3 => ["qkv_proj", "qkv_proj", "qkv_proj", "o_proj"],
        Family::GptNeox => [
            "query_key_value",
            "query_key_value",
            "query_key_value",
            "dense",
        ],
        Family::Phi => ["q_proj", "k_proj", "v_proj", "dense"],
        Family::Albert => ["query", "key", "value", "dense"],
        Family::Mpt => ["Wqkv", "Wqkv", "Wqkv", "out_proj"],
        Family::CodeGen => ["qkv_proj", "qkv_proj", "qkv_proj", "out_proj"],
        Family::ModernBert => ["Wqkv", "Wqkv", "Wqkv", "Wo"],
        Family::Mla => ["q_proj", "kv_b_proj", "kv_b_proj", "o_proj"],
    }
}

/// Modules among `names` that have a family's marker tensor but lack its companion, as
/// `(prefix, what is missing)`: `model.layers.1.self_attn.` has `q_proj.weight` but neither
/// `o_proj.weight` nor `out_proj.weight`.
pub fn incomplete_modules(names: &[&str]) -> Vec<(String, String)> {
    let set: std::collections::HashSet<&str> = names.iter().copied().collect();
    let found: std::collections::HashSet<String> =
        find_modules(names).into_iter().map(|(_, p)| p).collect();
    let mut incomplete: Vec<(String, String)> = Vec::new();
    for name in names {
        for &(_, marker, companion) in &MARKERS {
            let Some(prefix) = name.strip_suffix(marker) else {
                continue;
            };
            if !(prefix.is_empty() || prefix.ends_with('.')) || found.contains(prefix) {
                continue;
            }
            let Some(companion) = companion else { continue };
            if !set.contains(format!("{prefix}{companion}").as_str()) {
                let missing = format!("has `{marker}` but no `{companion}`");
                match incomplete.iter_mut().find(|(p, _)| p == prefix) {
                    Some((_, what)) => what.push_str(&format!(", nor `{companion}`")),
                    None => incomplete.push((prefix.to_string(), missing)),
                }
            }
        }
    }
    incomplete.sort();
    incomplete
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_are_found_by_marker_and_companion() {
        let names = [
            "encoder.layer.0.attention.self.query.weight",
            "encoder.layer.0.attention.output.dense.weight",
            "h.1.attn.c_attn.weight",
            "h.1.attn.c_proj.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "decoder.layers.0.encoder_attn.q_proj.weight",
            "decoder.layers.0.encoder_attn.out_proj.weight",
            "encoder.block.0.layer.0.SelfAttention.q.weight",
            "encoder.block.0.layer.0.SelfAttention.o.weight",
            // No companion: not a module. A name merely ending in `q.weight` is not T5's.
            "x.q_proj.weight",
            "embed.seq.weight",
        ];
        let found = find_modules(&names);
        let got: Vec<(Family, &str)> = found.iter().map(|(f, p)| (*f, p.as_str())).collect();
        assert_eq!(
            got,
            [
                (Family::Bart, "decoder.layers.0.encoder_attn."),
                (Family::T5, "encoder.block.0.layer.0.SelfAttention."),
                (Family::Bert, "encoder.layer.0.attention."),
                (Family::Gpt2, "h.1.attn."),
                (Family::Llama, "model.layers.0.self_attn."),
            ]
        );
        assert!(is_cross_attention("decoder.layers.0.encoder_attn."));
        assert!(!is_cross_attention("decoder.layers.0.self_attn."));
        assert!(is_cross_attention("decoder.layers.0.cross_attention."));
    }
}
