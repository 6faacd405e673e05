//! The model types each family of tensor names runs as, and the look-alikes it refuses:
//! the allow-lists behind [`super::families::Family::model_type`].

use super::family::Family;
use crate::model::qk_norm::{NormKind, NormScope};

/// How a model type's self-attention masks the keys a query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Causality {
    /// An encoder: every query sees every key.
    Never,
    /// A decoder-only model: query i sees keys j ≤ i.
    Always,
    /// An encoder-decoder model: causal in the stack whose prefix holds `decoder`.
    InDecoderStack,
    /// BERT-like encoders: causal when config.json says `is_decoder: true` (BertLMHeadModel).
    IsDecoderKey,
    /// CLIP: the text tower (`text_model.`) is causal, the vision tower is not.
    TextTower,
}

/// A `model_type` known to compute, with its family's tensor names, exactly what the loader
/// computes (checked against transformers 5.24's modeling code).
#[derive(Debug)]
pub struct ModelType {
    /// The config's `model_type` (`"llama"`).
    pub name: &'static str,
    /// The layout of its attention tensors.
    pub family: Family,
    /// How its self-attention masks the keys a query sees.
    pub causal: Causality,
    /// Keys of the config's refused-settings table (`config::SETTINGS`) this model type reads,
    /// so they are honoured rather than refused.
    pub reads: &'static [&'static str],
    /// Scores are not scaled by 1/√d (GPT-Neo); T5's family is unscaled whatever its type.
    pub unscaled: bool,
}

impl ModelType {
    /// Whether its self-attention at `prefix` is causal (`is_decoder`: config.json's key).
    pub fn causal_self_attention(&self, prefix: &str, is_decoder: bool) -> bool {
        match self.causal {
            Causality::Never => false,
            Causality::Always => true,
            Causality::InDecoderStack => in_decoder_stack(prefix),
            Causality::IsDecoderKey => is_decoder,
            Causality::TextTower => prefix.split('.').any(|p| p == "text_model"),
        }
    }
}

/// A model type's q/k norm: kind and scope, Gemma's `1 + w` offset, and transformers' default
/// `rms_norm_eps`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QkNormRule {
    /// RMSNorm or LayerNorm.
    pub kind: NormKind,
    /// Per head or over the whole projection.
    pub scope: NormScope,
    /// Added to every weight: 1 where the norm multiplies by `1 + w` (Gemma 3), else 0.
    pub weight_offset: f32,
    /// The config key of its epsilon, and transformers' default.
    pub eps: (&'static str, f64),
    /// A config key that switches the norms on (default off); `None`: always on.
    pub switch: Option<&'static str>,
    /// How the weights are stored under the module.
    pub tensors: NormTensors,
    /// Normalised after RoPE rather than before it (Hunyuan).
    pub after_rope: bool,
    /// Each norm has a bias too (Persimmon's `nn.LayerNorm`).
    pub bias: bool,
    /// Only on the layers that rotate (Llama 4: none on its NoPE layers).
    pub rope_layers_only: bool,
}

/// Where a q/k norm's weights sit under the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormTensors {
    /// `q_norm.weight` and `k_norm.weight` (any shape; read flat).
    Single,
    /// StableLM's one LayerNorm per head: `q_layernorm.norms.{h}.weight`, `k_layernorm…`.
    PerHeadModules,
    /// Hunyuan's `query_layernorm.weight` and `key_layernorm.weight`.
    QueryKeyLayernorm,
    /// Persimmon's `q_layernorm.weight` / `.bias` and `k_layernorm.weight` / `.bias`.
    QkLayernorm,
    /// None: a norm without weights (Llama 4's L2Norm, an RMSNorm of weight 1).
    Weightless,
}

impl NormTensors {
    /// Whether `rest` (a name after the module's prefix) is one of these weights.
    pub fn holds(self, rest: &str) -> bool {
        match self {
            NormTensors::Single => rest == "q_norm.weight" || rest == "k_norm.weight",
            NormTensors::QueryKeyLayernorm => {
                rest == "query_layernorm.weight" || rest == "key_layernorm.weight"
            }
            NormTensors::QkLayernorm => [
                "q_layernorm.weight",
                "q_layernorm.bias",
                "k_layernorm.weight",
                "k_layernorm.bias",
            ]
            .contains(&rest),
            NormTensors::PerHeadModules => ["q_layernorm.norms.", "k_layernorm.norms."]
                .iter()
                .filter_map(|p| rest.strip_prefix(p))
                .filter_map(|r| r.strip_suffix(".weight"))
                .any(|h| h.parse::<usize>().is_ok()),
            NormTensors::Weightless => false,
        }
    }
}

