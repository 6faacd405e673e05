#!/usr/bin/env python3
"""Hugging Face case files, made by `transformers`' own modules (DESIGN.md, "Real checkpoints").

Each family is one tiny model (hidden 32, 2 layers, vocab 64, `attn_implementation="eager"`) built
from a config with random init, seeded by the family name; its matrices keep transformers' init
(initializer_range 0.2, so attention is far from uniform) and every 1-D parameter (biases, norms)
gets seeded noise, so that no bias is zero. Tensors and `hf_config` are what `save_pretrained`
writes (saved names may differ from the in-memory ones: ViT saves the legacy `attention.query…`,
`output.dense` names).

  tests/fixtures/hf/<family>_<what>.safetensors   one attention module each (variant "hf"):
    metadata `hf_config` (config.json text), `prefix`, `attention` (self/cross), `causal`,
    `err_f32_vs_f64`, `family`, `generator`; the saved tensors under `prefix` (T5 self-attention of
    a block > 0 also carries block 0's `relative_attention_bias.weight`); `hidden_states` and
    `key_value_states` as captured by a forward hook during a real f32 model forward on random
    input_ids; `position_ids` (RoPE families); `attention_mask` [B, Lk] u8 (1 = real token, right
    padding only); `out` (the f32 module) and `out_f64` (a float64 copy of the module on the same
    f32 data): the module's output after its output projection (BERT: `attention.output.dense`).
  tests/fixtures/hf_models/{bert,gpt2,t5}/   config.json + model.safetensors of the same models.

The replay builds the additive mask itself (0 / finfo(dtype).min: padding, causal, sliding
window), T5's position bias with block 0's `compute_bias` and RoPE's cos/sin (computed in
float64 from the config for out_f64, llama3 scaling included), and asserts that the f32 replay
equals the output hooked during the model forward. For out_f64, softmax(..., dtype=float32) in
the eager attention functions (vit, llama, mistral, qwen2, gemma, phi3, gpt_neox) is kept in
float64. `llama_*_rope4x` repeats a llama case with `hf_config` in transformers 4.x spelling
(`rope_theta`, `rope_scaling`); `gpt_neox_*_rope4x` likewise (`rotary_pct`, `rotary_emb_base`).

`gpt_neo_*` (layer 0 global, layer 1 local), `gemma2_*` (soft-capping, query_pre_attn_scalar,
layer 0 windowed), `granite_*` (attention_multiplier) and `starcoder2_*` (biases, window) were written by transformers 5.25 (`--only gpt_neo newer_rope`),
as were `gpt_neox_*_default_pct[_nopct]` (no rotary_pct: 0.25 rotates) and
`t5_encoder_self_block0_padding_short_distance` (max distance 4 below the exact range)
(`--only loader_semantics`), and `qwen3_*` (per-head q/k RMSNorm) and `olmo2_*` (RMSNorm over
the whole q and k projections), `cohere_*` (interleaved RoPE, per-head LayerNorm) and
`stablelm_*` (partial RoPE, q/k/v biases, a LayerNorm per head) and `gemma3_*` (q/k RMSNorm
1 + w; a sliding layer and a full one, each with its own RoPE θ), and `llama_*_yarn*` (yarn RoPE, with
and without truncation) and `gpt_oss_*` (sinks, biases, yarn; a sliding and a full layer)
(`--only qk_norm`), and `bloom_*` (ALiBi; the module's own residual replayed as zeros) (`--only alibi`), `gptj_*` and `roformer_*` (interleaved RoPE under bart's and bert's names)
(`--only interleaved`), `olmo_*` (clip_qkv), `phi_*`, `albert_*` and `gpt_bigcode_*` (MQA and MHA) (`--only layouts`),
`falcon_*` (new_decoder_architecture GQA with biases, and multi-query; rotary) and `mpt_*` (ALiBi
over 6 heads, attn_config clip_qkv and softmax_scale; MPT's `softmax(scores.float())` kept in
float64 by the replay) (`--only falcon_mpt`), `codegen_*` (4-block qkv_proj, interleaved partial
RoPE), `phi3_*_longrope` and `llama_*_dynamic` (positions past the original / max length: the
long factors and the grown θ, as a freshly loaded rotary module computes them for the call)
(`--only scaled_rope`), `deepseek_v2_*` (MLA with q LoRA, biases, yarn with mscale_all_dim) and
`deepseek_v3_*` (plain q_proj with interleaved RoPE; q LoRA with rotate-half RoPE) (`--only mla`:
their float64 replay keeps V2's `.float()` and the RMSNorms' `.to(torch.float32)` in float64, and
builds V2's complex `freqs_cis` from float64 angles), `clip_text_*` (CLIP's causal text tower),
`siglip_vision_*` and `xglm_*` (`--only towers`), and (`--only round2`, issue 38) `qwen2_moe_*`
(qkv_bias, its own window pattern), `qwen3_moe_*` (every layer slides), `olmoe_*`, `granitemoe_*`,
`helium_*` and `ernie4_5_*` (interleaved RoPE; ERNIE's `.float()` kept float64), `arcee_*`,
`ministral_*`, `seed_oss_*` (attention_out_bias), `exaone4_*` and `cohere2_*` (a sliding layer and
a NoPE full one), `hunyuan_v1_dense_*` (q/k norm after RoPE), `olmo3_*` (a RoPE per layer kind)
and `smollm3_*` (no_rope_layers), and (`--only glm`, issue 38 group 3) `glm_*` and `glm4_*`
(interleaved partial RoPE, q/k/v biases) `nemotron_*` (half-split partial RoPE), `persimmon_*` (q/k LayerNorm with bias) and
`modernbert_*` (a global and a local encoder layer, each θ its kind's; both spellings), and
(`--only encoders`, issue 38; tools/gen_hf_encoders.py)
`megatron_bert_*` and `esm_*` (their hidden_states are what enters `attention.self`, after the
module's own input LayerNorm; esm rotary), `data2vec_text_*`, `layoutlm_*`, `sew_*`, `unispeech_*`,
`musicgen_decoder_*`, `nllb_moe_*` (self, causal, `cross_attention`), `umt5_*` (a table per block),
`beit_*` and `data2vec_vision_*` (relative position bias tables given seeded values; the shared one
carried beside the module), `wavlm_*` (gated bias of layer 0's table, the frame mask) and `longt5_*`
(the encoder's local attention, unpadded; the decoder's t5 attention), (`--only llama4`) `llama4_text_*` (a chunked RoPE layer with
its weightless q/k norm, a NoPE layer with temperature tuning; complex RoPE tables in float64),
(`--only dbrx`) `dbrx_*` (Wqkv with RoPE, GQA, clip_qkv), (`--only jamba`) `jamba_*` (an attention
layer without positions beside a Mamba one), (`--only qwen3_next`) `qwen3_next_*` (a gated full-attention
layer beside a Gated DeltaNet one; its RMSNorms' `.float()` kept float64), (`--only bitnet`) `bitnet_*`
(unquantized; the attention output's RMSNorm before o_proj); the others by 5.24. CodeGen's scores cast
to float32 are kept float64 in the float64 replay, as GPT-J's.

Usage:  python tools/gen_hf_cases.py [--out tests/fixtures] [--only GROUP ...]
        (needs torch, transformers 5)
"""

import argparse
import contextlib
import copy
import json
import math
import os
import shutil
import sys
import tempfile
import zlib

import safetensors.numpy
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
import gen_hf_encoders  # noqa: E402

import transformers as tf  # noqa: E402

tf.logging.set_verbosity_error()
tf.utils.logging.disable_progress_bar()

GENERATOR = "tools/gen_hf_cases.py"
B = 2
EAGER = {"attn_implementation": "eager"}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# wavelengths 2π·{1, 10, 100, 1000} against 64/4 = 16 and 64/1 = 64: one kept, one smoothed,
# two divided by the factor.
LM = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
          num_attention_heads=4, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
          eos_token_id=2)
# DeepSeek's multi-head latent attention sizes, MoE off (first_k_dense_replace = every layer).
MLA = dict(LM, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
           v_head_dim=8, first_k_dense_replace=2, n_routed_experts=2, num_experts_per_tok=1,
           n_shared_experts=1, moe_intermediate_size=16, n_group=1, topk_group=1)

