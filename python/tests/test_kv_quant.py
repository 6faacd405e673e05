"""Quantized KV caches from Python: ``HfAttention.kv_cache(..., kv_dtype=)`` and
``wgpu_mha.transformers.accelerate(model, kv_dtype=)`` on seeded random-init tiny Llamas built
from configs (nothing downloaded). The quantization is the only approximation, so a q8_0 run is
checked against the f32-cache run with a loose bound; tools/kv_quant_accuracy.py measures it."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

import wgpu_mha.transformers as wt  # noqa: E402
from tiny_models import decoder_sizes  # noqa: E402

VOCAB = 96
NEW_TOKENS = 16


def _llama(head_dim=32, heads=4, kv_heads=2):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**decoder_sizes(heads * head_dim, heads, kv_heads, VOCAB, 128,
                                                   head_dim=head_dim))
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def _prompt():
    g = torch.Generator().manual_seed(1)
    return torch.randint(1, VOCAB, (1, 7), generator=g)


def _generate(model, ids):
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences, torch.stack(out.logits, 1)


def _logits(model, seq):
    with torch.no_grad():
        return model(seq).logits


def test_accelerate_q8_0_generates_close_to_the_f32_cache():
    ids = _prompt()
    f32 = _llama()
    wt.accelerate(f32)
    q8 = _llama()
    names = wt.accelerate(q8, kv_dtype="Q8_0")
    assert len(names) == 2
    assert all(q8.get_submodule(n).kv_dtype == "q8_0" for n in names)
    seq, _ = _generate(f32, ids)
    got, _ = _generate(q8, ids)
    assert got.shape == seq.shape == (1, 7 + NEW_TOKENS)
    cache = q8.model.layers[0].self_attn._cache
    assert cache.dtype == "q8_0" and len(cache) == 7 + NEW_TOKENS - 1
    # Teacher-forced on the f32 run's tokens: same positions, only the cache's rounding differs.
    want, have = _logits(f32, seq), _logits(q8, seq)
    err = (have - want).abs().max().item()
    scale = want.abs().max().item()
    assert 0 < err <= 0.05 * scale, (err, scale)  # loose: q8_0 measures ~5e-3 of it, q4_0 ~8e-2


@pytest.mark.parametrize("dtype, block_bytes", [("q8_0", 34), ("q4_0", 18), ("f32", 128)])
def test_bytes_per_token_are_the_blocks(dtype, block_bytes):
    model = _llama()  # 2 key/value heads of 32: 2·(32 + 32) values a token, 4 blocks
    wt.accelerate(model, kv_dtype=dtype)
    _generate(model, _prompt())
    cache = model.model.layers[1].self_attn._cache
    assert cache.dtype == dtype
    assert cache.bytes_per_token == 4 * block_bytes
    assert cache.nbytes()["per_token"] == 4 * block_bytes


def test_quantized_keys_round_trip_within_half_a_scale():
    """One step of 5 tokens through an f32 and a q8_0 cache of the same module: the q8_0 keys
    and values, read back dequantized, are the f32 ones within d/2 (d = amax/127 of each block
    of 32), and the outputs are close."""
    model = _llama()
    wt.accelerate(model)
    attn = model.model.layers[0].self_attn.wgpu
    x = torch.randn(1, 5, attn.hidden_size, generator=torch.Generator().manual_seed(2))
    exact, quant = attn.kv_cache(1, 8), attn.kv_cache(1, 8, kv_dtype="q8_0")
    assert exact.dtype == "f32" and quant.dtype == "q8_0"
    y, yq = exact.step(x), quant.step(x)
    for a, b in zip(exact.read_keys_values(), quant.read_keys_values()):
        assert a.shape == b.shape == (1, 2, 5, 32)
        d = np.abs(a).reshape(-1, 32).max(1, keepdims=True) / 127
        assert np.all(np.abs(a - b).reshape(-1, 32) <= d / 2 * 1.01 + 1e-6)
    assert (yq - y).abs().max().item() <= 0.02 * y.abs().max().item()


def test_bad_kv_dtype_is_refused_by_name():
    model = _llama()
    with pytest.raises(ValueError, match="q5_1"):
        wt.accelerate(model, kv_dtype="q5_1")
    assert type(model.model.layers[0].self_attn).__name__ == "LlamaAttention"  # nothing replaced
    with pytest.raises(TypeError, match="kv_dtype"):
        wt.accelerate(model, kv_dtype=8)
    wt.accelerate(model)
    attn = model.model.layers[0].self_attn.wgpu
    with pytest.raises(ValueError, match="q5_1"):
        attn.kv_cache(1, 8, kv_dtype="q5_1")
    with pytest.raises(ValueError, match="f16.*f32"):  # a float cache holds the module's own type
        attn.kv_cache(1, 8, kv_dtype="f16")


def test_head_size_not_whole_blocks_is_refused_by_name():
    model = _llama(head_dim=40, heads=2, kv_heads=1)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn.*head size.* 40 is not a multiple of 32"):
        wt.accelerate(model, kv_dtype="q8_0")
    assert type(model.model.layers[0].self_attn).__name__ == "LlamaAttention"  # nothing replaced
    assert len(wt.accelerate(model)) == 2  # its own type still fits
    seq, _ = _generate(model, _prompt())
    assert seq.shape == (1, 7 + NEW_TOKENS)