/// A config key's value when absent, as transformers' config class sets it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ConfigDefault {
    /// A number (written as a JSON integer when it is a whole, non-negative one).
    Number(f64),
    /// A boolean.
    Flag(bool),
}

/// Which projections transformers builds with a bias, for the model types whose modeling code
/// decides it (the others build whatever their family's tensors hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Biases {
    /// As stored: every projection biased (bert, bart, …; whisper's missing `k_proj.bias` is
    /// zero-filled, which is what an absent bias computes).
    AsStored,
    /// All four, or none, by a config key with transformers' default.
    ByKey(&'static str, bool),
    /// None (mistral, mixtral, phi3).
    Never,
    /// All four, whatever the config says (bloom).
    Always,
    /// q, k and v, not the output (qwen2).
    QkvOnly,
    /// q, k and v by a config key with its default, never the output (stablelm, helium).
    QkvByKey(&'static str, bool),
    /// q, k and v by one config key, the output by another, each with its default (seed_oss:
    /// `attention_bias`, default true; `attention_out_bias`, default false).
    QkvAndOutByKeys((&'static str, bool), (&'static str, bool)),
}

/// Which layers of a model type rotate q and k (the others run without positions: NoPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayers {
    /// Every layer.
    All,
    /// Only the sliding-window layers, when the config sets `sliding_window`; without it,
    /// every layer (`true`: EXAONE 4) or none (`false`: Cohere 2, whose attention rotates
    /// only where its layer has a window).
    SlidingOnly {
        /// Whether every layer rotates when the config sets no `sliding_window`.
        without_window: bool,
    },
    /// By `no_rope_layers` (1 = RoPE, 0 = none), else all but every
    /// `no_rope_layer_interval`-th layer (default 4) rotate (SmolLM3).
    NoRopeLayers,
    /// None: no position information in the attention (Jamba; its Mamba layers order).
    Never,
}

impl ModelType {
    /// Which projections transformers 5.25 builds with a bias for this model type.
    pub fn biases(&self) -> Biases {
        match self.name {
            "llama" | "gemma" | "gemma2" | "gemma3" | "gemma3_text" | "granite" | "qwen3"
            | "olmo" | "olmo2" | "cohere" | "qwen3_moe" | "olmoe" | "granitemoe" | "arcee"
            | "hunyuan_v1_dense" | "olmo3" | "cohere2" | "smollm3" | "llama4_text"
            | "qwen3_next" | "bitnet" => Biases::ByKey("attention_bias", false),
            "ernie4_5" => Biases::ByKey("use_bias", false),
            "modernbert" => Biases::ByKey("attention_bias", false),
            "qwen2_moe" => Biases::QkvByKey("qkv_bias", true),
            "helium" => Biases::QkvByKey("attention_bias", false),
            "glm" | "glm4" => Biases::QkvByKey("attention_bias", true),
            "nemotron" => Biases::ByKey("attention_bias", false),
            "seed_oss" => {
                Biases::QkvAndOutByKeys(("attention_bias", true), ("attention_out_bias", false))
            }
            "gpt_neox" | "gpt_oss" => Biases::ByKey("attention_bias", true),
            "bloom" | "phi" | "albert" | "gpt_bigcode" | "persimmon" => Biases::Always,
            "starcoder2" => Biases::ByKey("use_bias", true),
            "falcon" => Biases::ByKey("bias", false),
            "mistral" | "mixtral" | "phi3" | "gptj" | "mpt" | "codegen" | "ministral"
            | "exaone4" | "musicgen_decoder" | "dbrx" | "jamba" => Biases::Never,
            "qwen2" => Biases::QkvOnly,
            "stablelm" => Biases::QkvByKey("use_qkv_bias", false),
            _ => Biases::AsStored,
        }
    }