FAMILIES = {
    "bert": (tf.BertModel, tf.BertConfig, dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=16, initializer_range=0.2)),
    "distilbert": (tf.DistilBertModel, tf.DistilBertConfig, dict(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=16,
        initializer_range=0.2)),
    "vit": (tf.ViTModel, tf.ViTConfig, dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=8, patch_size=4, num_channels=3, initializer_range=0.2)),
    "gpt2": (tf.GPT2Model, tf.GPT2Config, dict(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16, initializer_range=0.2,
        bos_token_id=1, eos_token_id=2)),
    "bart": (tf.BartModel, tf.BartConfig, dict(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=16, init_std=0.2)),
    "whisper": (tf.WhisperModel, tf.WhisperConfig, dict(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
        max_source_positions=6, max_target_positions=16, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=0, init_std=0.2)),
    # d_kv 6 ≠ d_model / num_heads; 8 buckets up to distance 20 put distances ≥ 2 (encoder) and
    # ≥ 4 (decoder) in the logarithmic buckets.
    "t5": (tf.T5Model, tf.T5Config, dict(
        vocab_size=64, d_model=32, d_kv=6, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20)),
    "llama": (tf.LlamaModel, tf.LlamaConfig, dict(
        LM, num_key_value_heads=2, max_position_embeddings=64, rope_parameters=dict(LLAMA3))),
    "mistral": (tf.MistralModel, tf.MistralConfig, dict(
        LM, num_key_value_heads=2, sliding_window=3)),
    "qwen2": (tf.Qwen2Model, tf.Qwen2Config, dict(LM, num_key_value_heads=2)),
    "gemma": (tf.GemmaModel, tf.GemmaConfig, dict(LM, num_key_value_heads=1, head_dim=12)),
    "phi3": (tf.Phi3Model, tf.Phi3Config, dict(LM, num_key_value_heads=2)),
    "gpt_neox": (tf.GPTNeoXModel, tf.GPTNeoXConfig, dict(LM, rotary_pct=0.5)),
    # scale 1/√6, scores capped at 1.0 (the scores reach ±3 here, so it binds), layer 0 slides
    # over 3 keys and layer 1 is full (transformers' default layer_types).
    "gemma2": (tf.Gemma2Model, tf.Gemma2Config, dict(
        LM, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=6,
        attn_logit_softcapping=1.0, sliding_window=3)),
    # attention_multiplier 0.3 instead of 1/√8.
    "granite": (tf.GraniteModel, tf.GraniteConfig, dict(
        LM, num_key_value_heads=2, attention_multiplier=0.3)),
    "starcoder2": (tf.Starcoder2Model, tf.Starcoder2Config, dict(
        LM, num_key_value_heads=2, sliding_window=3, use_bias=True)),
    # per-head q/k RMSNorm (one [head_dim] weight), GQA 4/2, head_dim 8 ≠ E/H.
    "qwen3": (tf.Qwen3Model, tf.Qwen3Config, dict(LM, num_key_value_heads=2, head_dim=8)),
    # interleaved RoPE, and (use_qk_norm) a bias-free LayerNorm of each head of q and k.
    "cohere": (tf.CohereModel, tf.CohereConfig, dict(LM, num_key_value_heads=2, use_qk_norm=True)),
    # q/k/v biases, partial RoPE (default 0.25), a bias-free LayerNorm per head (qk_layernorm).
    "stablelm": (tf.StableLmModel, tf.StableLmConfig, dict(
        LM, num_key_value_heads=2, qk_layernorm=True, use_qkv_bias=True)),
    # Gemma 3: per-head q/k RMSNorm (1 + w), scale 1/√6, layer 0 slides over 3 keys with
    # θ = 10000, layer 1 is full with θ = 1000 (a RoPE per layer kind).
    "gemma3": (tf.Gemma3TextModel, tf.Gemma3TextConfig, dict(
        LM, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=6, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000.0}})),
    # yarn RoPE: the first frequency kept, the rest interpolated ÷4, cos/sin × (0.1·ln 4 + 1);
    # then gpt-oss's spelling: no truncation, beta_fast 8, an explicit attention_factor.
    "llama_yarn": (tf.LlamaModel, tf.LlamaConfig, dict(
        LM, num_key_value_heads=2, max_position_embeddings=64, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0})),
    "llama_yarn_notrunc": (tf.LlamaModel, tf.LlamaConfig, dict(
        LM, num_key_value_heads=2, max_position_embeddings=64, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "truncate": False,
            "original_max_position_embeddings": 16, "beta_fast": 8.0, "beta_slow": 1.0,
            "attention_factor": 1.3})),
    # gpt-oss: sinks, biases, yarn RoPE (gpt-oss's spelling), layer 0 slides over 3 keys.
    "gpt_oss": (tf.GptOssModel, tf.GptOssConfig, dict(
        vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
        num_experts_per_tok=1, sliding_window=3, initializer_range=0.2,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "beta_fast": 8.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 16})),
    # CodeGen: qkv_proj in 4 blocks of [q, v, k] (one head each here), GPT-J's RoPE.
    "codegen": (tf.CodeGenModel, tf.CodeGenConfig, dict(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2)),
    # longrope past original_max_position_embeddings 4: every frequency divided by its long
    # factor, cos/sin × √(1 + ln(16/4) / ln 4) (phi3's top-level original max, no `factor`).
    "phi3_longrope": (tf.Phi3Model, tf.Phi3Config, dict(
        LM, num_key_value_heads=2, max_position_embeddings=16,
        original_max_position_embeddings=4, rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.5, 2.0, 0.5], "long_factor": [2.0, 4.0, 8.0, 16.0]})),
    # dynamic NTK past max_position_embeddings 4: θ grows with the call's sequence length.
    "llama_dynamic": (tf.LlamaModel, tf.LlamaConfig, dict(
        LM, num_key_value_heads=2, max_position_embeddings=4,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
    # GPT-J: bart's names, interleaved RoPE on the first 4 of 8 dimensions of each head.
    "gptj": (tf.GPTJModel, tf.GPTJConfig, dict(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2)),
    # RoFormer: bert's names, interleaved sinusoidal RoPE over every dimension.
    "roformer": (tf.RoFormerModel, tf.RoFormerConfig, dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=16, initializer_range=0.2)),
    # OLMo: llama's with the projections clamped to ±0.5 (they reach ±2 here, so it binds).
    "olmo": (tf.OlmoModel, tf.OlmoConfig, dict(LM, num_key_value_heads=2, clip_qkv=0.5)),
    # Phi: biased q/k/v and `dense`, partial RoPE (0.5 of each head), GQA 4/2.
    "phi": (tf.PhiModel, tf.PhiConfig, dict(LM, num_key_value_heads=2)),
    # ALBERT: one layer shared by the stack (one here, so that it runs once).
    "albert": (tf.AlbertModel, tf.AlbertConfig, dict(
        vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=16,
        initializer_range=0.2)),
    # GPT-BigCode: a Linear c_attn, multi-query (one key/value head) and per-head packed.
    "gpt_bigcode": (tf.GPTBigCodeModel, tf.GPTBigCodeConfig, dict(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=True,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2)),
    "gpt_bigcode_mha": (tf.GPTBigCodeModel, tf.GPTBigCodeConfig, dict(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=False,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2)),
    # BLOOM: gpt_neox's packing with biases, ALiBi instead of RoPE.
    "bloom": (tf.BloomModel, tf.BloomConfig, dict(
        vocab_size=64, hidden_size=32, n_layer=2, n_head=4, initializer_range=0.2)),
    # RMSNorm over the whole q and k projections.
    "olmo2": (tf.Olmo2Model, tf.Olmo2Config, dict(LM, num_key_value_heads=2)),
    # rotary_pct left to transformers' default (0.25 of each head rotates).
    "gpt_neox_default_pct": (tf.GPTNeoXModel, tf.GPTNeoXConfig, dict(LM)),
    # relative_attention_max_distance 4 below the exact range (8 of 16 buckets per direction):
    # the log-spaced buckets' share goes negative and torch truncates it toward zero.
    "t5_short_distance": (tf.T5Model, tf.T5Config, dict(
        vocab_size=64, d_model=32, d_kv=6, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=32, relative_attention_max_distance=4)),
    # Falcon: `query_key_value` packed per key/value group ([q heads of the group, k, v]) with
    # new_decoder_architecture (GQA 4/2, biases); multi_query: 4 query heads, then k, then v.
    "falcon_gqa": (tf.FalconModel, tf.FalconConfig, dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
        new_decoder_architecture=True, bias=True, max_position_embeddings=64,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2)),
    "falcon_mqa": (tf.FalconModel, tf.FalconConfig, dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        multi_query=True, new_decoder_architecture=False, bias=False,
        max_position_embeddings=64, initializer_range=0.2, bos_token_id=1, eos_token_id=2)),
    # MPT: `Wqkv` (q rows, k, v), ALiBi with 6 heads (not a power of two), q/k/v clamped to ±0.8,
    # softmax_scale 0.5 instead of 1/√8.
    "mpt": (tf.MptModel, tf.MptConfig, dict(
        vocab_size=64, d_model=48, n_heads=6, n_layers=2, expansion_ratio=2, max_seq_len=16,
        initializer_range=0.2, attn_config=dict(clip_qkv=0.8, softmax_scale=0.5))),
    # layer 0 global, layer 1 local with a window of 3; unscaled scores.
    # Towers of two-tower models, and XGLM's `attention_heads`: bart's layout under other
    # names. CLIP's init (initializer_factor) is raised so that attention is far from uniform.
    "clip": (tf.CLIPModel, tf.CLIPConfig, dict(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=16, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2),
        vision_config=dict(hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=2, image_size=8, patch_size=4, num_channels=3),
        projection_dim=8, initializer_factor=6.0)),
    "siglip": (tf.SiglipModel, tf.SiglipConfig, dict(
        text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, image_size=8, patch_size=4, num_channels=3))),
    "xglm": (tf.XGLMModel, tf.XGLMConfig, dict(
        vocab_size=64, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64,
        max_position_embeddings=16, init_std=0.2, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    "gpt_neo": (tf.GPTNeoModel, tf.GPTNeoConfig, dict(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
        attention_types=[[["global", "local"], 1]], window_size=3, max_position_embeddings=16,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2)),
    # DeepSeek multi-head latent attention, MoE off (every layer dense): V2 with q LoRA, biases
    # and yarn (mscale_all_dim scales the scores too); V3 with a plain q_proj and interleaved
    # RoPE; V3 with q LoRA and rotate-half RoPE (rope_interleave false).
    "deepseek_v2": (tf.DeepseekV2Model, tf.DeepseekV2Config, dict(
        MLA, q_lora_rank=24, attention_bias=True, max_position_embeddings=64,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707})),
    "deepseek_v3": (tf.DeepseekV3Model, tf.DeepseekV3Config, dict(MLA, q_lora_rank=None)),
    "deepseek_v3_halves": (tf.DeepseekV3Model, tf.DeepseekV3Config, dict(
        MLA, q_lora_rank=24, rope_interleave=False)),
    # transformers 5.25's llama-like families with a twist (`--only round2`).
    # qwen2_moe: q/k/v biases (qkv_bias), its own default layer pattern: layer 0 slides over 3.
    "qwen2_moe": (tf.Qwen2MoeModel, tf.Qwen2MoeConfig, dict(
        LM, num_key_value_heads=2, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, use_sliding_window=True, sliding_window=3,
        max_window_layers=2)),
    # qwen3_moe: qwen3's per-head q/k RMSNorm; with use_sliding_window every layer slides.
    "qwen3_moe": (tf.Qwen3MoeModel, tf.Qwen3MoeConfig, dict(
        LM, num_key_value_heads=2, head_dim=8, num_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=16, use_sliding_window=True, sliding_window=3)),
    # olmoe: RMSNorm over the whole q and k projections (olmo2's).
    "olmoe": (tf.OlmoeModel, tf.OlmoeConfig, dict(
        LM, num_key_value_heads=2, num_experts=2, num_experts_per_tok=1)),
    # granitemoe: the score scale attention_multiplier, biases by attention_bias.
    "granitemoe": (tf.GraniteMoeModel, tf.GraniteMoeConfig, dict(
        LM, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1,
        attention_multiplier=0.3, attention_bias=True)),
    # helium: interleaved RoPE (GLM's), q/k/v biases by attention_bias, none on o_proj.
    "helium": (tf.HeliumModel, tf.HeliumConfig, dict(
        LM, num_key_value_heads=2, head_dim=8, attention_bias=True)),
    "arcee": (tf.ArceeModel, tf.ArceeConfig, dict(LM, num_key_value_heads=2)),
    # ministral: no biases, windows by layer_types.
    "ministral": (tf.MinistralModel, tf.MinistralConfig, dict(
        LM, num_key_value_heads=2, head_dim=8, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"])),
    # seed_oss: q/k/v biases (attention_bias, default true), o_proj by attention_out_bias.
    "seed_oss": (tf.SeedOssModel, tf.SeedOssConfig, dict(
        LM, num_key_value_heads=2, head_dim=8)),
    # ernie4_5: interleaved RoPE in float32, biases on every projection by use_bias.
    "ernie4_5": (tf.Ernie4_5Model, tf.Ernie4_5Config, dict(
        LM, num_key_value_heads=2, head_dim=8, use_bias=True)),
    # exaone4: per-head q/k RMSNorm; layer 0 slides over 3 keys with RoPE, layer 1 is full
    # and has no RoPE (sliding_window_pattern 2).
    "exaone4": (tf.Exaone4Model, tf.Exaone4Config, dict(
        LM, num_key_value_heads=2, sliding_window=3, sliding_window_pattern=2)),
    # hunyuan_v1_dense: per-head q/k RMSNorm after RoPE (query_layernorm, key_layernorm).
    "hunyuan_v1_dense": (tf.HunYuanDenseV1Model, tf.HunYuanDenseV1Config, dict(
        LM, num_key_value_heads=2, head_dim=8)),
    # olmo3: whole-projection q/k RMSNorm, layer 0 slides over 3 keys (θ 10000), layer 1 is
    # full (θ 1000): a RoPE per layer kind.
    "olmo3": (tf.Olmo3Model, tf.Olmo3Config, dict(
        LM, num_key_value_heads=2, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000.0}})),
    # smollm3: layer 0 rotates and is full, layer 1 has no RoPE (no_rope_layer_interval 2)
    # and slides over 3 keys (use_sliding_window: its default layer_types).
    "smollm3": (tf.SmolLM3Model, tf.SmolLM3Config, dict(
        LM, num_key_value_heads=2, no_rope_layer_interval=2, use_sliding_window=True,
        sliding_window=3)),
    # cohere2: interleaved RoPE on the sliding layer 0 (window 3), none on the full layer 1.
    "cohere2": (tf.Cohere2Model, tf.Cohere2Config, dict(
        LM, num_key_value_heads=2, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"])),
    # issue 38 group 3 (`--only glm`): partial rotary forms.
    # glm: interleaved RoPE on half of each head (partial_rotary_factor 0.5, its default),
    # q/k/v biases (attention_bias, default true), none on o_proj.
    "glm": (tf.GlmModel, tf.GlmConfig, dict(LM, num_key_value_heads=2, head_dim=8)),
    # glm4: glm's attention; a quarter of each head rotates here.
    "glm4": (tf.Glm4Model, tf.Glm4Config, dict(
        LM, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25)),
    # nemotron: half-split RoPE on half of each head (default 0.5), biases on all four.
    "nemotron": (tf.NemotronModel, tf.NemotronConfig, dict(
        LM, num_key_value_heads=2, attention_bias=True)),
    # persimmon: packed query_key_value (per head), q/k LayerNorm with bias (qk_layernorm,
    # default true) before half-split RoPE on half of each head (default 0.5).
    "persimmon": (tf.PersimmonModel, tf.PersimmonConfig, dict(LM)),
    # modernbert: an encoder; layer 0 global (θ 20000), layer 1 local (θ 500) seeing keys
    # |i − j| <= local_attention / 2 = 2; packed Wqkv and Wo with biases.
    "modernbert": (tf.ModernBertModel, tf.ModernBertConfig, dict(
        LM, cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2, local_attention=4,
        global_rope_theta=20000.0, local_rope_theta=500.0, attention_bias=True)),
}
# llama4_text: layer 0 rotates (interleaved, complex), L2-normalises q and k and attends in
# chunks of 4; layer 1 has no RoPE and tunes the temperature (floor_scale 2, so the factor
# changes within the 7 tokens).
FAMILIES["llama4_text"] = (tf.Llama4TextModel, tf.Llama4TextConfig, dict(
    LM, num_key_value_heads=2, head_dim=8, intermediate_size_mlp=64, num_local_experts=2,
    no_rope_layers=[1, 0], attention_chunk_size=4, floor_scale=2, attn_scale=0.5))
# dbrx: MPT's packed Wqkv under RoPE, 2 key/value heads (attn_config.kv_n_heads), q/k/v clamped
# to ±0.3 (attn_config.clip_qkv), which binds on the random weights; DbrxAttention reads
# attn_config.rope_theta (and ignores it: the RoPE is rope_parameters'), so it is set to θ.
FAMILIES["dbrx"] = (tf.DbrxModel, tf.DbrxConfig, dict(
    vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, initializer_range=0.2,
    pad_token_id=0, attn_config={"kv_n_heads": 2, "clip_qkv": 0.3, "rope_theta": 10000.0},
    ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 2}))
# qwen3_next: layer 0 is a Gated DeltaNet layer (torch's fallback), layer 1 full attention
# with its output gate, (1 + w) q/k norms and RoPE on a quarter of each 16-wide head.
FAMILIES["qwen3_next"] = (tf.Qwen3NextModel, tf.Qwen3NextConfig, dict(
    LM, num_key_value_heads=2, head_dim=16, num_experts=2, num_experts_per_tok=1,
    moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_key_heads=2,
    linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    layer_types=["linear_attention", "full_attention"]))
# bitnet: unquantized (no quantization_config), so its projections are nn.Linear; the
# attention output's RMSNorm (attn_sub_norm) before o_proj.
FAMILIES["bitnet"] = (tf.BitNetModel, tf.BitNetConfig, dict(LM, num_key_value_heads=2))
# jamba: layer 1 is attention (attn_layer_period 2, offset 1), layer 0 Mamba (its slow path).
FAMILIES["jamba"] = (tf.JambaModel, tf.JambaConfig, dict(
    LM, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, num_experts=2,
    expert_layer_period=2, expert_layer_offset=1, use_mamba_kernels=False, mamba_d_state=4,
    mamba_expand=1))
HF_MODELS = ("bert", "gpt2", "t5")


def seeded(name):
    torch.manual_seed(zlib.crc32(name.encode()) % (2**31 - 1))


def build(family):
    cls, config_cls, kw = FAMILIES[family]
    seeded(family)
    model = cls(config_cls(**copy.deepcopy(kw), **EAGER)).eval()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1:
                # Sinks at the scores' scale (±2), so that they change the answer.
                p.add_((2.0 if name.endswith(".sinks") else 0.1) * torch.randn_like(p))
    return model


def saved(model, keep=None):
    """config.json text and tensors (numpy) as `save_pretrained` writes them; the reload must
    give back every in-memory tensor."""
    tmp = tempfile.mkdtemp()
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        with open(os.path.join(tmp, "config.json")) as f:
            config_text = f.read()
        tensors, _ = st_io.load(os.path.join(tmp, "model.safetensors"))
        again = type(model).from_pretrained(tmp, **EAGER)
        mine, theirs = model.state_dict(), again.state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), "save/reload changed a tensor"
        if keep is not None:
            os.makedirs(keep, exist_ok=True)
            for f in ("config.json", "model.safetensors"):
                shutil.copyfile(os.path.join(tmp, f), os.path.join(keep, f))
            print("wrote", keep)
    finally:
        shutil.rmtree(tmp)
    return config_text, tensors


