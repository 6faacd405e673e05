"""load() against transformers: the repository's Hugging Face case files (made by
tools/gen_hf_cases.py from seeded random-init models; float64 answers) through forward and
through the KV cache, a tiny llama saved by transformers' save_pretrained into a temp dir, and
the refusals."""

import numpy as np
import pytest

import wgpu_mha
from conftest import HF_FIXTURES, read_safetensors, tiny_llama_config

CASES = [
    "llama_self_layer1_causal_padding_gqa_llama3",  # GQA + RoPE (llama3 scaling) + padding
    "mistral_self_layer1_causal_padding_window3",  # sliding window
    "gpt2_self_layer1_causal_padding",  # packed c_attn
    "bert_self_layer1_padding",  # encoder
    "bart_decoder_cross_layer0_padding",  # cross-attention
    "t5_encoder_self_block1_padding",  # relative position bias
]

# transformers 5.25's llama-like families (issue 38): q/k norms before and after RoPE, NoPE
# layers, windows by each model type's own layer pattern, interleaved RoPE.
ROUND2 = [
    "qwen2_moe_self_layer0_causal_padding_window3_bias",
    "qwen3_moe_self_layer1_causal_padding_window3_qknorm",
    "olmoe_self_layer1_causal_padding_qknorm_whole",
    "granitemoe_self_layer1_causal_padding_multiplier_bias",
    "helium_self_layer1_causal_padding_interleaved_bias",
    "arcee_self_layer1_causal_padding",
    "ministral_self_layer0_causal_padding_window3",
    "seed_oss_self_layer1_causal_padding_qkv_bias",
    "ernie4_5_self_layer1_causal_padding_interleaved_bias",
    "exaone4_self_layer1_causal_padding_nope_qknorm",
    "hunyuan_v1_dense_self_layer1_causal_padding_qknorm_after_rope",
    "olmo3_self_layer1_causal_padding_full_qknorm_whole",
    "cohere2_self_layer1_causal_padding_nope",
    "smollm3_self_layer1_causal_padding_nope_window3",
    # group 3: partial rotary forms
    "glm_self_layer1_causal_padding_interleaved_partial_bias",
    "glm4_self_layer1_causal_padding_interleaved_partial_bias",
    "nemotron_self_layer1_causal_padding_partial_bias",
    "persimmon_self_layer1_causal_padding_qk_layernorm_bias",
    # Llama 4: chunked attention with its weightless q/k norm; a NoPE layer's temperature.
    "llama4_text_self_layer0_causal_padding_chunked4_qknorm",
    "llama4_text_self_layer1_causal_padding_nope_temperature",
    # DBRX: MPT's Wqkv with RoPE, GQA and clip_qkv.
    "dbrx_self_layer1_causal_padding_clip_gqa",
    # Jamba's attention layer: no positions at all.
    "jamba_self_layer1_causal_padding_nope",
    # Qwen3-Next's full-attention layer: the sigmoid output gate from q_proj.
    "qwen3_next_self_layer1_causal_padding_gated",
    # BitNet (unquantized): the attention output's RMSNorm before o_proj.
    "bitnet_self_layer1_causal_padding_sub_norm",
]
def _bound(tensors, meta):
    want = tensors["out_f64"]
    if "err_f32_vs_f64" in meta:
        return max(1e-5, 10 * float(meta["err_f32_vs_f64"]))
    return 1e-4 * (1 + np.abs(want).max())


@pytest.mark.parametrize("name", CASES)
def test_forward_matches_transformers(name):
    path = HF_FIXTURES / f"{name}.safetensors"
    t, meta = read_safetensors(path)
    module = wgpu_mha.load(path, prefix=meta["prefix"])
    assert module.is_causal == (meta["causal"] == "true")
    assert module.is_cross_attention == (meta["attention"] == "cross")
    out = module.forward(
        t["hidden_states"],
        attention_mask=t.get("attention_mask"),
        position_ids=t.get("position_ids"),
        key_value_states=t.get("key_value_states"),
    )
    assert out.shape == t["out_f64"].shape and out.dtype == np.float32
    assert np.abs(out - t["out_f64"]).max() <= _bound(t, meta)


@pytest.mark.parametrize("name", CASES[:3])
def test_kv_cache_decode_matches_the_whole_forward(name):
    path = HF_FIXTURES / f"{name}.safetensors"
    t, meta = read_safetensors(path)
    module = wgpu_mha.load(path, prefix=meta["prefix"])
    x, want = t["hidden_states"], t["out_f64"]
    mask, pos = t.get("attention_mask"), t.get("position_ids")
    b, length, _ = x.shape
    cache = module.kv_cache(b, length)
    at = 0
    while at < length:
        n = 3 if at == 0 else 1
        out = cache.step(
            x[:, at : at + n],
            attention_mask=None if mask is None else mask[:, : at + n],
            position_ids=None if pos is None else pos[:, at : at + n],
        )
        # Rows of padding (attention_mask 0) attend to nothing real; transformers' value there
        # is not a contract, the real tokens' rows are.
        real = np.ones((b, n), bool) if mask is None else mask[:, at : at + n] != 0
        err = np.abs(out - want[:, at : at + n])[real].max(initial=0.0)
        assert err <= _bound(t, meta), (at, err)
        at += n
    assert len(cache) == length
    with pytest.raises(ValueError):
        cache.step(x[:, :1])  # past capacity: the engine's KvCacheFull
    assert len(cache) == length
    cache.reset()
    assert len(cache) == 0


