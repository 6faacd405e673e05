"""scaled_dot_product_attention against torch's (and a float64 numpy reference without torch):
random shapes, every mask kind and broadcast, GQA, causal, scale, f16/bf16, strided inputs,
leading batch dims, and torch's refusals."""

import numpy as np
import pytest

import wgpu_mha
from conftest import reference_sdpa

TOL = 2e-5


def test_numpy_only_matches_the_float64_reference():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 4, 8), dtype=np.float32)
    k = rng.standard_normal((2, 3, 6, 8), dtype=np.float32)
    v = rng.standard_normal((2, 3, 6, 5), dtype=np.float32)
    mask = rng.random((4, 6)) > 0.3
    out = wgpu_mha.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (2, 3, 4, 5)
    np.testing.assert_allclose(out, reference_sdpa(q, k, v, mask), atol=TOL)
    # f64 in, f64 out (computed in f32).
    out64 = wgpu_mha.scaled_dot_product_attention(q.astype(np.float64), k, v)
    assert out64.dtype == np.float64


def _rand(torch, g, *shape, dtype=None):
    return torch.randn(*shape, generator=g, dtype=dtype or torch.float32)


def _as_torch(torch, q, k, v, **kw):
    """The engine's answer, checked against torch's on the same arguments: the same shape, and
    within TOL."""
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    got = wgpu_mha.scaled_dot_product_attention(q, k, v, **kw)
    what = (tuple(q.shape), tuple(k.shape), tuple(v.shape), sorted(kw))
    assert got.shape == want.shape, what
    assert (got - want).abs().max().item() < TOL, what
    return got


@pytest.mark.parametrize("seed", range(6))
def test_random_shapes_against_torch(torch, seed):
    g = torch.Generator().manual_seed(seed)
    r = np.random.default_rng(seed)
    b, h, lq, lk, e, ev = (int(x) for x in r.integers(1, [3, 4, 9, 11, 17, 13]))
    q, k, v = _rand(torch, g, b, h, lq, e), _rand(torch, g, b, h, lk, e), _rand(torch, g, b, h, lk, ev)
    scale = None if seed % 2 else float(r.uniform(0.05, 1.0))
    causal = seed % 3 == 0
    assert isinstance(_as_torch(torch, q, k, v, is_causal=causal, scale=scale), torch.Tensor)


MASK_SHAPES = [(5, 7), (1, 7), (3, 1, 7), (3, 5, 7), (2, 3, 5, 7), (2, 1, 5, 7), (1, 3, 1, 1), (2, 1, 1, 7)]


@pytest.mark.parametrize("shape", MASK_SHAPES)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_broadcast_as_torch(torch, shape, kind):
    F = torch.nn.functional
    g = torch.Generator().manual_seed(len(shape))
    q, k, v = _rand(torch, g, 2, 3, 5, 8), _rand(torch, g, 2, 3, 7, 8), _rand(torch, g, 2, 3, 7, 4)
    if kind == "bool":
        mask = torch.rand(*shape, generator=g) > 0.4
    else:
        mask = _rand(torch, g, *shape)
        mask[torch.rand(*shape, generator=g) > 0.7] = float("-inf")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = wgpu_mha.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.nan_to_num(got - want).abs().max().item() < TOL


def test_wholly_masked_rows_are_zero_as_in_torch(torch):
    g = torch.Generator().manual_seed(1)
    q, k, v = _rand(torch, g, 1, 2, 4, 8), _rand(torch, g, 1, 2, 6, 8), _rand(torch, g, 1, 2, 6, 8)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    bias = torch.zeros(4, 6)
    bias[1] = float("-inf")
    for m in (mask, bias):
        _as_torch(torch, q, k, v, attn_mask=m)