def lengths_mask(lengths, length):
    """[B, L] int64, 1 = real token (right padding)."""
    return (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).long()


def additive_mask(pad, lq, lk, causal, window, dtype, chunk=None):
    """[B, 1, Lq, Lk] in `dtype`: 0 where a key is seen, finfo(dtype).min where not, as
    transformers' eager masks; None when nothing is masked. `chunk`: Llama 4's chunked
    attention (no left padding: chunks start at key 0)."""
    if pad is None and not causal:
        return None
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    keep = torch.ones(B, 1, lq, lk, dtype=torch.bool)
    if pad is not None:
        keep &= pad.bool()[:, None, None, :]
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= j > i - window
    if chunk is not None:
        keep &= j // chunk == i // chunk
    assert keep.any(-1).all(), "a query row without keys"
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


@contextlib.contextmanager
def softmax_in_float64():
    """Keep `softmax(x, dtype=torch.float32)` (the eager attention of several families) in
    float64 when x is float64; everything else is transformers' own code."""
    original = torch.nn.functional.softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        if dtype is not None and input.dtype == torch.float64:
            dtype = None
        return original(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    torch.nn.functional.softmax = softmax
    try:
        yield
    finally:
        torch.nn.functional.softmax = original


def capture(module, call):
    """(args, kwargs, output) of `module`'s one call during `call()`."""
    seen = []
    hook = module.register_forward_hook(lambda m, a, k, o: seen.append((a, k, o)), with_kwargs=True)
    try:
        with torch.no_grad():
            call()
    finally:
        hook.remove()
    assert len(seen) == 1, len(seen)
    return seen[0]


def first_arg(args, kwargs, name):
    return (args[0] if args else kwargs[name]).detach()


def rope_tables(config, position_ids, dtype, layer_type=None, halves=False):
    """cos, sin [B, L, rotary_dim] computed in `dtype` from the config (default, llama3, yarn,
    dynamic, longrope: the last two for the call's length, max(position_ids) + 1, as
    `dynamic_rope_update` of a fresh module); `layer_type`: the layer's kind where the config
    has a RoPE per kind (Gemma 3)."""
    rp = config.rope_parameters
    if layer_type is not None:
        rp = rp[layer_type]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))
    theta = rp["rope_theta"]
    seq_len = int(position_ids.max()) + 1
    attention = 1.0
    if rp["rope_type"] == "dynamic" and seq_len > config.max_position_embeddings:
        factor = rp["factor"]
        theta = theta * (factor * seq_len / config.max_position_embeddings - (factor - 1)) ** (
            dim / (dim - 2))
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))
    if rp["rope_type"] == "longrope":
        old = rp["original_max_position_embeddings"]
        factor = rp.get("factor") or config.max_position_embeddings / old
        attention = rp.get("attention_factor") or (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old)))
        ext = rp["long_factor"] if seq_len > old else rp["short_factor"]
        inv_freq = inv_freq / torch.tensor(ext, dtype=dtype)
    elif rp["rope_type"] == "llama3":
        factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif rp["rope_type"] == "yarn":
        factor, old = rp["factor"], rp["original_max_position_embeddings"]
        attention = rp.get("attention_factor") or (0.1 * math.log(factor) + 1.0)
        fast, slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

        def correction(rotations):
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(rp["rope_theta"]))

        low, high = correction(fast), correction(slow)
        if rp.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
        extrapolated = 1 - ramp
        inv_freq = inv_freq / factor * (1 - extrapolated) + inv_freq * extrapolated
        freqs = position_ids[..., None].to(dtype) * inv_freq
        emb = freqs if halves else torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * attention, emb.sin() * attention, inv_freq
    else:
        assert rp["rope_type"] in ("default", "dynamic", "longrope"), rp
    freqs = position_ids[..., None].to(dtype) * inv_freq
    if halves:  # gpt-oss's tables hold each angle once
        emb = freqs
    elif config.model_type in ("cohere", "cohere2"):  # pairs (2k, 2k + 1)
        emb = torch.repeat_interleave(freqs, 2, dim=-1)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * attention, emb.sin() * attention, inv_freq


