"""Float masks with finite values as low as torch.finfo(float32).min (transformers' "masked"
value), -1e38 and -1e30 — whole rows, partial rows, beside -inf and ordinary scores — give what
torch gives (a row of them is uniform over its keys in torch's float32 softmax, never NaN), on
the decode, flash and multi-pass paths, float32 and float16; and a T5 batch row whose attention
mask is all zeros runs through the transformers backend as through eager attention."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import wgpu_mha  # noqa: E402
from wgpu_mha import _native  # noqa: E402

MIN = float(np.finfo(np.float32).min)
INF = float("inf")


def _rows(L, S, seed):
    """[L, S] float32 mask rows cycling through the kinds above."""
    g = np.random.default_rng(seed)
    kinds = [
        lambda o: np.full(S, MIN),
        lambda o: np.full(S, -1e38),
        lambda o: np.full(S, -1e30),
        lambda o: np.where(np.arange(S) % 2 == 0, MIN, o),  # partial: finfo.min beside scores
        lambda o: np.where(np.arange(S) % 3 == 1, -INF, MIN),  # uniform over the finfo.min keys
        lambda o: np.array([-2e38, -1e38, MIN] * S)[:S],  # the -1e38 keys win
        lambda o: np.where(np.arange(S) % 3 == 0, o, -1e30),
        lambda o: np.full(S, -INF),  # torch's sdpa: zeros
        lambda o: o,
        lambda o: np.full(S, -1e10),  # uniform too: f32 rounding loses the scores
    ]
    return np.stack([kinds[(i + seed) % len(kinds)](g.standard_normal(S)) for i in range(L)]).astype(np.float32)


def _mask(B, L, S):
    return torch.from_numpy(np.stack([_rows(L, S, seed=b) for b in range(B)])[:, None])


@pytest.mark.parametrize("L", [3, 12], ids=["decode", "flash"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sdpa_matches_torch(L, dtype):
    torch.manual_seed(0)
    B, H, S, E = 2, 2, 9, 8
    q, k, v = torch.randn(B, H, L, E), torch.randn(B, H, S, E), torch.randn(B, H, S, E)
    m = _mask(B, L, S)
    if dtype == torch.float16:
        # torch computes the reference from the same half values, in float32.
        q, k, v = (x.half().float() for x in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    got = wgpu_mha.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=m.to(torch.float32))
    got = got.float()
    assert torch.isfinite(got).all()
    tol = 4e-3 if dtype == torch.float16 else 1e-5
    assert (got - want).abs().max().item() <= tol


def test_multi_pass_probabilities_match_torch():
    torch.manual_seed(1)
    B, H, L, S, E = 2, 2, 6, 9, 8
    q, k, v = torch.randn(B, H, L, E), torch.randn(B, H, S, E), torch.randn(B, H, S, E)
    m = _mask(B, L, S)
    scores = q @ k.transpose(-1, -2) / E**0.5 + m
    want_p = torch.softmax(scores, -1)  # NaN on a row of -inf, as the engine's core
    out, probs = _native.sdpa(
        wgpu_mha.default_device(), q.numpy(), k.numpy(), v.numpy(), m.numpy(), False, None, True
    )
    p = torch.from_numpy(np.asarray(probs))
    assert torch.equal(torch.isnan(p), torch.isnan(want_p))
    ok = ~torch.isnan(want_p)
    assert (p[ok] - want_p[ok]).abs().max().item() <= 1e-5
    want = torch.nan_to_num(want_p, nan=0.0) @ v
    rows = ~torch.isnan(want_p).any(-1)
    got = torch.from_numpy(np.asarray(out))
    assert (got[rows] - want[rows]).abs().max().item() <= 1e-5


def test_t5_batch_row_with_no_key_matches_eager():
    transformers = pytest.importorskip("transformers", minversion="5.0")
    import wgpu_mha.transformers as wt

    wt.register()
    cfg = transformers.T5Config(
        d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=96,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
    )
    models = []
    for attn in ("eager", "wgpu_mha"):
        torch.manual_seed(0)
        models.append(transformers.AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation=attn).eval())
    eager, ours = models
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 96, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1] = 0  # batch row 1 attends to no key: finfo.min everywhere
    dec = torch.randint(3, 96, (2, 5), generator=g)
    with torch.no_grad():
        want = eager(ids, attention_mask=mask, decoder_input_ids=dec)
        got = ours(ids, attention_mask=mask, decoder_input_ids=dec)
    assert torch.isfinite(want.logits).all()
    assert torch.isfinite(got.logits).all()
    for a, b in [(got.encoder_last_hidden_state, want.encoder_last_hidden_state), (got.logits, want.logits)]:
        assert (a - b).abs().max().item() <= 1e-4