    /// How transformers normalises this model type's projected q and k before RoPE, if it
    /// does: `q_norm.weight` / `k_norm.weight` under the module, epsilon `rms_norm_eps`.
    pub fn qk_norm(&self) -> Option<QkNormRule> {
        let rule = |kind, scope, eps| QkNormRule {
            kind,
            scope,
            weight_offset: 0.0,
            eps,
            switch: None,
            tensors: NormTensors::Single,
            after_rope: false,
            bias: false,
            rope_layers_only: false,
        };
        let (rms, layer) = (NormKind::Rms, NormKind::Layer);
        Some(match self.name {
            // Qwen3RMSNorm(head_dim): one weight shared by the heads.
            // Qwen3RMSNorm(head_dim): one weight shared by the heads (qwen3_moe's and
            // exaone4's the same, with their config classes' default eps).
            "qwen3" | "qwen3_moe" => rule(rms, NormScope::PerHead, ("rms_norm_eps", 1e-6)),
            "exaone4" => rule(rms, NormScope::PerHead, ("rms_norm_eps", 1e-5)),
            // HunYuanDenseV1RMSNorm(head_dim) after RoPE: `query_layernorm`, `key_layernorm`.
            "hunyuan_v1_dense" => QkNormRule {
                tensors: NormTensors::QueryKeyLayernorm,
                after_rope: true,
                ..rule(rms, NormScope::PerHead, ("rms_norm_eps", 1e-5))
            },
            // Llama4TextL2Norm: a weightless RMSNorm of each head after RoPE, with use_qk_norm
            // (default on), on the RoPE layers only.
            "llama4_text" => QkNormRule {
                switch: Some("use_qk_norm"),
                tensors: NormTensors::Weightless,
                after_rope: true,
                rope_layers_only: true,
                ..rule(rms, NormScope::PerHead, ("rms_norm_eps", 1e-5))
            },
            // Gemma3RMSNorm(head_dim): x · (1 + w), computed in f32 (Qwen3NextRMSNorm too).
            "gemma3" | "gemma3_text" | "qwen3_next" => QkNormRule {
                weight_offset: 1.0,
                ..rule(rms, NormScope::PerHead, ("rms_norm_eps", 1e-6))
            },
            // Olmo2RMSNorm(heads · head_dim): over the whole projection.
            // (olmoe's q_norm is RMSNorm(hidden_size), its k_norm RMSNorm(hidden / heads ·
            // kv_heads): the same while head_dim = hidden / heads, which `check` verifies.)
            "olmo2" | "olmoe" | "olmo3" => rule(rms, NormScope::Whole, ("rms_norm_eps", 1e-5)),
            // CohereLayerNorm((heads, head_dim)) without bias, when use_qk_norm.
            "cohere" => QkNormRule {
                switch: Some("use_qk_norm"),
                ..rule(layer, NormScope::PerHead, ("layer_norm_eps", 1e-5))
            },
            // StableLmLayerNormPerHead: a bias-free nn.LayerNorm(head_dim) per head.
            "stablelm" => QkNormRule {
                switch: Some("qk_layernorm"),
                tensors: NormTensors::PerHeadModules,
                ..rule(layer, NormScope::PerHead, ("layer_norm_eps", 1e-5))
            },
            // PersimmonAttention: nn.LayerNorm(head_dim) with bias, one shared by the heads,
            // when qk_layernorm (default true).
            "persimmon" => QkNormRule {
                switch: Some("qk_layernorm"),
                tensors: NormTensors::QkLayernorm,
                bias: true,
                ..rule(layer, NormScope::PerHead, ("layer_norm_eps", 1e-5))
            },
            _ => return None,
        })
    }