def write_case(out_dir, name, family, config_text, state, prefix, attention, causal, inputs,
               out, out64, extra=()):
    tensors = {k: v for k, v in state.items() if k.startswith(prefix) or k in extra}
    assert tensors and all(k in state for k in extra)
    tensors.update({k: v.detach().contiguous().numpy() for k, v in inputs.items()})
    tensors["out"] = out.detach().numpy()
    tensors["out_f64"] = out64.detach().numpy()
    assert out.dtype == torch.float32 and out64.dtype == torch.float64
    assert out.shape == inputs["hidden_states"].shape
    assert not torch.isnan(out64).any() and not torch.isnan(out).any()
    err = float((out.double() - out64).abs().max())
    assert err < 1e-4 * (1.0 + float(out64.abs().max())), (name, err)
    meta = {"variant": "hf", "hf_config": config_text, "prefix": prefix, "attention": attention,
            "causal": "true" if causal else "false", "err_f32_vs_f64": repr(err),
            "generator": GENERATOR, "family": family}
    path = os.path.join(out_dir, "hf", name + ".safetensors")
    st_io.save(path, tensors, meta)
    back = safetensors.numpy.load_file(path)  # the official reader agrees
    assert back.keys() == tensors.keys() and all((back[k] == tensors[k]).all() for k in back)
    print("wrote", path, f"err_f32_vs_f64={err:.3g}")


def replay_case(out_dir, name, family, model, config_text, state, *, module, prefix, run,
                replay, attention="self", causal=False, pad=None, window=None, position_ids=None,
                hooked_out=None, kv_from=None, extra=(), chunk=None):
    """Capture what enters `module` during `run()` (the f32 model forward), replay it with a
    mask built here, check the replay against the hooked output, then replay a float64 copy.

    `replay(mod, x, kv, mask, dtype)` -> the module's output; `hooked_out`: the submodule whose
    output is the answer (default: `module` itself, output [0])."""
    args, kwargs, output = capture(module, run)
    if hooked_out is not None:
        _, _, expected = capture(hooked_out, run)
    else:
        expected = output[0]
    x = first_arg(args, kwargs, "hidden_states")
    kv = kwargs.get(kv_from).detach() if kv_from else None
    lq, lk = x.shape[1], (kv.shape[1] if kv is not None else x.shape[1])
    inputs = {"hidden_states": x}
    if kv is not None:
        inputs["key_value_states"] = kv
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    if pad is not None:
        assert pad.shape == (B, lk)
        inputs["attention_mask"] = pad.to(torch.uint8)
    with torch.no_grad():
        out = replay(module, x, kv,
                     additive_mask(pad, lq, lk, causal, window, torch.float32, chunk),
                     torch.float32)
        assert torch.allclose(out, expected, atol=1e-5, rtol=0), (name, (out - expected).abs().max())
        m64 = copy.deepcopy(module).double()
        with softmax_in_float64():
            out64 = replay(m64, x.double(), None if kv is None else kv.double(),
                           additive_mask(pad, lq, lk, causal, window, torch.float64, chunk),
                           torch.float64)
    write_case(out_dir, name, family, config_text, state, prefix, attention, causal, inputs, out,
               out64, extra)


def ids(length, low=3):
    return torch.randint(low, 64, (B, length))


def positions(length, *starts):
    """position_ids [len(starts), length]: each sequence's `length` positions from its start."""
    return torch.stack([torch.arange(start, start + length) for start in starts])


def prepared(variant, name, lengths, keep=None):
    """A family's model and what `save_pretrained` writes of it (kept in `keep`, if given), then,
    seeded by the case's name, input_ids of max(lengths) tokens and their padding mask."""
    model = build(variant)
    config_text, state = saved(model, keep)
    seeded(name)
    length = max(lengths)
    return model, config_text, state, ids(length), lengths_mask(lengths, length)


def decoder_case(out_dir, name, family, model, config_text, state, input_ids, pad, *,
                 position_ids=None, **kw):
    """replay_case of a causal layer of a decoder run on the padded input_ids (and
    position_ids, where given) without a cache."""
    at = {} if position_ids is None else {"position_ids": position_ids}
    replay_case(out_dir, name, family, model, config_text, state,
                run=lambda: model(input_ids, attention_mask=pad, **at, use_cache=False),
                causal=True, pad=pad, position_ids=position_ids, **kw)


def tables_replay(model, position_ids):
    """A replay passing RoPE's cos/sin: the model's own rotary embedding's for float32, float64
    ones computed from the config (checked against them) for float64."""
    cos64, sin64, inv64 = rope_tables(model.config, position_ids, torch.float64)
    with torch.no_grad():
        cos32, sin32 = model.rotary_emb(torch.zeros(1, dtype=torch.float32), position_ids)
    assert torch.allclose(inv64.float(), model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
    assert torch.allclose(cos64.float(), cos32, rtol=0, atol=1e-5)

    def replay(mod, x, kv, mask, dtype):
        tables = (cos32, sin32) if dtype == torch.float32 else (cos64, sin64)
        return mod(x, position_embeddings=tables, attention_mask=mask)[0]

    return replay


def plain(mod, x, kv, mask, dtype):
    return mod(x, attention_mask=mask)[0]


def cross(mod, x, kv, mask, dtype):
    return mod(x, key_value_states=kv, attention_mask=mask)[0]


# ---------------------------------------------------------------------------------------------
# Non-RoPE families


def bert_cases(out_dir, hf_models_dir):
    name = "bert_self_layer1_padding"
    model, config_text, state, input_ids, pad = prepared("bert", name, [6, 4],
                                                         os.path.join(hf_models_dir, "bert"))
    att = model.encoder.layer[1].attention
    replay_case(out_dir, name, "bert", model, config_text, state, module=att,
                prefix="encoder.layer.1.attention.",
                run=lambda: model(input_ids, attention_mask=pad),
                replay=lambda mod, x, kv, mask, dt: mod.output.dense(
                    mod.self(x, attention_mask=mask)[0]),
                pad=pad, hooked_out=att.output.dense)


def distilbert_cases(out_dir):
    name = "distilbert_self_layer0_padding"
    model, config_text, state, input_ids, pad = prepared("distilbert", name, [7, 5])
    replay_case(out_dir, name, "distilbert", model, config_text, state,
                module=model.transformer.layer[0].attention,
                prefix="transformer.layer.0.attention.",
                run=lambda: model(input_ids, attention_mask=pad), replay=plain, pad=pad)


def vit_cases(out_dir):
    model = build("vit")
    config_text, state = saved(model)
    name = "vit_self_layer1"
    seeded(name)
    pixels = torch.randn(B, 3, 8, 8)  # 2x2 patches of 4 + [CLS]: L = 5
    # In memory the module is `layers.1.attention` (q_proj … o_proj); saved under the legacy
    # names `encoder.layer.1.attention.attention.{query,key,value}`, `….output.dense`.
    replay_case(out_dir, name, "vit", model, config_text, state,
                module=model.layers[1].attention, prefix="encoder.layer.1.attention.",
                run=lambda: model(pixels), replay=lambda mod, x, kv, mask, dt: mod(x)[0])


def gpt2_cases(out_dir, hf_models_dir):
    name = "gpt2_self_layer1_causal_padding"
    model, config_text, state, input_ids, pad = prepared("gpt2", name, [6, 4],
                                                         os.path.join(hf_models_dir, "gpt2"))
    decoder_case(out_dir, name, "gpt2", model, config_text, state, input_ids, pad,
                 module=model.h[1].attn, prefix="h.1.attn.", replay=plain)


def bart_cases(out_dir):
    model = build("bart")
    config_text, state = saved(model)

    name, length = "bart_encoder_self_layer0_padding", 7
    seeded(name)
    input_ids, pad = ids(length), lengths_mask([7, 5], length)
    dec_ids = ids(5)
    run = lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,  # noqa: E731
                        use_cache=False)
    replay_case(out_dir, name, "bart", model, config_text, state,
                module=model.encoder.layers[0].self_attn, prefix="encoder.layers.0.self_attn.",
                run=run, replay=plain, pad=pad)

    name = "bart_decoder_self_layer1_causal"
    seeded(name)
    input_ids, pad, dec_ids = ids(7), lengths_mask([7, 6], 7), ids(6)
    replay_case(out_dir, name, "bart", model, config_text, state,
                module=model.decoder.layers[1].self_attn, prefix="decoder.layers.1.self_attn.",
                run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                  use_cache=False),
                replay=plain, causal=True)

    name = "bart_decoder_cross_layer0_padding"
    seeded(name)
    input_ids, pad, dec_ids = ids(7), lengths_mask([5, 7], 7), ids(5)
    run = lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,  # noqa: E731
                        use_cache=False)
    with torch.no_grad():
        enc = model.encoder(input_ids, attention_mask=pad).last_hidden_state
    replay_case(out_dir, name, "bart", model, config_text, state,
                module=model.decoder.layers[0].encoder_attn, prefix="decoder.layers.0.encoder_attn.",
                run=run, replay=cross, attention="cross", pad=pad, kv_from="key_value_states")
    check_kv(out_dir, name, enc)


