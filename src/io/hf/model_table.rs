//! The tables behind [`super::model_types`]: every model type the loader runs, and those it
//! refuses by name with the reason. One entry per model type, with a comment saying what its
//! attention in transformers is; the rules each entry's name selects live in `model_types.rs`.

use super::family::Family;
use super::model_types::{Causality, ModelType};

/// A model type of `family` with `causal` self-attention, scaled by 1/√d, honouring the refused
/// settings named in `reads`.
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

/// One that reads none of the refused settings.
const fn mt(name: &'static str, family: Family, causal: Causality) -> ModelType {
    reading(name, family, causal, &[])
}

/// A causal model type of llama's family (most decoders).
const fn llama(name: &'static str, reads: &'static [&'static str]) -> ModelType {
    reading(name, Family::Llama, Causality::Always, reads)
}

/// Where gpt2 sits in [`MODEL_TYPES`] (the one layout taken without a `model_type`).
pub(crate) const GPT2: usize = 0;

/// Keys of the refused-settings table (`ModelType::reads`) that several model types read.
const WINDOW: &[&str] = &["sliding_window"];

/// The keys of qwen2's sliding-window rules (qwen3's and qwen2_moe's too).
const QWEN2_WINDOWS: &[&str] = &[
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
];

const WINDOWS_BY_LAYER_TYPES: &[&str] = &["sliding_window", "layer_types"];

const PARTIAL_ROTARY: &[&str] = &["partial_rotary_factor"];

const ATTENTION_MULTIPLIER: &[&str] = &["attention_multiplier"];

const ROTARY_DIM: &[&str] = &["rotary_dim"];

const CLIP_QKV: &[&str] = &["clip_qkv"];

const BEIT: &[&str] = &[
    "use_relative_position_bias",
    "use_shared_relative_position_bias",
];

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
    // MegatronBertSelfAttention: bert's; its attention module LayerNorms the input first
    // (`ln`, see ModelType::input_norm).
    mt("megatron-bert", Family::Bert, Causality::IsDecoderKey),
    // Data2VecTextSelfAttention: bert's (causal by is_decoder).
    mt("data2vec-text", Family::Bert, Causality::IsDecoderKey),
    // LayoutLMSelfAttention: bert's, never causal (its 2-D positions are embeddings).
    mt("layoutlm", Family::Bert, Causality::Never),
    // EsmSelfAttention: bert's, q scaled by 1/√d before half-split RoPE (θ rope_theta,
    // default 10000, every dimension) when position_embedding_type is "rotary"; its attention
    // module LayerNorms the input first (`LayerNorm`, see ModelType::input_norm).
    reading(
        "esm",
        Family::Bert,
        Causality::IsDecoderKey,
        &["position_embedding_type"],
    ),
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
    // BeitAttention (and data2vec-vision's copy): vit's names, no key bias, plus a relative
    // position bias over the config's patch grid, per layer and/or shared (see `beit.rs`).
    reading("beit", Family::Vit, Causality::Never, BEIT),
    reading("data2vec-vision", Family::Vit, Causality::Never, BEIT),
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
    // WavLMAttention: wav2vec2's projections with a gated relative position bias (see
    // wavlm.rs), an encoder only.
    mt("wavlm", Family::Bart, Causality::Never),
    // SEWAttention and UniSpeechAttention: wav2vec2's (bart's names under `attention.`),
    // encoders only (SEW's squeeze and upsampling are outside the module).
    mt("sew", Family::Bart, Causality::Never),
    mt("unispeech", Family::Bart, Causality::Never),
    // MusicgenAttention (the decoder's config, MusicgenModel): bart's without biases, its
    // self-attention causal, `encoder_attn` attending to the conditioning states.
    mt("musicgen_decoder", Family::Bart, Causality::Always),
    // NllbMoeAttention: bart's in both stacks (the experts are outside it); the decoder's
    // cross-attention is named `cross_attention`.
    mt("nllb-moe", Family::Bart, Causality::InDecoderStack),
    // GPTNeoSelfAttention: bart's names under `attn.attention.`, no q/k/v biases, causal, no
    // 1/√d scale, and layers `local` in `attention_layers` see the last `window_size` keys.
    ModelType {
        unscaled: true,
        ..reading(
            "gpt_neo",
            Family::Bart,
            Causality::Always,
            &["attention_types", "attention_layers"],
        )
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
    reading("gptj", Family::Bart, Causality::Always, ROTARY_DIM),
    mt("t5", Family::T5, Causality::InDecoderStack),
    mt("mt5", Family::T5, Causality::InDecoderStack),
    // UMT5Attention: t5's, every self-attention with its own relative bias table
    // (ModelType::relative_bias_per_layer), buckets by stack as t5's.
    mt("umt5", Family::T5, Causality::InDecoderStack),
    // LongT5: t5's decoder; its encoder's LongT5LocalAttention sees the keys within
    // local_radius (blocks of local_radius + 1, t5's bias of (key − query) from block 0's
    // table); transient-global attention is refused (see HfCheckpoint::longt5_local_block).
    mt("longt5", Family::T5, Causality::InDecoderStack),
    llama("llama", &[]),
    llama("mistral", WINDOW),
    llama("mixtral", WINDOW),
    llama("qwen2", QWEN2_WINDOWS),
    llama("gemma", &[]),
    // Gemma2Attention: llama's scaled by 1/√query_pre_attn_scalar, scores soft-capped by
    // attn_logit_softcapping, and the layers `layer_types` calls sliding windowed.
    llama(
        "gemma2",
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
    llama("gemma3_text", GEMMA3),
    llama("gemma3", GEMMA3),
    // GptOssAttention: llama's with biases (attention_bias, default true), a learned sink
    // logit per head in every softmax's denominator, windows by layer_types (without them,
    // the even layers) and yarn RoPE.
    llama("gpt_oss", WINDOWS_BY_LAYER_TYPES),
    // GraniteAttention: llama's, with the score scale `attention_multiplier` instead of 1/√d.
    llama("granite", ATTENTION_MULTIPLIER),
    // Starcoder2Attention: llama's with biases (`use_bias`) and mistral's sliding window.
    llama("starcoder2", WINDOW),
    // Qwen3Attention: llama's with per-head RMSNorm of q and k before RoPE (`q_norm`,
    // `k_norm`: [head_dim]) and qwen2's sliding-window rules.
    llama("qwen3", QWEN2_WINDOWS),
    // OlmoAttention: llama's, the projections clamped to ±clip_qkv when it is set.
    llama("olmo", CLIP_QKV),
    // Olmo2Attention: llama's with RMSNorm over the whole q and k projections before RoPE.
    llama("olmo2", &[]),
    // Qwen2MoeAttention: qwen2's (q/k/v biases by qkv_bias, default true), its layers
    // sliding by layer_types, else the even layers below max_window_layers when
    // use_sliding_window (the MoE block is outside the module).
    llama("qwen2_moe", QWEN2_WINDOWS),
    // Qwen3MoeAttention: qwen3's per-head q/k RMSNorm; with use_sliding_window every layer
    // slides (its config has no layer_types nor max_window_layers: see `ignores`).
    llama("qwen3_moe", &["sliding_window", "use_sliding_window"]),
    // OlmoeAttention: RMSNorm over the whole q and k projections, then clip_qkv (refused: the
    // loader clamps before the norms), then RoPE.
    llama("olmoe", &[]),
    // GraniteMoeAttention: granite's (the score scale attention_multiplier).
    llama("granitemoe", ATTENTION_MULTIPLIER),
    // HeliumAttention: llama's with interleaved RoPE (θ default 10^5), q/k/v biases by
    // attention_bias and none on o_proj.
    llama("helium", &[]),
    // ArceeAttention: llama's.
    llama("arcee", &[]),
    // MinistralAttention: mistral's (no biases) with windows by layer_types.
    llama("ministral", WINDOWS_BY_LAYER_TYPES),
    // SeedOssAttention: llama's, q/k/v biases by attention_bias (default true), o_proj's by
    // attention_out_bias (default false).
    llama("seed_oss", &[]),
    // Ernie4_5Attention: llama's with interleaved RoPE (θ default 5·10^5) and biases by
    // use_bias.
    llama("ernie4_5", &[]),
    // Exaone4Attention: per-head q/k RMSNorm before RoPE; sliding layers by layer_types, else
    // all but every sliding_window_pattern-th (default 4); with a sliding_window, the full
    // layers have no RoPE.
    llama(
        "exaone4",
        &["sliding_window", "sliding_window_pattern", "layer_types"],
    ),
    // HunYuanDenseV1Attention: llama's with per-head q/k RMSNorm after RoPE; its "dynamic"
    // RoPE with `alpha` is a fixed θ·alpha^(d/(d−2)).
    llama("hunyuan_v1_dense", &[]),
    // Olmo3Attention: olmo2's whole-projection q/k RMSNorm, windows by layer_types (else
    // every fourth layer full) and a RoPE per layer kind (θ default 5·10^5).
    llama("olmo3", WINDOWS_BY_LAYER_TYPES),
    // Cohere2Attention: cohere's interleaved RoPE on the sliding layers only (none on the
    // full ones), windows by layer_types, else every sliding_window_pattern-th layer full
    // (default 4); no q/k norm.
    llama(
        "cohere2",
        &["sliding_window", "layer_types", "sliding_window_pattern"],
    ),
    // Qwen3NextAttention (its full-attention layers; the Gated DeltaNet layers at
    // `linear_attn.` hold no q_proj): q_proj packs per head d query rows and d gate rows; the
    // combined heads are multiplied by sigmoid(gate) before o_proj; per-head q/k RMSNorm ×(1 + w)
    // before RoPE (rms_norm_eps default 1e-6); partial RoPE (partial_rotary_factor default
    // 0.25); biases by attention_bias; causal.
    llama("qwen3_next", &["layer_types", "partial_rotary_factor"]),
    // BitNetAttention: llama's (θ default 5·10^5, biases by attention_bias) with
    // `attn_sub_norm`, an RMSNorm(hidden_size) of the attention output before o_proj
    // (rms_norm_eps default 1e-5). Its checkpoints' quantization_config (BitLinear) is refused
    // with every model type's (config::SETTINGS).
    llama("bitnet", &[]),
    // JambaAttention (its attention layers; the Mamba layers hold no q_proj): llama's
    // projections without biases and without any position embedding (NoPE), GQA, causal.
    llama("jamba", &[]),
    // Llama4TextAttention: llama's with interleaved (complex) RoPE, no RoPE on the layers
    // `no_rope_layers` marks 0 (else every no_rope_layer_interval-th) where, with
    // attn_temperature_tuning, q is scaled by ln(1 + ⌊(p + 1)/floor_scale⌋)·attn_scale + 1 at
    // row p; a weightless RMS q/k norm after RoPE (use_qk_norm) on the RoPE layers; chunked
    // attention (attention_chunk_size) on the layers layer_types calls chunked (default: the
    // RoPE layers). θ default 5·10^5.
    llama(
        "llama4_text",
        &[
            "layer_types",
            "no_rope_layers",
            "no_rope_layer_interval",
            "use_qk_norm",
            "attention_chunk_size",
            "attn_temperature_tuning",
            "floor_scale",
            "attn_scale",
        ],
    ),
    // SmolLM3Attention: llama's without RoPE on the layers `no_rope_layers` marks 0 (else
    // every no_rope_layer_interval-th), windows by layer_types (else, with use_sliding_window,
    // the NoPE layers), θ default 2·10^6.
    llama(
        "smollm3",
        &[
            "sliding_window",
            "use_sliding_window",
            "layer_types",
            "no_rope_layers",
            "no_rope_layer_interval",
        ],
    ),
    // GlmAttention: llama's names, q/k/v biases by attention_bias (default true), none on
    // o_proj, and interleaved RoPE on the first partial_rotary_factor (default 0.5) of each
    // head, pairs (2k, 2k + 1) turning at θ^(−2k/rotary_dims).
    llama("glm", PARTIAL_ROTARY),
    // Glm4Attention: glm's (its decoder layer's extra norms are outside the module).
    llama("glm4", PARTIAL_ROTARY),
    // NemotronAttention: llama's, biases on all four by attention_bias (default false),
    // half-split RoPE on the first partial_rotary_factor (default 0.5) of each head.
    llama("nemotron", PARTIAL_ROTARY),
    // CohereAttention: llama's with interleaved RoPE and, with use_qk_norm, a bias-free
    // LayerNorm of each head of q and k ([heads, head_dim] weights).
    llama("cohere", &["use_qk_norm"]),
    // StableLmAttention: llama's names, q/k/v biases by use_qkv_bias, partial RoPE (default
    // 0.25) and, with qk_layernorm, a bias-free LayerNorm per head.
    llama("stablelm", &["qk_layernorm", "partial_rotary_factor"]),
    reading(
        "phi3",
        Family::Phi3,
        Causality::Always,
        &["sliding_window", "partial_rotary_factor"],
    ),
    // PhiAttention: biased q/k/v projections and `dense`, partial RoPE (default 0.5); its
    // optional q/k LayerNorm (with biases) is refused by name (qk_layernorm).
    reading("phi", Family::Phi, Causality::Always, PARTIAL_ROTARY),
    // CodeGenAttention: `qkv_proj` packed in 4 blocks (mp_num) of [q, v, k] slices of E/4
    // rows each, `out_proj`, no biases, causal, scale 1/√d, GPT-J's interleaved RoPE (θ 10000)
    // on the first `rotary_dim` dimensions of each head.
    reading("codegen", Family::CodeGen, Causality::Always, ROTARY_DIM),
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
    // ModernBertAttention (5.25, padded): `Wqkv` (q rows, then k, then v) and `Wo`, biases by
    // attention_bias (default false), an encoder; half-split RoPE with θ per layer kind
    // (global_rope_theta 160000 / local_rope_theta 10000, or the nested rope_parameters);
    // layers by layer_types, else all but every global_attn_every_n_layers-th (default 3)
    // slide, seeing keys |i − j| ≤ local_attention / 2 (default 128).
    reading(
        "modernbert",
        Family::ModernBert,
        Causality::Never,
        &["layer_types"],
    ),
    // DbrxAttention: MPT's packed `Wqkv` (q, k, v rows) and `out_proj`, no biases, half-split
    // RoPE from rope_parameters (θ default 10000), GQA by `attn_config.kv_n_heads` (default 1),
    // q/k/v clamped by `attn_config.clip_qkv` before RoPE, causal (its own rules, see
    // config::falcon_mpt).
    reading("dbrx", Family::Mpt, Causality::Always, CLIP_QKV),
    // DeepseekV2Attention / DeepseekV3Attention: multi-head latent attention (q LoRA or q_proj,
    // the compressed latent and a shared RoPE key, kv_b_proj per head), causal; its sizes,
    // attention_bias, rope_interleave and yarn's mscale_all_dim are read by `HfCheckpoint::
    // mla_attention`.
    mt("deepseek_v2", Family::Mla, Causality::Always),
    mt("deepseek_v3", Family::Mla, Causality::Always),
    // PersimmonAttention: `query_key_value` packed per head (gpt_neox's) and `dense`, all
    // biased; with qk_layernorm (default true) an nn.LayerNorm(head_dim) with bias on q and k
    // (one for every head) before half-split RoPE on the first partial_rotary_factor (default
    // 0.5) of each head.
    reading(
        "persimmon",
        Family::GptNeox,
        Causality::Always,
        &["partial_rotary_factor", "qk_layernorm"],
    ),
    reading(
        "gpt_neox",
        Family::GptNeox,
        Causality::Always,
        &["partial_rotary_factor", "rotary_pct"],
    ),
];

/// Model types that save one of the recognised layouts with attention the loader does not
/// compute, and what each would need.
pub(crate) const REFUSED_TYPES: &[(&str, &str)] = &[
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
    (
        "swin",
        "windowed attention with relative position biases is not implemented",
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
