//! The model types each family of tensor names runs as, and the look-alikes it refuses:
//! the allow-lists behind [`super::families::Family::model_type`].

use super::families::Family;
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
    pub name: &'static str,
    pub family: Family,
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
    pub kind: NormKind,
    pub scope: NormScope,
    pub weight_offset: f32,
    /// The config key of its epsilon, and transformers' default.
    pub eps: (&'static str, f64),
    /// A config key that switches the norms on (default off); `None`: always on.
    pub switch: Option<&'static str>,
    /// How the weights are stored under the module.
    pub tensors: NormTensors,
    /// Normalised after RoPE rather than before it (Hunyuan).
    pub after_rope: bool,
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
}

impl NormTensors {
    /// Whether `rest` (a name after the module's prefix) is one of these weights.
    pub fn holds(self, rest: &str) -> bool {
        match self {
            NormTensors::Single => rest == "q_norm.weight" || rest == "k_norm.weight",
            NormTensors::QueryKeyLayernorm => {
                rest == "query_layernorm.weight" || rest == "key_layernorm.weight"
            }
            NormTensors::PerHeadModules => ["q_layernorm.norms.", "k_layernorm.norms."]
                .iter()
                .filter_map(|p| rest.strip_prefix(p))
                .filter_map(|r| r.strip_suffix(".weight"))
                .any(|h| h.parse::<usize>().is_ok()),
        }
    }
}

/// A config key's value when absent, as transformers' config class sets it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ConfigDefault {
    Number(f64),
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
    SlidingOnly { without_window: bool },
    /// By `no_rope_layers` (1 = RoPE, 0 = none), else all but every
    /// `no_rope_layer_interval`-th layer (default 4) rotate (SmolLM3).
    NoRopeLayers,
}