def check_kv(out_dir, name, enc):
    """The captured key_value_states are the encoder output."""
    tensors, _ = st_io.load(os.path.join(out_dir, "hf", name + ".safetensors"))
    assert torch.equal(torch.from_numpy(tensors["key_value_states"]), enc), name


def whisper_cases(out_dir):
    model = build("whisper")
    config_text, state = saved(model)
    # The encoder reads exactly 2 * max_source_positions frames; neither the encoder nor the
    # decoder's cross-attention takes a padding mask.
    name = "whisper_encoder_self_layer0"
    seeded(name)
    feats, dec_ids = torch.randn(B, 8, 12), ids(5)
    replay_case(out_dir, name, "whisper", model, config_text, state,
                module=model.encoder.layers[0].self_attn, prefix="encoder.layers.0.self_attn.",
                run=lambda: model(feats, decoder_input_ids=dec_ids, use_cache=False),
                replay=lambda mod, x, kv, mask, dt: mod(x)[0])

    name = "whisper_decoder_cross_layer0"
    seeded(name)
    feats, dec_ids = torch.randn(B, 8, 12), ids(5)
    with torch.no_grad():
        enc = model.encoder(feats).last_hidden_state
    replay_case(out_dir, name, "whisper", model, config_text, state,
                module=model.decoder.layers[0].encoder_attn,
                prefix="decoder.layers.0.encoder_attn.",
                run=lambda: model(feats, decoder_input_ids=dec_ids, use_cache=False),
                replay=lambda mod, x, kv, mask, dt: mod(x, key_value_states=kv)[0],
                attention="cross", kv_from="key_value_states")
    check_kv(out_dir, name, enc)


def t5_cases(out_dir, hf_models_dir):
    model = build("t5")
    config_text, state = saved(model, os.path.join(hf_models_dir, "t5"))

    def self_replay(table_module):
        """T5 self-attention with the bias of block 0's table, computed in the replay's dtype by
        that module (a float64 copy for float64) and passed as `position_bias`; the mask goes in
        separately, as T5's stack does."""
        def replay(mod, x, kv, mask, dtype):
            table = table_module if dtype == torch.float32 else copy.deepcopy(table_module).double()
            bias = table.compute_bias(x.shape[1], x.shape[1])
            assert bias.dtype == dtype
            return mod(x, mask=mask, position_bias=bias)[0]
        return replay

    enc_table = model.encoder.block[0].layer[0].SelfAttention
    dec_table = model.decoder.block[0].layer[0].SelfAttention
    table_name = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    for block in (0, 1):
        name = f"t5_encoder_self_block{block}_padding"
        seeded(name)
        input_ids, pad, dec_ids = ids(7), lengths_mask([7, 4], 7), ids(5)
        replay_case(out_dir, name, "t5", model, config_text, state,
                    module=model.encoder.block[block].layer[0].SelfAttention,
                    prefix=f"encoder.block.{block}.layer.0.SelfAttention.",
                    run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                      use_cache=False),
                    replay=self_replay(enc_table), pad=pad,
                    extra=(table_name,) if block else ())

    name = "t5_decoder_self_block0_causal_padding"
    seeded(name)
    input_ids, pad, dec_ids, dec_pad = ids(6), lengths_mask([6, 5], 6), ids(7), lengths_mask([7, 5], 7)
    replay_case(out_dir, name, "t5", model, config_text, state, module=dec_table,
                prefix="decoder.block.0.layer.0.SelfAttention.",
                run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                  decoder_attention_mask=dec_pad, use_cache=False),
                replay=self_replay(dec_table), causal=True, pad=dec_pad)

    name = "t5_decoder_cross_block1_padding"
    seeded(name)
    input_ids, pad, dec_ids = ids(7), lengths_mask([7, 5], 7), ids(5)
    with torch.no_grad():
        enc = model.encoder(input_ids, attention_mask=pad).last_hidden_state
    replay_case(out_dir, name, "t5", model, config_text, state,
                module=model.decoder.block[1].layer[1].EncDecAttention,
                prefix="decoder.block.1.layer.1.EncDecAttention.",
                run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                  use_cache=False),
                replay=lambda mod, x, kv, mask, dt: mod(x, mask=mask, key_value_states=kv)[0],
                attention="cross", pad=pad, kv_from="key_value_states")
    check_kv(out_dir, name, enc)


# ---------------------------------------------------------------------------------------------
# RoPE families: self-attention of layer 1, causal, with position_ids


def rope_case(out_dir, family, name, lengths, position_ids, window=None, spellings=(), layer=1,
              variant=None, f32_casts=False, dot_float=False):
    """`spellings`: (suffix, config-text rewrite) for copies whose hf_config is spelled
    another way; `variant`: the FAMILIES entry to build, when not `family`'s own; `f32_casts`:
    the module casts to float32 itself (q/k RMSNorm), which the float64 replay keeps float64;
    `dot_float`: it calls `.float()` too (ERNIE 4.5's RoPE), kept float64 likewise."""
    model = build(variant or family)
    config_text, state = saved(model)
    seeded(name)
    length = position_ids.shape[1]
    input_ids = ids(length)
    pad = lengths_mask(lengths, length) if lengths else None
    attn_name = "attention" if family == "gpt_neox" else "self_attn"
    module = getattr(model.layers[layer], attn_name)
    cfg = model.config
    kind = cfg.layer_types[layer] if family in ("gemma3", "olmo3") else None
    cos64, sin64, inv64 = rope_tables(cfg, position_ids, torch.float64, kind,
                                      halves=family == "gpt_oss")
    with torch.no_grad():  # first: dynamic and longrope update inv_freq for the call
        at = (kind,) if kind else ()
        cos32, sin32 = model.rotary_emb(torch.zeros(1, dtype=torch.float32), position_ids, *at)
    inv32 = getattr(model.rotary_emb, f"{kind}_inv_freq" if kind else "inv_freq")
    assert torch.allclose(inv64.float(), inv32, rtol=1e-6, atol=0)
    assert torch.allclose(cos64.float(), cos32, rtol=0, atol=1e-5)

    def replay(mod, x, kv, mask, dtype):
        tables = (cos32, sin32) if dtype == torch.float32 else (cos64, sin64)
        if dot_float and dtype == torch.float64:
            with dot_float_keeps_float64():
                return mod(x, position_embeddings=tables, attention_mask=mask)[0]
        if f32_casts and dtype == torch.float64:
            with float32_means_float64():
                return mod(x, position_embeddings=tables, attention_mask=mask)[0]
        return mod(x, position_embeddings=tables, attention_mask=mask)[0]

    kwargs = dict(module=module, prefix=f"layers.{layer}.{attn_name}.", replay=replay,
                  window=window, position_ids=position_ids)
    decoder_case(out_dir, name, family, model, config_text, state, input_ids, pad, **kwargs)
    for suffix, rewrite in spellings:
        text = rewrite(config_text)
        # transformers 5 reads the other spelling back to the same RoPE settings.
        again = type(cfg).from_dict(json.loads(text))
        assert again.rope_parameters == cfg.rope_parameters, (again.rope_parameters,
                                                               cfg.rope_parameters)
        decoder_case(out_dir, name + suffix, family, model, text, state, input_ids, pad, **kwargs)


def dump(d):
    return json.dumps(d, indent=2, sort_keys=True) + "\n"