@pytest.mark.parametrize("hq,hkv", [(4, 2), (6, 1), (4, 4), (8, 2)])
def test_gqa(torch, hq, hkv):
    g = torch.Generator().manual_seed(hq * 10 + hkv)
    q, k, v = _rand(torch, g, 2, hq, 3, 8), _rand(torch, g, 2, hkv, 6, 8), _rand(torch, g, 2, hkv, 6, 8)
    mask = torch.rand(2, 1, 3, 6, generator=g) > 0.3
    _as_torch(torch, q, k, v, attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("lq,lk", [(3, 7), (7, 3), (5, 5), (1, 6)])
def test_causal_is_top_left(torch, lq, lk):
    g = torch.Generator().manual_seed(lq + lk)
    q, k, v = _rand(torch, g, 2, 2, lq, 8), _rand(torch, g, 2, 2, lk, 8), _rand(torch, g, 2, 2, lk, 8)
    _as_torch(torch, q, k, v, is_causal=True)


def test_leading_dims_ranks_and_broadcasting(torch):
    g = torch.Generator().manual_seed(7)
    cases = [
        ((5, 8), (6, 8), (6, 3)),  # unbatched rank 2
        ((2, 5, 8), (2, 6, 8), (2, 6, 3)),  # (N, L, E)
        ((2, 3, 4, 5, 8), (1, 3, 4, 6, 8), (1, 3, 4, 6, 8)),  # rank 5, broadcast batch
        ((2, 4, 5, 8), (2, 1, 6, 8), (2, 1, 6, 8)),  # one key/value head broadcast
        ((3, 5, 8), (6, 8), (6, 8)),  # key without the batch dim
    ]
    for qs, ks, vs in cases:
        _as_torch(torch, _rand(torch, g, *qs), _rand(torch, g, *ks), _rand(torch, g, *vs))


def test_empty_sizes_as_torch(torch):
    F = torch.nn.functional
    for qs, ks, vs in [
        ((1, 1, 0, 8), (1, 1, 5, 8), (1, 1, 5, 8)),  # no queries
        ((1, 1, 3, 8), (1, 1, 0, 8), (1, 1, 0, 4)),  # no keys: zeros
        ((0, 2, 3, 8), (0, 2, 5, 8), (0, 2, 5, 8)),  # no batch
        ((1, 2, 3, 0), (1, 2, 5, 0), (1, 2, 5, 4)),  # E = 0: uniform weights
        ((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 0)),  # Ev = 0
    ]:
        q, k, v = (torch.randn(*s) for s in (qs, ks, vs))
        want = F.scaled_dot_product_attention(q, k, v, scale=None if qs[-1] else 1.0)
        got = wgpu_mha.scaled_dot_product_attention(q, k, v, scale=None if qs[-1] else 1.0)
        assert got.shape == want.shape, qs
        assert want.numel() == 0 or (got - want).abs().max().item() < TOL, qs


def test_strided_inputs(torch):
    g = torch.Generator().manual_seed(3)
    # [B, L, H, D] transposed to [B, H, L, D]: not contiguous, as projections hand them over.
    q = _rand(torch, g, 2, 5, 3, 8).transpose(1, 2)
    k = _rand(torch, g, 2, 7, 3, 8).transpose(1, 2)
    v = _rand(torch, g, 2, 7, 3, 8)[..., ::2].transpose(1, 2)
    assert not q.is_contiguous()
    _as_torch(torch, q, k, v, is_causal=True)


def test_half_and_bfloat16(torch):
    F = torch.nn.functional
    g = torch.Generator().manual_seed(4)
    q, k, v = _rand(torch, g, 2, 4, 5, 16), _rand(torch, g, 2, 2, 9, 16), _rand(torch, g, 2, 2, 9, 16)
    mask = torch.rand(5, 9, generator=g) > 0.3
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1e-2)):
        qh, kh, vh = q.to(dtype), k.to(dtype), v.to(dtype)
        want = F.scaled_dot_product_attention(qh.float(), kh.float(), vh.float(), attn_mask=mask, enable_gqa=True)
        got = wgpu_mha.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
        assert got.dtype == dtype
        assert (got.float() - want).abs().max().item() < tol
    # numpy float16 in, float16 out.
    out = wgpu_mha.scaled_dot_product_attention(q.half().numpy(), k.half().numpy(), v.half().numpy(), enable_gqa=True)
    assert out.dtype == np.float16


def test_refusals_as_torch(torch):
    g = torch.Generator().manual_seed(5)
    q, k, v = _rand(torch, g, 1, 4, 3, 8), _rand(torch, g, 1, 2, 5, 8), _rand(torch, g, 1, 2, 5, 8)
    sdpa = wgpu_mha.scaled_dot_product_attention
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="is_causal"):
        sdpa(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q, k, v)  # 4 query heads, 2 key/value heads
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(_rand(torch, g, 1, 3, 3, 8), k, v, enable_gqa=True)  # 2 does not divide 3
    with pytest.raises(TypeError, match="same dtype"):
        sdpa(q.half(), q, q)
    with pytest.raises(TypeError):
        sdpa(q.to(torch.int32), q, q)
    with pytest.raises(TypeError):
        sdpa(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="broadcast"):
        sdpa(q, q, q, attn_mask=torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="2 dims"):
        sdpa(q, q, q, attn_mask=torch.ones(3, dtype=torch.bool))  # torch refuses rank 1 too
    with pytest.raises(ValueError):
        sdpa(q, k[..., :4], v)  # E differs
    with pytest.raises(ValueError):
        sdpa(q, q, v)  # S differs
    with pytest.raises(ValueError):
        sdpa(torch.ones(8), torch.ones(8), torch.ones(8))
    # Nothing above broke the device.
    assert sdpa(q, q, q).shape == q.shape


def _core_reference(q, k, v, *, window=None, bottom_right=False, softcap=None, sinks=None):
    """float64 causal attention with the extension's extra options, written out."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = np.einsum("bhld,bhsd->bhls", q, k) / np.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    L, S = s.shape[-2:]
    i = np.arange(L)[:, None] + (S - L if bottom_right else 0)
    j = np.arange(S)[None, :]
    keep = j <= i
    if window is not None:
        keep &= j > i - window
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    if sinks is not None:
        sink = np.asarray(sinks, np.float64)[None, :, None, None]
        m = np.maximum(m, sink)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True) + (np.exp(sink - m) if sinks is not None else 0.0)
    return (e / den) @ v


def test_native_core_options_for_transformers_backends():
    """The options part B's transformers backend passes straight to the core: a sliding window,
    bottom-right alignment, soft-capping and sinks (transformers' s_aux)."""
    from wgpu_mha import _native

    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 4, 3, 8), dtype=np.float32)
    k = rng.standard_normal((2, 4, 7, 8), dtype=np.float32) * 3
    v = rng.standard_normal((2, 4, 7, 8), dtype=np.float32)
    dev = wgpu_mha.default_device()
    sinks = rng.standard_normal(4).astype(np.float32)
    for kw in (
        dict(bottom_right=True),
        dict(bottom_right=True, window=3),
        dict(window=2),
        dict(softcap=2.0, bottom_right=True),
        dict(sinks=sinks, bottom_right=True),
    ):
        out, _ = _native.sdpa(dev, q, k, v, None, True, **kw)
        np.testing.assert_allclose(out, _core_reference(q, k, v, **kw), atol=TOL, err_msg=str(kw))
    with pytest.raises(ValueError, match="window"):
        _native.sdpa(dev, q, k, v, None, False, window=2)
    with pytest.raises(ValueError):
        _native.sdpa(dev, q, k, v, None, True, sinks=sinks[:3])  # one sink per query head