def test_torch_inputs_come_back_as_torch(torch):
    path = HF_FIXTURES / f"{CASES[0]}.safetensors"
    t, meta = read_safetensors(path)
    module = wgpu_mha.load(path, layer=1)
    out = module(
        torch.from_numpy(t["hidden_states"].copy()).to(torch.bfloat16),
        attention_mask=torch.from_numpy(t["attention_mask"].astype(np.int64)),
        position_ids=torch.from_numpy(t["position_ids"].copy()),
    )
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16


def test_a_tiny_llama_saved_by_transformers(torch, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaModel(tiny_llama_config(transformers)).eval()
    model.save_pretrained(tmp_path)
    module = wgpu_mha.load(tmp_path, layer=1)
    assert module.num_heads == 4 and module.num_key_value_heads == 2 and module.uses_rope
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 6, 32, generator=g)
    pos = torch.arange(6)[None].repeat(2, 1)
    attn = model.layers[1].self_attn
    with torch.no_grad():
        cos_sin = model.rotary_emb(h, pos)
        causal = torch.full((6, 6), float("-inf")).triu(1)[None, None]
        want, _ = attn(h, position_embeddings=cos_sin, attention_mask=causal)
    got = module(h, position_ids=pos)
    assert (got - want).abs().max().item() < 1e-5


def test_refusals(tmp_path):
    path = HF_FIXTURES / f"{CASES[0]}.safetensors"
    t, meta = read_safetensors(path)
    with pytest.raises(FileNotFoundError):
        wgpu_mha.load(tmp_path / "missing.safetensors")
    bogus = tmp_path / "bogus.safetensors"
    bogus.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError):
        wgpu_mha.load(bogus)
    with pytest.raises(ValueError, match="layer 7"):
        wgpu_mha.load(path, layer=7)
    with pytest.raises(ValueError):
        wgpu_mha.load(path, prefix="no.such.module.")
    module = wgpu_mha.load(path, prefix=meta["prefix"])
    x = t["hidden_states"]
    with pytest.raises(ValueError, match="key_value_states"):
        module(x, key_value_states=x)
    with pytest.raises(ValueError):
        module(x[..., :16])  # wrong hidden size: the engine's shape error
    with pytest.raises(ValueError, match="position_ids"):
        module(x, position_ids=t["position_ids"][:, :3])
    with pytest.raises(ValueError, match="attention_mask"):
        module(x, attention_mask=t["attention_mask"][None])
    with pytest.raises(TypeError):
        module(x.astype(np.int32))
    bert = wgpu_mha.load(HF_FIXTURES / f"{CASES[3]}.safetensors", layer=1)
    with pytest.raises(ValueError, match="bidirectional"):
        bert.kv_cache(2, 8)
    cross = wgpu_mha.load(HF_FIXTURES / f"{CASES[4]}.safetensors", prefix=read_safetensors(HF_FIXTURES / f"{CASES[4]}.safetensors")[1]["prefix"])
    with pytest.raises(ValueError, match="cross-attention"):
        cross.kv_cache(2, 8)
    with pytest.raises(ValueError, match="key_value_states"):
        cross(x)
    # The module still works after every refusal.
    assert module(x).shape == x.shape


# Encoders of issue 38: forward only (no causal decode).
ENCODERS = [
    "modernbert_self_layer0_padding_global",
    "modernbert_self_layer1_padding_local2",
]


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_families_load_and_forward(name):
    test_forward_matches_transformers(name)


@pytest.mark.parametrize("name", ROUND2)
def test_round2_families_load_forward_and_decode(name):
    test_forward_matches_transformers(name)
    test_kv_cache_decode_matches_the_whole_forward(name)


# issue 38's encoder long tail (transformers 5.25): BERT's copies, megatron-bert after its
# input LayerNorm, esm (rotary) after its own.
LONG_TAIL = [
    "megatron_bert_self_layer1_padding_pre_norm",
    "data2vec_text_self_layer1_padding",
    "layoutlm_self_layer1_padding",
    "esm_self_layer1_padding_pre_norm_rotary",
    "sew_self_layer1",
    "unispeech_self_layer1",
    "musicgen_decoder_self_layer1_causal_padding",
    "nllb_moe_encoder_self_layer0_padding",
    "nllb_moe_decoder_self_layer1_causal",
    "nllb_moe_decoder_cross_layer0_padding",
    "umt5_encoder_self_block1_padding",
    "umt5_decoder_self_block1_causal_padding",
    "beit_self_layer1_relative_bias",
    "data2vec_vision_self_layer1_shared_relative_bias",
    "wavlm_self_layer1_padding_gated_bias",
    "longt5_encoder_self_block1_local",
    "longt5_decoder_self_block0_causal_padding",
]


@pytest.mark.parametrize("name", LONG_TAIL)
def test_long_tail_families_load_and_forward(name):
    test_forward_matches_transformers(name)


@pytest.mark.parametrize("name", [n for n in LONG_TAIL if "causal" in n])
def test_long_tail_decoders_decode(name):
    test_kv_cache_decode_matches_the_whole_forward(name)