def llama_4x(config_text):
    """transformers 4.x spelling: `rope_theta` and `rope_scaling` instead of `rope_parameters`."""
    d = json.loads(config_text)
    rp = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rp.pop("rope_theta")
    d["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
    return dump(d)


def gpt_neox_4x(config_text):
    """transformers 4.x spelling: `rotary_pct`, `rotary_emb_base`."""
    d = json.loads(config_text)
    rp = d.pop("rope_parameters")
    assert rp["rope_type"] == "default"
    d["rotary_pct"] = rp["partial_rotary_factor"]
    d["rotary_emb_base"] = rp["rope_theta"]
    d["rope_scaling"] = None
    return dump(d)


def rope_cases(out_dir):
    # llama: GQA 4/2, llama3 scaling, gapped position_ids (as after a packed or edited prompt).
    rope_case(out_dir, "llama", "llama_self_layer1_causal_padding_gqa_llama3",
              [7, 5], torch.tensor([[0, 1, 2, 5, 6, 7, 11], [3, 4, 5, 6, 9, 10, 12]]),
              spellings=[("_rope4x", llama_4x)])
    # mistral: sliding window 3 over 7 positions.
    rope_case(out_dir, "mistral", "mistral_self_layer1_causal_padding_window3", [7, 5],
              positions(7, 0, 0), window=3)
    # qwen2: q/k/v biases; positions not starting at 0.
    rope_case(out_dir, "qwen2", "qwen2_self_layer1_causal_padding", [6, 4],
              positions(6, 2, 0))
    # gemma: MQA (one key/value head), head_dim 12 ≠ 32 / 4.
    rope_case(out_dir, "gemma", "gemma_self_layer1_causal_mqa", None,
              positions(5, 0, 0))
    # phi3: packed qkv_proj (q rows, then k, then v), 2 key/value heads.
    rope_case(out_dir, "phi3", "phi3_self_layer1_causal_padding", [6, 3],
              positions(6, 0, 0))
    # gpt_neox: query_key_value packed per head, rotary on the first half of each head.
    rope_case(out_dir, "gpt_neox", "gpt_neox_self_layer1_causal_padding_partial", [6, 5],
              positions(6, 0, 0), spellings=[("_rope4x", gpt_neox_4x)])


@contextlib.contextmanager
def float32_means_float64():
    """GPT-Neo's `_attn` casts q and k to `torch.float32` itself; for the float64 replay that
    cast must keep float64. Everything else is transformers' own code."""
    original = torch.float32
    torch.float32 = torch.float64
    try:
        yield
    finally:
        torch.float32 = original


def gpt_neo_cases(out_dir):
    model = build("gpt_neo")
    config_text, state = saved(model)
    assert [b.attn.attention_type for b in model.h] == ["global", "local"]

    def replay(mod, x, kv, mask, dtype):
        if dtype == torch.float64:
            with float32_means_float64():
                return mod(x, attention_mask=mask)[0]
        return mod(x, attention_mask=mask)[0]

    for layer, window, lengths in ((0, None, [6, 4]), (1, 3, [7, 5])):
        kind = "local" if window else "global"
        name = f"gpt_neo_self_layer{layer}_causal_padding_{kind}"
        seeded(name)
        length = max(lengths)
        input_ids, pad = ids(length), lengths_mask(lengths, length)
        decoder_case(out_dir, name, "gpt_neo", model, config_text, state, input_ids, pad,
                     module=model.h[layer].attn.attention, prefix=f"h.{layer}.attn.attention.",
                     replay=replay, window=window)


def newer_rope_cases(out_dir):
    # granite: llama's attention with the scale attention_multiplier.
    rope_case(out_dir, "granite", "granite_self_layer1_causal_padding_multiplier", [6, 4],
              positions(6, 0, 1))
    # gemma2: soft-capped scores, query_pre_attn_scalar; layer 0 slides, layer 1 does not.
    rope_case(out_dir, "gemma2", "gemma2_self_layer0_causal_padding_window3_softcap", [7, 5],
              positions(7, 0, 0), window=3, layer=0)
    rope_case(out_dir, "gemma2", "gemma2_self_layer1_causal_padding_softcap", [7, 5],
              positions(7, 0, 0))
    # starcoder2: GQA with biases on every projection, sliding window 3.
    rope_case(out_dir, "starcoder2", "starcoder2_self_layer1_causal_padding_window3", [7, 5],
              positions(7, 0, 0), window=3)


def gpt_neox_without_pct(config_text):
    """transformers 4.x spelling with no `rotary_pct` at all: transformers reads 0.25."""
    d = json.loads(gpt_neox_4x(config_text))
    assert d.pop("rotary_pct") == 0.25
    return dump(d)


def loader_semantics_cases(out_dir):
    """Config keys whose absence or edge values the loader once read differently."""
    rope_case(out_dir, "gpt_neox", "gpt_neox_self_layer1_causal_padding_default_pct", [6, 4],
              positions(6, 0, 0), variant="gpt_neox_default_pct",
              spellings=[("_nopct", gpt_neox_without_pct)])
    model = build("t5_short_distance")
    config_text, state = saved(model)
    table = model.encoder.block[0].layer[0].SelfAttention
    name = "t5_encoder_self_block0_padding_short_distance"
    seeded(name)
    input_ids, pad, dec_ids = ids(12), lengths_mask([12, 9], 12), ids(3)

    def replay(mod, x, kv, mask, dtype):
        t = table if dtype == torch.float32 else copy.deepcopy(table).double()
        return mod(x, mask=mask, position_bias=t.compute_bias(x.shape[1], x.shape[1]))[0]

    replay_case(out_dir, name, "t5", model, config_text, state, module=table,
                prefix="encoder.block.0.layer.0.SelfAttention.",
                run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                  use_cache=False),
                replay=replay, pad=pad)


def qk_norm_cases(out_dir):
    """q and k normalised before RoPE."""
    rope_case(out_dir, "qwen3", "qwen3_self_layer1_causal_padding_qknorm", [7, 5],
              positions(7, 0, 2), f32_casts=True)
    rope_case(out_dir, "olmo2", "olmo2_self_layer1_causal_padding_qknorm_whole", [7, 5],
              positions(7, 0, 0), f32_casts=True)
    rope_case(out_dir, "cohere", "cohere_self_layer1_causal_padding_interleaved_qknorm", [7, 5],
              positions(7, 0, 1), f32_casts=True)
    rope_case(out_dir, "llama", "llama_self_layer1_causal_padding_yarn", [12, 9],
              positions(12, 0, 3), variant="llama_yarn")
    rope_case(out_dir, "llama", "llama_self_layer1_causal_padding_yarn_notrunc", [12, 9],
              positions(12, 0, 3), variant="llama_yarn_notrunc")
    rope_case(out_dir, "gemma3", "gemma3_self_layer0_causal_padding_window3_qknorm", [7, 5],
              positions(7, 0, 0), window=3, layer=0, f32_casts=True)
    rope_case(out_dir, "gemma3", "gemma3_self_layer1_causal_padding_full_qknorm", [7, 5],
              positions(7, 0, 1), f32_casts=True)
    rope_case(out_dir, "gpt_oss", "gpt_oss_self_layer0_causal_padding_window3_sinks_yarn", [12, 10],
              positions(12, 0, 3), window=3, layer=0)
    rope_case(out_dir, "gpt_oss", "gpt_oss_self_layer1_causal_padding_full_sinks_yarn", [12, 10],
              positions(12, 0, 3))
    rope_case(out_dir, "stablelm", "stablelm_self_layer1_causal_padding_partial_qknorm", [7, 5],
              positions(7, 0, 0))


def alibi_cases(out_dir):
    """BLOOM: the attention module adds its residual itself; the replay gives it zeros, and
    the ALiBi tensor the model builds from the padding mask."""
    name = "bloom_self_layer1_causal_padding_alibi"
    model, config_text, state, input_ids, pad = prepared("bloom", name, [7, 5])
    heads = model.config.n_head

    def replay(mod, x, kv, mask, dtype):
        alibi = tf.models.bloom.modeling_bloom.build_alibi_tensor(pad, heads, dtype)
        assert alibi.dtype == dtype
        return mod(x, torch.zeros_like(x), alibi, mask)[0]

    decoder_case(out_dir, name, "bloom", model, config_text, state, input_ids, pad,
                 module=model.h[1].self_attention, prefix="h.1.self_attention.", replay=replay,
                 hooked_out=model.h[1].self_attention.dense)