    /// transformers' defaults for the keys this model type reads, where they are not what an
    /// absent key means to the loader (checked against each config class of transformers 5.25).
    pub fn defaults(&self) -> &'static [(&'static str, ConfigDefault)] {
        use ConfigDefault::{Flag, Number};
        match self.name {
            "mistral" => &[("sliding_window", Number(4096.0))],
            "mixtral" => &[("rope_theta", Number(1e6))],
            "qwen2" | "qwen3" => &[("max_window_layers", Number(28.0))],
            "qwen2_moe" => &[
                ("max_window_layers", Number(28.0)),
                ("sliding_window", Number(4096.0)),
            ],
            "qwen3_moe" | "ministral" => &[("sliding_window", Number(4096.0))],
            "granitemoe" => &[("attention_multiplier", Number(1.0))],
            "helium" => &[("rope_theta", Number(1e5))],
            "ernie4_5" => &[("rope_theta", Number(5e5))],
            "exaone4" => &[
                ("sliding_window", Number(4096.0)),
                ("sliding_window_pattern", Number(4.0)),
            ],
            "olmo3" => &[
                ("sliding_window", Number(4096.0)),
                ("rope_theta", Number(5e5)),
            ],
            "cohere2" => &[("sliding_window", Number(4096.0))],
            "smollm3" => &[("rope_theta", Number(2e6))],
            "persimmon" => &[("qk_layernorm", Flag(true))],
            "modernbert" => &[
                ("local_attention", Number(128.0)),
                ("global_attn_every_n_layers", Number(3.0)),
                ("global_rope_theta", Number(160_000.0)),
                ("local_rope_theta", Number(10_000.0)),
            ],
            "bitnet" => &[("rope_theta", Number(5e5))],
            "llama4_text" => &[
                ("rope_theta", Number(5e5)),
                ("use_qk_norm", Flag(true)),
                ("attention_chunk_size", Number(8192.0)),
                ("attn_temperature_tuning", Flag(true)),
                ("floor_scale", Number(8192.0)),
                ("attn_scale", Number(0.1)),
            ],
            "gemma2" => &[
                ("sliding_window", Number(4096.0)),
                ("query_pre_attn_scalar", Number(256.0)),
                ("attn_logit_softcapping", Number(50.0)),
            ],
            "gemma3" | "gemma3_text" => &[
                ("sliding_window", Number(4096.0)),
                ("query_pre_attn_scalar", Number(256.0)),
            ],
            "granite" => &[("attention_multiplier", Number(1.0))],
            "gpt_oss" => &[("sliding_window", Number(128.0))],
            "gpt_bigcode" | "falcon" => &[("multi_query", Flag(true))],
            "cohere" => &[("rope_theta", Number(5e5))],
            // Phi3Config always has it, so it overrides the RoPE object's (longrope).
            "phi3" => &[("original_max_position_embeddings", Number(4096.0))],
            _ => &[],
        }
    }

    /// ALiBi's `max_bias` where the model type adds ALiBi instead of rotating q and k (BLOOM:
    /// `build_alibi_tensor`'s slopes, 2^(−8·h/n); MPT: `build_mpt_alibi_tensor`'s, the same
    /// slopes for every head count, in the same head order, and a bias relative to the last
    /// key, a constant per row that softmax ignores).
    pub fn alibi(&self) -> Option<f32> {
        matches!(self.name, "bloom" | "mpt").then_some(8.0)
    }

    /// The LayerNorm a model type's attention module applies to its input before the
    /// projections, stored under the module's prefix (megatron-bert's `ln`). As with llama's
    /// `input_layernorm`, the module computed starts after it: callers give the norm's output.
    pub fn input_norm(&self) -> Option<&'static str> {
        match self.name {
            "megatron-bert" => Some("ln"),
            "esm" => Some("LayerNorm"),
            _ => None,
        }
    }

    /// Whether each self-attention holds its own relative bias table (UMT5) rather than reusing
    /// its stack's block 0 table (T5).
    pub fn relative_bias_per_layer(&self) -> bool {
        self.name == "umt5"
    }

    /// Whether the module adds BEiT's relative position bias over a patch grid.
    pub fn grid_bias(&self) -> bool {
        matches!(self.name, "beit" | "data2vec-vision")
    }

    /// Whether the module adds WavLM's gated relative position bias (`wavlm.rs`).
    pub fn gated_bias(&self) -> bool {
        self.name == "wavlm"
    }

    /// Whether its encoder's self-attention is LongT5's local attention.
    pub fn local_encoder(&self) -> bool {
        self.name == "longt5"
    }

    /// Whether the attention output is RMS-normalised before `o_proj` (BitNet's
    /// `attn_sub_norm`).
    pub fn sub_norm(&self) -> bool {
        self.name == "bitnet"
    }

    /// Whether the module holds attention sinks (`sinks`, one logit per query head).
    pub fn sinks(&self) -> bool {
        self.name == "gpt_oss"
    }

    /// Whether the layers' RoPE depends on their kind (`rope_parameters` per layer type).
    pub fn rope_per_layer_kind(&self) -> bool {
        matches!(self.name, "gemma3" | "gemma3_text" | "olmo3" | "modernbert")
    }

    /// Which layers rotate q and k (EXAONE 4 and Cohere 2: the sliding ones; their full
    /// layers run without positions).
    pub fn rope_layers(&self) -> RopeLayers {
        match self.name {
            "exaone4" => RopeLayers::SlidingOnly {
                without_window: true,
            },
            "cohere2" => RopeLayers::SlidingOnly {
                without_window: false,
            },
            "smollm3" | "llama4_text" => RopeLayers::NoRopeLayers,
            "jamba" => RopeLayers::Never,
            _ => RopeLayers::All,
        }
    }

    /// Keys of the refused-settings table that transformers' config class and modeling code
    /// of this model type never read (a checkpoint saved by another version may carry them):
    /// accepted and ignored, as transformers ignores them.
    pub fn ignores(&self) -> &'static [&'static str] {
        match self.name {
            // Qwen3MoeConfig has neither; every layer slides when use_sliding_window is set.
            "qwen3_moe" => &["max_window_layers", "layer_types"],
            // Cohere 2 configs of transformers 4.x carry "rope_gptj": its interleaved RoPE,
            // which the model type applies whatever the key says.
            "cohere2" => &["position_embedding_type"],
            _ => &[],
        }
    }

    /// Whether RoPE rotates interleaved pairs (2k, 2k + 1) rather than halves (Cohere,
    /// GPT-J, CodeGen, RoFormer).
    pub fn interleaved_rope(&self) -> bool {
        matches!(
            self.name,
            "cohere"
                | "gptj"
                | "codegen"
                | "roformer"
                | "helium"
                | "ernie4_5"
                | "cohere2"
                | "glm"
                | "glm4"
                | "llama4_text"
        )
    }

    /// Whether the model type rotates q and k under a family whose names do not (GPT-J under
    /// bart's, RoFormer under bert's: its self-attention only; ESM's when its
    /// position_embedding_type is "rotary", see `rotary_by_position_type`).
    pub fn rotates(&self) -> bool {
        matches!(self.name, "gptj" | "roformer" | "esm" | "dbrx")
    }

    /// Whether `position_embedding_type` decides if the model type rotates (ESM).
    pub fn rotary_by_position_type(&self) -> bool {
        self.name == "esm"
    }

    /// The config key that gives the rotating dimensions of each head (GPT-J's and CodeGen's
    /// `rotary_dim`; absent or null: all of them).
    pub fn rotary_dim_key(&self) -> Option<&'static str> {
        matches!(self.name, "gptj" | "codegen").then_some("rotary_dim")
    }

    /// The share of each head RoPE rotates when the config names none: transformers'
    /// GPTNeoXConfig defaults `rotary_pct` (5: `partial_rotary_factor`) to 0.25; GLM's,
    /// GLM-4's, Nemotron's, Persimmon's and Phi's config classes to 0.5; the others rotate all of it.
    pub fn default_rotary_share(&self) -> f64 {
        match self.name {
            "gpt_neox" | "stablelm" | "qwen3_next" => 0.25,
            "phi" | "glm" | "glm4" | "nemotron" | "persimmon" => 0.5,
            _ => 1.0,
        }
    }
}

/// Whether `prefix` lies in an encoder-decoder model's decoder stack: one of its dot-separated
/// parts is `decoder` (`model.decoder.layers.0.`, T5's `decoder.block.0.`), the module tree
/// transformers builds — not any name that merely contains the word.
pub fn in_decoder_stack(prefix: &str) -> bool {
    prefix.split('.').any(|part| part == "decoder")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoder_stack_is_a_part_of_the_prefix_not_a_substring() {
        assert!(in_decoder_stack("model.decoder.layers.0.self_attn."));
        assert!(in_decoder_stack("decoder.block.0.layer.0.SelfAttention."));
        assert!(!in_decoder_stack("encoder.block.0.layer.0.SelfAttention."));
        // A BERT used as a decoder is told by is_decoder, never by its module names.
        assert!(!in_decoder_stack("bert_decoder.encoder.layer.0.attention."));
        assert!(!in_decoder_stack("model.text_decoder_proj.layers.0."));
    }
}