impl ModelType {
    /// Which projections transformers 5.25 builds with a bias for this model type.
    pub fn biases(&self) -> Biases {
        match self.name {
            "llama" | "gemma" | "gemma2" | "gemma3" | "gemma3_text" | "granite" | "qwen3"
            | "olmo" | "olmo2" | "cohere" | "qwen3_moe" | "olmoe" | "granitemoe" | "arcee"
            | "hunyuan_v1_dense" | "olmo3" | "cohere2" | "smollm3" => {
                Biases::ByKey("attention_bias", false)
            }
            "ernie4_5" => Biases::ByKey("use_bias", false),
            "qwen2_moe" => Biases::QkvByKey("qkv_bias", true),
            "helium" => Biases::QkvByKey("attention_bias", false),
            "seed_oss" => {
                Biases::QkvAndOutByKeys(("attention_bias", true), ("attention_out_bias", false))
            }
            "gpt_neox" | "gpt_oss" => Biases::ByKey("attention_bias", true),
            "bloom" | "phi" | "albert" | "gpt_bigcode" => Biases::Always,
            "starcoder2" => Biases::ByKey("use_bias", true),
            "falcon" => Biases::ByKey("bias", false),
            "mistral" | "mixtral" | "phi3" | "gptj" | "mpt" | "codegen" | "ministral"
            | "exaone4" => Biases::Never,
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
            // Gemma3RMSNorm(head_dim): x · (1 + w), computed in f32.
            "gemma3" | "gemma3_text" => QkNormRule {
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

    /// Whether the module holds attention sinks (`sinks`, one logit per query head).
    pub fn sinks(&self) -> bool {
        self.name == "gpt_oss"
    }

    /// Whether the layers' RoPE depends on their kind (`rope_parameters` per layer type).
    pub fn rope_per_layer_kind(&self) -> bool {
        matches!(self.name, "gemma3" | "gemma3_text" | "olmo3")
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
            "smollm3" => RopeLayers::NoRopeLayers,
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
            "cohere" | "gptj" | "codegen" | "roformer" | "helium" | "ernie4_5" | "cohere2"
        )
    }

    /// Whether the model type rotates q and k under a family whose names do not (GPT-J under
    /// bart's, RoFormer under bert's: its self-attention only).
    pub fn rotates(&self) -> bool {
        matches!(self.name, "gptj" | "roformer")
    }

    /// The config key that gives the rotating dimensions of each head (GPT-J's and CodeGen's
    /// `rotary_dim`; absent or null: all of them).
    pub fn rotary_dim_key(&self) -> Option<&'static str> {
        matches!(self.name, "gptj" | "codegen").then_some("rotary_dim")
    }

    /// The share of each head RoPE rotates when the config names none: transformers'
    /// GPTNeoXConfig defaults `rotary_pct` (5: `partial_rotary_factor`) to 0.25; the others
    /// rotate all of it.
    pub fn default_rotary_share(&self) -> f64 {
        match self.name {
            "gpt_neox" | "stablelm" => 0.25,
            "phi" => 0.5,
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

const fn mt(name: &'static str, family: Family, causal: Causality) -> ModelType {
    ModelType {
        name,
        family,
        causal,
        reads: &[],
        unscaled: false,
    }
}

const fn reading(
    name: &'static str,
    family: Family,
    causal: Causality,
    reads: &'static [&'static str],
) -> ModelType {
    ModelType {
        name,
        family,
        causal,
        reads,
        unscaled: false,
    }
}

/// Where gpt2 sits in [`MODEL_TYPES`] (the one layout taken without a `model_type`).
pub(super) const GPT2: usize = 0;

const WINDOW: &[&str] = &["sliding_window"];

const GEMMA3: &[&str] = &[
    "attn_logit_softcapping",
    "query_pre_attn_scalar",
    "sliding_window",
    "layer_types",
    "sliding_window_pattern",
];

/// Every model type the loader runs, by family. Each one's attention in transformers 5.24 is
/// the family's: these projections, softmax(q·kᵀ·scale + mask)·v with scale 1/√d (none for
/// t5), the causality given, and (RoPE families) half-split RoPE from the config.
pub const MODEL_TYPES: &[ModelType] = &[
    reading(
        "gpt2",
        Family::Gpt2,
        Causality::Always,
        &["scale_attn_weights", "scale_attn_by_inverse_layer_idx"],
    ),
    // BertSelfAttention and its copies; absolute position embeddings only.
    mt("bert", Family::Bert, Causality::IsDecoderKey),
    mt("roberta", Family::Bert, Causality::IsDecoderKey),
    mt("xlm-roberta", Family::Bert, Causality::IsDecoderKey),
    mt("camembert", Family::Bert, Causality::IsDecoderKey),
    mt("electra", Family::Bert, Causality::IsDecoderKey),
    mt("ernie", Family::Bert, Causality::IsDecoderKey),
    mt("bert-generation", Family::Bert, Causality::IsDecoderKey),
    // RoFormerSelfAttention: bert's, with interleaved sinusoidal RoPE (θ 10000, every
    // dimension) on q and k of its self-attention; `rotary_value` (v too) is refused.
    mt("roformer", Family::Bert, Causality::IsDecoderKey),
    // ViTSelfAttention and its copies.
    mt("vit", Family::Vit, Causality::Never),
    mt("deit", Family::Vit, Causality::Never),
    mt("vit_mae", Family::Vit, Causality::Never),
    mt("vit_msn", Family::Vit, Causality::Never),
    mt("dinov2", Family::Vit, Causality::Never),
    mt("yolos", Family::Vit, Causality::Never),
    mt("distilbert", Family::DistilBert, Causality::Never),
    // BartAttention and its copies (whisper's k_proj has no bias: zero-filled).
    mt("bart", Family::Bart, Causality::InDecoderStack),
    mt("mbart", Family::Bart, Causality::InDecoderStack),
    mt("marian", Family::Bart, Causality::InDecoderStack),
    mt("pegasus", Family::Bart, Causality::InDecoderStack),
    mt("blenderbot", Family::Bart, Causality::InDecoderStack),
    mt("blenderbot-small", Family::Bart, Causality::InDecoderStack),
    mt("plbart", Family::Bart, Causality::InDecoderStack),
    mt("m2m_100", Family::Bart, Causality::InDecoderStack),
    mt("whisper", Family::Bart, Causality::InDecoderStack),
    mt("speech_to_text", Family::Bart, Causality::InDecoderStack),
    mt("opt", Family::Bart, Causality::Always),
    mt("biogpt", Family::Bart, Causality::Always),
    mt("xglm", Family::Bart, Causality::Always),
    mt("wav2vec2", Family::Bart, Causality::Never),
    mt("hubert", Family::Bart, Causality::Never),
    // GPTNeoSelfAttention: bart's names under `attn.attention.`, no q/k/v biases, causal, no
    // 1/√d scale, and layers `local` in `attention_layers` see the last `window_size` keys.
    ModelType {
        name: "gpt_neo",
        family: Family::Bart,
        causal: Causality::Always,
        reads: &["attention_types", "attention_layers"],
        unscaled: true,
    },
    // CLIP/SigLIP: bart-like projections with biases, scale 1/√d. CLIP's text tower is causal;
    // SigLIP's is not (transformers: "SigLIP's text model does not use a causal mask").
    mt("clip", Family::Bart, Causality::TextTower),
    mt("clip_text_model", Family::Bart, Causality::Always),
    mt("clip_vision_model", Family::Bart, Causality::Never),
    mt("siglip", Family::Bart, Causality::Never),
    mt("siglip_text_model", Family::Bart, Causality::Never),
    mt("siglip_vision_model", Family::Bart, Causality::Never),
    // GPTJAttention: bart's names without biases, causal, interleaved RoPE (θ 10000) on the
    // first `rotary_dim` dimensions of each head.
    reading("gptj", Family::Bart, Causality::Always, &["rotary_dim"]),
    mt("t5", Family::T5, Causality::InDecoderStack),
    mt("mt5", Family::T5, Causality::InDecoderStack),
    mt("llama", Family::Llama, Causality::Always),
    reading("mistral", Family::Llama, Causality::Always, WINDOW),
    reading("mixtral", Family::Llama, Causality::Always, WINDOW),
    reading(
        "qwen2",
        Family::Llama,
        Causality::Always,
        &[
            "sliding_window",
            "use_sliding_window",
            "max_window_layers",
            "layer_types",
        ],
    ),
    mt("gemma", Family::Llama, Causality::Always),
    // Gemma2Attention: llama's scaled by 1/√query_pre_attn_scalar, scores soft-capped by
    // attn_logit_softcapping, and the layers `layer_types` calls sliding windowed.
    reading(
        "gemma2",
        Family::Llama,
        Causality::Always,
        &[
            "attn_logit_softcapping",
            "query_pre_attn_scalar",
            "sliding_window",
            "layer_types",
        ],
    ),
    // Gemma3Attention: gemma2's (1/√query_pre_attn_scalar, soft-capping when set, windows by
    // layer_types or every sliding_window_pattern-th layer full) with per-head q/k RMSNorm
    // (1 + w) and a RoPE per layer kind. `gemma3` is the multimodal parent's type, taken by a
    // text tower whose sub-config names none.
    reading("gemma3_text", Family::Llama, Causality::Always, GEMMA3),
    reading("gemma3", Family::Llama, Causality::Always, GEMMA3),
    // GptOssAttention: llama's with biases (attention_bias, default true), a learned sink
    // logit per head in every softmax's denominator, windows by layer_types (without them,
    // the even layers) and yarn RoPE.
    reading(
        "gpt_oss",
        Family::Llama,
        Causality::Always,
        &["sliding_window", "layer_types"],
    ),
    // GraniteAttention: llama's, with the score scale `attention_multiplier` instead of 1/√d.
    reading(
        "granite",
        Family::Llama,
        Causality::Always,
        &["attention_multiplier"],
    ),
    // Starcoder2Attention: llama's with biases (`use_bias`) and mistral's sliding window.
    reading("starcoder2", Family::Llama, Causality::Always, WINDOW),
    // Qwen3Attention: llama's with per-head RMSNorm of q and k before RoPE (`q_norm`,
    // `k_norm`: [head_dim]) and qwen2's sliding-window rules.
    reading(
        "qwen3",
        Family::Llama,
        Causality::Always,
        &[
            "sliding_window",
            "use_sliding_window",
            "max_window_layers",
            "layer_types",
        ],
    ),
    // OlmoAttention: llama's, the projections clamped to ±clip_qkv when it is set.
    reading("olmo", Family::Llama, Causality::Always, &["clip_qkv"]),
    // Olmo2Attention: llama's with RMSNorm over the whole q and k projections before RoPE.
    mt("olmo2", Family::Llama, Causality::Always),
    // Qwen2MoeAttention: qwen2's (q/k/v biases by qkv_bias, default true), its layers
    // sliding by layer_types, else the even layers below max_window_layers when
    // use_sliding_window (the MoE block is outside the module).
    reading(
        "qwen2_moe",
        Family::Llama,
        Causality::Always,
        &[
            "sliding_window",
            "use_sliding_window",
            "max_window_layers",
            "layer_types",
        ],
    ),
    // Qwen3MoeAttention: qwen3's per-head q/k RMSNorm; with use_sliding_window every layer
    // slides (its config has no layer_types nor max_window_layers: see `ignores`).
    reading(
        "qwen3_moe",
        Family::Llama,
        Causality::Always,
        &["sliding_window", "use_sliding_window"],
    ),
    // OlmoeAttention: RMSNorm over the whole q and k projections, then clip_qkv (refused: the
    // loader clamps before the norms), then RoPE.
    mt("olmoe", Family::Llama, Causality::Always),
    // GraniteMoeAttention: granite's (the score scale attention_multiplier).
    reading(
        "granitemoe",
        Family::Llama,
        Causality::Always,
        &["attention_multiplier"],
    ),
    // HeliumAttention: llama's with interleaved RoPE (θ default 10^5), q/k/v biases by
    // attention_bias and none on o_proj.
    mt("helium", Family::Llama, Causality::Always),
    // ArceeAttention: llama's.
    mt("arcee", Family::Llama, Causality::Always),
    // MinistralAttention: mistral's (no biases) with windows by layer_types.
    reading(
        "ministral",
        Family::Llama,
        Causality::Always,
        &["sliding_window", "layer_types"],
    ),
    // SeedOssAttention: llama's, q/k/v biases by attention_bias (default true), o_proj's by
    // attention_out_bias (default false).
    mt("seed_oss", Family::Llama, Causality::Always),
    // Ernie4_5Attention: llama's with interleaved RoPE (θ default 5·10^5) and biases by
    // use_bias.
    mt("ernie4_5", Family::Llama, Causality::Always),
    // Exaone4Attention: per-head q/k RMSNorm before RoPE; sliding layers by layer_types, else
    // all but every sliding_window_pattern-th (default 4); with a sliding_window, the full
    // layers have no RoPE.
    reading(
        "exaone4",
        Family::Llama,
        Causality::Always,
        &["sliding_window", "sliding_window_pattern", "layer_types"],
    ),
    // HunYuanDenseV1Attention: llama's with per-head q/k RMSNorm after RoPE; its "dynamic"
    // RoPE with `alpha` is a fixed θ·alpha^(d/(d−2)).
    mt("hunyuan_v1_dense", Family::Llama, Causality::Always),
    // Olmo3Attention: olmo2's whole-projection q/k RMSNorm, windows by layer_types (else
    // every fourth layer full) and a RoPE per layer kind (θ default 5·10^5).
    reading(
        "olmo3",
        Family::Llama,
        Causality::Always,
        &["sliding_window", "layer_types"],
    ),
    // Cohere2Attention: cohere's interleaved RoPE on the sliding layers only (none on the
    // full ones), windows by layer_types, else every sliding_window_pattern-th layer full
    // (default 4); no q/k norm.
    reading(
        "cohere2",
        Family::Llama,
        Causality::Always,
        &["sliding_window", "layer_types", "sliding_window_pattern"],
    ),
    // SmolLM3Attention: llama's without RoPE on the layers `no_rope_layers` marks 0 (else
    // every no_rope_layer_interval-th), windows by layer_types (else, with use_sliding_window,
    // the NoPE layers), θ default 2·10^6.
    reading(
        "smollm3",
        Family::Llama,
        Causality::Always,
        &[
            "sliding_window",
            "use_sliding_window",
            "layer_types",
            "no_rope_layers",
            "no_rope_layer_interval",
        ],
    ),
    // CohereAttention: llama's with interleaved RoPE and, with use_qk_norm, a bias-free
    // LayerNorm of each head of q and k ([heads, head_dim] weights).
    reading("cohere", Family::Llama, Causality::Always, &["use_qk_norm"]),
    // StableLmAttention: llama's names, q/k/v biases by use_qkv_bias, partial RoPE (default
    // 0.25) and, with qk_layernorm, a bias-free LayerNorm per head.
    reading(
        "stablelm",
        Family::Llama,
        Causality::Always,
        &["qk_layernorm", "partial_rotary_factor"],
    ),
    reading(
        "phi3",
        Family::Phi3,
        Causality::Always,
        &["sliding_window", "partial_rotary_factor"],
    ),
    // PhiAttention: biased q/k/v projections and `dense`, partial RoPE (default 0.5); its
    // optional q/k LayerNorm (with biases) is refused by name (qk_layernorm).
    reading(
        "phi",
        Family::Phi,
        Causality::Always,
        &["partial_rotary_factor"],
    ),
    // CodeGenAttention: `qkv_proj` packed in 4 blocks (mp_num) of [q, v, k] slices of E/4
    // rows each, `out_proj`, no biases, causal, scale 1/√d, GPT-J's interleaved RoPE (θ 10000)
    // on the first `rotary_dim` dimensions of each head.
    reading(
        "codegen",
        Family::CodeGen,
        Causality::Always,
        &["rotary_dim"],
    ),
    // AlbertAttention: bert-like, an encoder.
    mt("albert", Family::Albert, Causality::Never),
    // GPTBigCodeAttention: a Linear c_attn, multi-query (`[E + 2d, E]`, the default) or per
    // head packed (`[3E, E]`), causal, scale_attn_weights as GPT-2's.
    reading(
        "gpt_bigcode",
        Family::Gpt2,
        Causality::Always,
        &["scale_attn_weights"],
    ),
    // BloomAttention: gpt_neox's per-head packing in `query_key_value` with biases, no RoPE,
    // ALiBi (its slopes are AttentionConfig::with_alibi's); causal.
    mt("bloom", Family::GptNeox, Causality::Always),
    // FalconAttention: `query_key_value` packed per key/value group (new_decoder_architecture:
    // num_kv_heads; multi_query, the default: one; else one per head), biases by `bias`,
    // rotary (half-split, θ from the config) and 1/√d, causal; `alibi` is refused (its own
    // rules, see config::falcon_mpt).
    reading(
        "falcon",
        Family::GptNeox,
        Causality::Always,
        &["new_decoder_architecture"],
    ),
    // MptAttention: `Wqkv` (q, k, v rows), no biases, ALiBi (max 8) always, q/k/v clamped by
    // `attn_config.clip_qkv`, scale `attn_config.softmax_scale` (default 1/√d), causal.
    reading(
        "mpt",
        Family::Mpt,
        Causality::Always,
        &["clip_qkv", "softmax_scale"],
    ),
    // DeepseekV2Attention / DeepseekV3Attention: multi-head latent attention (q LoRA or q_proj,
    // the compressed latent and a shared RoPE key, kv_b_proj per head), causal; its sizes,
    // attention_bias, rope_interleave and yarn's mscale_all_dim are read by `HfCheckpoint::
    // mla_attention`.
    mt("deepseek_v2", Family::Mla, Causality::Always),
    mt("deepseek_v3", Family::Mla, Causality::Always),
    reading(
        "gpt_neox",
        Family::GptNeox,
        Causality::Always,
        &["partial_rotary_factor", "rotary_pct"],
    ),
];

/// Model types that save one of the recognised layouts with attention the loader does not
/// compute, and what each would need.
pub(super) const REFUSED_TYPES: &[(&str, &str)] = &[
    (
        "persimmon",
        "q/k LayerNorm and partial rotary embeddings are not implemented",
    ),
    (
        "gpt_neox_japanese",
        "its rotary embeddings and dense bias are not implemented",
    ),
    ("big_bird", "block-sparse attention is not implemented"),
    (
        "longformer",
        "sliding-window plus global attention is not implemented",
    ),
    (
        "layoutlmv2",
        "1D and 2D relative position biases are not implemented",
    ),
    (
        "layoutlmv3",
        "1D and 2D relative position biases are not implemented",
    ),
    (
        "nezha",
        "functional relative position encodings are not implemented",
    ),
    ("esm", "rotary position embeddings are not implemented"),
    ("beit", "relative position biases are not implemented"),
    (
        "data2vec-vision",
        "relative position biases are not implemented",
    ),
    (
        "swin",
        "windowed attention with relative position biases is not implemented",
    ),
    (
        "umt5",
        "a relative position bias table per layer is not implemented",
    ),
    (
        "longt5",
        "local and transient-global attention are not implemented",
    ),
    (
        "xlm",
        "its `causal` mode and language embeddings are not checked against the loader",
    ),
    (
        "flaubert",
        "its `causal` mode is not checked against the loader",
    ),
    (
        "led",
        "Longformer's local plus global attention is not implemented",
    ),
    (
        "pegasus_x",
        "block-local attention with global tokens is not implemented",
    ),
    (
        "bigbird_pegasus",
        "block-sparse attention is not implemented",
    ),
    ("informer", "ProbSparse attention is not implemented"),
];

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