def gptj_attn_case(out_dir, family, name):
    """GPT-J's attention (GPT-J, CodeGen) at `h.1.attn`: interleaved partial RoPE, its sin/cos
    made by the model for float32 and from `rotary_dim` in float64; the scores it casts to
    float32 are kept float64 in the float64 replay."""
    model, config_text, state, input_ids, pad = prepared(family, name, [7, 5])
    position_ids = positions(7, 0, 2)
    rd = model.config.rotary_dim
    inv64 = 1.0 / (10000.0 ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    angles = position_ids[..., None].double() * inv64
    with torch.no_grad():
        sin32, cos32 = model.rotary_emb(torch.zeros(1), position_ids)

    def replay(mod, x, kv, mask, dtype):
        if dtype == torch.float32:
            return mod(x, position_embeddings=(sin32, cos32), attention_mask=mask)[0]
        with float32_means_float64():
            return mod(x, position_embeddings=(angles.sin(), angles.cos()),
                       attention_mask=mask)[0]

    decoder_case(out_dir, name, family, model, config_text, state, input_ids, pad,
                 module=model.h[1].attn, prefix="h.1.attn.", replay=replay,
                 position_ids=position_ids)


def interleaved_cases(out_dir):
    """RoPE under names that do not say so: GPT-J (bart's) and RoFormer (bert's)."""
    gptj_attn_case(out_dir, "gptj", "gptj_self_layer1_causal_padding_interleaved_partial")

    name, length = "roformer_self_layer1_padding_interleaved", 6
    model, config_text, state, input_ids, pad = prepared("roformer", name, [6, 4])
    att = model.encoder.layer[1].attention
    dim = model.config.hidden_size // model.config.num_attention_heads
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    freqs = pos / (10000.0 ** (2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim))
    sinusoidal64 = torch.cat([freqs[:, 0::2].sin(), freqs[:, 1::2].cos()], dim=-1)[None, None]
    with torch.no_grad():
        sinusoidal32 = model.encoder.embed_positions((1, length), 0)[None, None]

    def replay_r(mod, x, kv, mask, dtype):
        sp = sinusoidal32 if dtype == torch.float32 else sinusoidal64
        return mod.output.dense(mod.self(x, attention_mask=mask, sinusoidal_pos=sp)[0])

    replay_case(out_dir, name, "roformer", model, config_text, state, module=att,
                prefix="encoder.layer.1.attention.",
                run=lambda: model(input_ids, attention_mask=pad),
                replay=replay_r, pad=pad, hooked_out=att.output.dense)


def scaled_rope_cases(out_dir):
    """CodeGen's 4-block qkv_proj; the dynamic and longrope scalings, with position_ids past
    the lengths where they switch (so that the scaling applies to the whole call)."""
    # Each sequence's first 5 positions already pass 4, so that a decode whose prefill is all
    # but the last two real tokens takes the long factors throughout, as the full forward.
    rope_case(out_dir, "phi3", "phi3_self_layer1_causal_padding_longrope", [7, 5],
              positions(7, 0, 2), variant="phi3_longrope")
    rope_case(out_dir, "llama", "llama_self_layer1_causal_padding_dynamic", [7, 5],
              positions(7, 0, 1), variant="llama_dynamic")

    gptj_attn_case(out_dir, "codegen", "codegen_self_layer1_causal_padding_interleaved_partial")


def layouts_cases(out_dir):
    """Phi's `dense`, ALBERT's shared layer, GPT-BigCode's Linear c_attn (MQA and MHA)."""
    rope_case(out_dir, "olmo", "olmo_self_layer1_causal_padding_clip_qkv", [7, 5],
              positions(7, 0, 0))
    rope_case(out_dir, "phi", "phi_self_layer1_causal_padding_partial", [7, 5],
              positions(7, 0, 1), f32_casts=True)

    name = "albert_self_layer0_padding_shared"
    model, config_text, state, input_ids, pad = prepared("albert", name, [6, 4])
    att = model.encoder.albert_layer_groups[0].albert_layers[0].attention

    def replay(mod, x, kv, mask, dtype):
        got = []
        hook = mod.dense.register_forward_hook(lambda m, a, o: got.append(o))
        try:
            mod(x, attention_mask=mask)
        finally:
            hook.remove()
        return got[0]

    replay_case(out_dir, name, "albert", model, config_text, state, module=att,
                prefix="encoder.albert_layer_groups.0.albert_layers.0.attention.",
                run=lambda: model(input_ids, attention_mask=pad),
                replay=replay, pad=pad, hooked_out=att.dense)

    for variant, name in [("gpt_bigcode", "gpt_bigcode_self_layer1_causal_padding_mqa"),
                          ("gpt_bigcode_mha", "gpt_bigcode_self_layer1_causal_padding_mha")]:
        model, config_text, state, input_ids, pad = prepared(variant, name, [7, 5])
        decoder_case(out_dir, name, "gpt_bigcode", model, config_text, state, input_ids, pad,
                     module=model.h[1].attn, prefix="h.1.attn.", replay=plain)


@contextlib.contextmanager
def float_method_keeps_float64():
    """MPT's `softmax(scores.float())`: for the float64 replay `.float()` keeps float64."""
    original = torch.Tensor.float

    def keep(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original(self, *args, **kwargs)

    torch.Tensor.float = keep
    try:
        yield
    finally:
        torch.Tensor.float = original


def falcon_mpt_cases(out_dir):
    """Falcon's `query_key_value` packings (rotary) and MPT's `Wqkv` with ALiBi."""
    position_ids = positions(7, 0, 2)
    for variant, name in [("falcon_gqa", "falcon_self_layer1_causal_padding_gqa_newarch"),
                          ("falcon_mqa", "falcon_self_layer1_causal_padding_mqa")]:
        model, config_text, state, input_ids, pad = prepared(variant, name, [7, 5])
        decoder_case(out_dir, name, "falcon", model, config_text, state, input_ids, pad,
                     module=model.h[1].self_attention, prefix="h.1.self_attention.",
                     replay=tables_replay(model, position_ids), position_ids=position_ids)

    name = "mpt_self_layer1_causal_padding_alibi6_clip_scale"
    model, config_text, state, input_ids, pad = prepared("mpt", name, [7, 5])
    cfg = model.config
    alibi = tf.models.mpt.modeling_mpt.build_mpt_alibi_tensor(cfg.n_heads, cfg.max_seq_len)

    def replay_m(mod, x, kv, mask, dtype):
        masked = mask != 0  # MPT's boolean mask: True where a key is hidden
        if dtype == torch.float64:
            with float_method_keeps_float64():
                return mod(x, position_bias=alibi.double(), attention_mask=masked)[0]
        return mod(x, position_bias=alibi, attention_mask=masked)[0]

    decoder_case(out_dir, name, "mpt", model, config_text, state, input_ids, pad,
                 module=model.blocks[1].attn, prefix="blocks.1.attn.", replay=replay_m)


@contextlib.contextmanager
def dot_float_keeps_float64():
    """DeepSeek-V2's `apply_rotary_emb` calls `.float()` on q and k; for the float64 replay that
    cast must keep float64 (with `float32_means_float64` for RMSNorm's `.to(torch.float32)`)."""
    original = torch.Tensor.float

    def keep(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original(self, *args, **kwargs)

    torch.Tensor.float = keep
    try:
        with float32_means_float64():
            yield
    finally:
        torch.Tensor.float = original


def mla_cases(out_dir):
    """DeepSeek-V2/V3 multi-head latent attention, layer 1 (dense), causal, padded. The float64
    tables: V2's complex `freqs_cis` (torch.polar of float64 angles), V3's cos/sin; both scaled
    by the rotary embedding's own `attention_scaling` (a Python float)."""
    for variant, name in [
            ("deepseek_v2", "deepseek_v2_self_layer1_causal_padding_qlora_yarn"),
            ("deepseek_v3", "deepseek_v3_self_layer1_causal_padding_interleaved"),
            ("deepseek_v3_halves", "deepseek_v3_self_layer1_causal_padding_qlora_halves")]:
        family = variant.removesuffix("_halves")
        model, config_text, state, input_ids, pad = prepared(variant, name, [7, 5])
        position_ids = positions(7, 0, 2)
        cfg = model.config
        _, _, inv64 = rope_tables(cfg, position_ids, torch.float64)
        assert torch.allclose(inv64.float(), model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
        scaling = model.rotary_emb.attention_scaling
        freqs64 = position_ids[..., None].double() * inv64
        with torch.no_grad():
            tables32 = model.rotary_emb(torch.zeros(1, dtype=torch.float32), position_ids)
        if family == "deepseek_v2":
            tables64 = torch.polar(torch.ones_like(freqs64), freqs64) * scaling
        else:
            emb = torch.cat((freqs64, freqs64), dim=-1)
            tables64 = (emb.cos() * scaling, emb.sin() * scaling)

        def replay(mod, x, kv, mask, dtype):
            if dtype == torch.float32:
                return mod(x, position_embeddings=tables32, attention_mask=mask)[0]
            with dot_float_keeps_float64():
                return mod(x, position_embeddings=tables64, attention_mask=mask)[0]

        decoder_case(out_dir, name, family, model, config_text, state, input_ids, pad,
                     module=model.layers[1].self_attn, prefix="layers.1.self_attn.",
                     replay=replay, position_ids=position_ids)


def towers_cases(out_dir):
    """CLIP's causal text tower and SigLIP's vision tower (heads from `text_config` /
    `vision_config`, the tower named by the prefix), and XGLM (`attention_heads`, causal)."""
    name = "clip_text_self_layer1_causal_padding"
    model, config_text, state, input_ids, pad = prepared("clip", name, [7, 5])
    att = model.text_model.encoder.layers[1].self_attn
    replay_case(out_dir, name, "clip", model, config_text, state, module=att,
                prefix="text_model.encoder.layers.1.self_attn.",
                run=lambda: model.text_model(input_ids, attention_mask=pad),
                replay=plain, causal=True, pad=pad)

    model = build("siglip")
    config_text, state = saved(model)
    name = "siglip_vision_self_layer0"
    seeded(name)
    pixels = torch.randn(B, 3, 8, 8)  # 2x2 patches of 4: L = 4
    replay_case(out_dir, name, "siglip", model, config_text, state,
                module=model.vision_model.encoder.layers[0].self_attn,
                prefix="vision_model.encoder.layers.0.self_attn.",
                run=lambda: model.vision_model(pixels), replay=plain)

    name = "xglm_self_layer1_causal_padding"
    model, config_text, state, input_ids, pad = prepared("xglm", name, [7, 5])

    def replay_x(mod, x, kv, mask, dtype):
        # XGLM clamps its scores with torch.full((), finfo(dtype).min), made in the default
        # dtype: float64 for the float64 replay.
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            return mod(x, attention_mask=mask)[0]
        finally:
            torch.set_default_dtype(old)

    decoder_case(out_dir, name, "xglm", model, config_text, state, input_ids, pad,
                 module=model.layers[1].self_attn, prefix="layers.1.self_attn.", replay=replay_x)


def round2_cases(out_dir):
    """transformers 5.25's llama-like families with a twist (issue 38, group 1)."""
    pos = positions(7, 0, 2)
    rope_case(out_dir, "qwen2_moe", "qwen2_moe_self_layer0_causal_padding_window3_bias", [7, 5],
              pos, window=3, layer=0)
    rope_case(out_dir, "qwen3_moe", "qwen3_moe_self_layer1_causal_padding_window3_qknorm",
              [7, 5], pos, window=3, f32_casts=True)
    rope_case(out_dir, "olmoe", "olmoe_self_layer1_causal_padding_qknorm_whole", [7, 5], pos,
              f32_casts=True)
    rope_case(out_dir, "granitemoe", "granitemoe_self_layer1_causal_padding_multiplier_bias",
              [7, 5], pos)
    rope_case(out_dir, "helium", "helium_self_layer1_causal_padding_interleaved_bias", [7, 5],
              pos)
    rope_case(out_dir, "arcee", "arcee_self_layer1_causal_padding", [7, 5], pos)
    rope_case(out_dir, "ministral", "ministral_self_layer0_causal_padding_window3", [7, 5], pos,
              window=3, layer=0)
    rope_case(out_dir, "seed_oss", "seed_oss_self_layer1_causal_padding_qkv_bias", [7, 5], pos)
    rope_case(out_dir, "ernie4_5", "ernie4_5_self_layer1_causal_padding_interleaved_bias",
              [7, 5], pos, dot_float=True)
    rope_case(out_dir, "exaone4", "exaone4_self_layer0_causal_padding_window3_qknorm", [7, 5],
              pos, window=3, layer=0, f32_casts=True)
    rope_case(out_dir, "exaone4", "exaone4_self_layer1_causal_padding_nope_qknorm", [7, 5], pos,
              f32_casts=True)
    rope_case(out_dir, "hunyuan_v1_dense", "hunyuan_v1_dense_self_layer1_causal_padding_qknorm_after_rope",
              [7, 5], pos, f32_casts=True)
    rope_case(out_dir, "olmo3", "olmo3_self_layer0_causal_padding_window3_qknorm_whole", [7, 5],
              pos, window=3, layer=0, f32_casts=True)
    rope_case(out_dir, "olmo3", "olmo3_self_layer1_causal_padding_full_qknorm_whole", [7, 5],
              pos, f32_casts=True)
    rope_case(out_dir, "cohere2", "cohere2_self_layer0_causal_padding_window3_interleaved",
              [7, 5], pos, window=3, layer=0)
    rope_case(out_dir, "cohere2", "cohere2_self_layer1_causal_padding_nope", [7, 5], pos)
    rope_case(out_dir, "smollm3", "smollm3_self_layer0_causal_padding_rope", [7, 5], pos, layer=0)
    rope_case(out_dir, "smollm3", "smollm3_self_layer1_causal_padding_nope_window3", [7, 5], pos,
              window=3)



def glm_cases(out_dir):
    """Partial rotary forms of transformers 5.25 (issue 38, group 3)."""
    pos = positions(7, 0, 2)
    rope_case(out_dir, "glm", "glm_self_layer1_causal_padding_interleaved_partial_bias",
              [7, 5], pos)
    rope_case(out_dir, "glm4", "glm4_self_layer1_causal_padding_interleaved_partial_bias",
              [7, 5], pos)
    rope_case(out_dir, "nemotron", "nemotron_self_layer1_causal_padding_partial_bias", [7, 5],
              pos)
    rope_case(out_dir, "persimmon", "persimmon_self_layer1_causal_padding_qk_layernorm_bias",
              [7, 5], pos)
    modernbert_case(out_dir, "modernbert_self_layer0_padding_global", 0)
    modernbert_case(out_dir, "modernbert_self_layer1_padding_local2", 1)


def modernbert_4x(config_text):
    """ModernBERT's 4.x spelling: θ per kind at the top level, layers by
    global_attn_every_n_layers (no layer_types)."""
    c = json.loads(config_text)
    rp = c.pop("rope_parameters")
    del c["layer_types"]
    c["global_rope_theta"] = rp["full_attention"]["rope_theta"]
    c["local_rope_theta"] = rp["sliding_attention"]["rope_theta"]
    return dump(c)


def modernbert_case(out_dir, name, layer):
    """ModernBertAttention of transformers 5.25 on a right-padded batch: bidirectional, the
    local layers banded |i - j| <= local_attention // 2 (the mask built here is checked
    against the model's own through the replay)."""
    model = build("modernbert")
    config_text, state = saved(model)
    seeded(name)
    length, lengths = 7, [7, 5]
    input_ids, pad = ids(length), lengths_mask(lengths, length)
    pos = torch.arange(length)[None, :].expand(B, length)
    cfg = model.config
    kind = cfg.layer_types[layer]
    band = cfg.local_attention // 2 if kind == "sliding_attention" else None
    cos64, sin64, _ = rope_tables(cfg, pos, torch.float64, kind)
    with torch.no_grad():
        cos32, sin32 = model.rotary_emb(torch.zeros(1), pos, kind)
    assert torch.allclose(cos64.float(), cos32, rtol=0, atol=1e-5)

    def replay(mod, x, kv, mask, dtype):
        i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
        keep = pad.bool()[:, None, None, :].expand(B, 1, length, length)
        if band is not None:
            keep = keep & ((i - j).abs() <= band)
        own = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
        tables = (cos32, sin32) if dtype == torch.float32 else (cos64, sin64)
        return mod(x, position_embeddings=tables, attention_mask=own)[0]

    kwargs = dict(module=model.layers[layer].attn, prefix=f"layers.{layer}.attn.",
                  run=lambda: model(input_ids, attention_mask=pad, position_ids=pos),
                  replay=replay, causal=False, pad=pad, position_ids=pos)
    replay_case(out_dir, name, "modernbert", model, config_text, state, **kwargs)
    again = type(cfg).from_dict(json.loads(modernbert_4x(config_text)))
    assert again.rope_parameters == cfg.rope_parameters and again.layer_types == cfg.layer_types
    replay_case(out_dir, name + "_4x", "modernbert", model, modernbert_4x(config_text), state,
                **kwargs)


def llama4_case(out_dir, name, lengths, position_ids, layer):
    """A Llama 4 text layer: its RoPE tables are complex (freqs_cis), computed here in float64;
    the float64 replay keeps its `.float()` casts float64."""
    model, config_text, state, input_ids, pad = prepared("llama4_text", name, lengths)
    assert input_ids.shape == position_ids.shape
    module = model.layers[layer].self_attn
    cfg = model.config
    with torch.no_grad():
        fc32 = model.rotary_emb(torch.zeros(1, dtype=torch.float32), position_ids)
    dim = cfg.head_dim
    theta = cfg.rope_parameters["rope_theta"]
    assert cfg.rope_parameters["rope_type"] == "default"
    inv64 = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = position_ids[..., None].double() * inv64
    fc64 = torch.polar(torch.ones_like(freqs), freqs)
    assert torch.allclose(fc64.to(torch.complex64), fc32, rtol=0, atol=1e-5)
    chunk = cfg.attention_chunk_size if cfg.layer_types[layer] == "chunked_attention" else None

    def replay(mod, x, kv, mask, dtype):
        if dtype == torch.float64:
            with dot_float_keeps_float64():
                return mod(x, position_embeddings=fc64, attention_mask=mask)[0]
        return mod(x, position_embeddings=fc32, attention_mask=mask)[0]

    decoder_case(out_dir, name, "llama4_text", model, config_text, state, input_ids, pad,
                 module=module, prefix=f"layers.{layer}.self_attn.", replay=replay,
                 position_ids=position_ids, chunk=chunk)


def llama4_cases(out_dir):
    """Llama 4's text attention (issue 38, group 2): chunked, L2-normed RoPE layer; NoPE layer
    with temperature tuning."""
    pos = positions(7, 0, 2)
    llama4_case(out_dir, "llama4_text_self_layer0_causal_padding_chunked4_qknorm", [7, 5], pos,
                layer=0)
    llama4_case(out_dir, "llama4_text_self_layer1_causal_padding_nope_temperature", [7, 5], pos,
                layer=1)


def dbrx_cases(out_dir):
    """DBRX (issue 38, group 4): MPT's Wqkv layout with RoPE, GQA and clip_qkv."""
    name = "dbrx_self_layer1_causal_padding_clip_gqa"
    model, config_text, state, input_ids, pad = prepared("dbrx", name, [7, 5])
    position_ids = positions(7, 0, 2)
    decoder_case(out_dir, name, "dbrx", model, config_text, state, input_ids, pad,
                 module=model.blocks[1].norm_attn_norm.attn, prefix="blocks.1.norm_attn_norm.attn.",
                 replay=tables_replay(model, position_ids), position_ids=position_ids)


def qwen3_next_cases(out_dir):
    """Qwen3-Next's full-attention layer (issue 38, group 4): the sigmoid output gate; its
    RMSNorms' `.float()` kept float64 in the float64 replay."""
    pos = positions(7, 0, 2)
    rope_case(out_dir, "qwen3_next", "qwen3_next_self_layer1_causal_padding_gated", [7, 5], pos,
              dot_float=True)


def bitnet_cases(out_dir):
    """BitNet's attention (issue 38, group 4): attn_sub_norm before o_proj (its `.to(float32)`
    kept float64 in the float64 replay)."""
    pos = positions(7, 0, 2)
    rope_case(out_dir, "bitnet", "bitnet_self_layer1_causal_padding_sub_norm", [7, 5], pos,
              f32_casts=True)


def jamba_cases(out_dir):
    """Jamba's attention layer (issue 38, group 4): llama's projections without positions."""
    name = "jamba_self_layer1_causal_padding_nope"
    model, config_text, state, input_ids, pad = prepared("jamba", name, [7, 5])
    decoder_case(out_dir, name, "jamba", model, config_text, state, input_ids, pad,
                 module=model.layers[1].self_attn, prefix="layers.1.self_attn.", replay=plain)


# Groups of cases, in the order written; `--only` writes some of them (files made by another
# transformers release stay as they are).
GROUPS = ["bert", "distilbert", "vit", "gpt2", "bart", "whisper", "t5", "rope", "gpt_neo",
          "newer_rope", "loader_semantics", "qk_norm", "alibi", "interleaved", "layouts",
          "falcon_mpt", "scaled_rope", "mla", "towers", "round2", "glm",
          "encoders", "llama4", "dbrx", "jamba", "qwen3_next", "bitnet"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("tests", "fixtures"))
    ap.add_argument("--only", nargs="+", choices=GROUPS, default=GROUPS)
    args = ap.parse_args()
    torch.set_num_threads(1)  # byte-identical files on every run
    os.makedirs(os.path.join(args.out, "hf"), exist_ok=True)
    hf_models = os.path.join(args.out, "hf_models")
    writers = {
        "bert": lambda: bert_cases(args.out, hf_models),
        "distilbert": lambda: distilbert_cases(args.out),
        "vit": lambda: vit_cases(args.out),
        "gpt2": lambda: gpt2_cases(args.out, hf_models),
        "bart": lambda: bart_cases(args.out),
        "whisper": lambda: whisper_cases(args.out),
        "t5": lambda: t5_cases(args.out, hf_models),
        "rope": lambda: rope_cases(args.out),
        "gpt_neo": lambda: gpt_neo_cases(args.out),
        "newer_rope": lambda: newer_rope_cases(args.out),
        "loader_semantics": lambda: loader_semantics_cases(args.out),
        "qk_norm": lambda: qk_norm_cases(args.out),
        "alibi": lambda: alibi_cases(args.out),
        "interleaved": lambda: interleaved_cases(args.out),
        "layouts": lambda: layouts_cases(args.out),
        "falcon_mpt": lambda: falcon_mpt_cases(args.out),
        "scaled_rope": lambda: scaled_rope_cases(args.out),
        "mla": lambda: mla_cases(args.out),
        "towers": lambda: towers_cases(args.out),
        "round2": lambda: round2_cases(args.out),
        "glm": lambda: glm_cases(args.out),
        "encoders": lambda: gen_hf_encoders.encoder_cases(sys.modules[__name__], args.out),
        "llama4": lambda: llama4_cases(args.out),
        "dbrx": lambda: dbrx_cases(args.out),
        "jamba": lambda: jamba_cases(args.out),
        "qwen3_next": lambda: qwen3_next_cases(args.out),
        "bitnet": lambda: bitnet_cases(args.out),
    }
    for group in GROUPS:
        if group in args.only:
            writers[group]()


if __name__ == "__main__":
    main()
