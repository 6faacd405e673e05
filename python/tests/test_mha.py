"""MultiheadAttention.from_torch against nn.MultiheadAttention itself: both batch layouts,
unbatched inputs, biases, bias_k/bias_v, add_zero_attn, kdim/vdim, every mask polarity,
weights averaged or per head, f16 inputs to an f16 module, and torch's refusals."""

import copy
import itertools

import numpy as np
import pytest

import wgpu_mha

TOL = 2e-5

CONFIGS = [
    dict(bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=True),
    dict(bias=False, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=False),
    dict(bias=True, add_bias_kv=True, add_zero_attn=False, kdim=None, vdim=None, batch_first=True),
    dict(bias=True, add_bias_kv=True, add_zero_attn=True, kdim=8, vdim=12, batch_first=False),
    dict(bias=True, add_bias_kv=False, add_zero_attn=True, kdim=6, vdim=10, batch_first=True),
]


def _module(torch, seed, **cfg):
    torch.manual_seed(seed)
    return torch.nn.MultiheadAttention(16, 4, **cfg).eval()


def _inputs(torch, m, n, lq, lk, g):
    def make(length, width):
        shape = (n, length, width) if m.batch_first else (length, n, width)
        return torch.randn(*shape, generator=g)

    return make(lq, 16), make(lk, m.kdim), make(lk, m.vdim)


def _close(got, want):
    assert got.shape == want.shape
    assert torch_equal_nan(got, want)
    return float(np.nan_to_num((got.float() - want.float()).abs().max().item()))


def torch_equal_nan(a, b):
    import torch

    return torch.equal(torch.isnan(a), torch.isnan(b))


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_against_nn_multihead_attention(torch, ci):
    cfg = CONFIGS[ci]
    m = _module(torch, ci, **cfg)
    ours = wgpu_mha.MultiheadAttention.from_torch(m)
    g = torch.Generator().manual_seed(100 + ci)
    n, lq, lk = 2, 5, 7
    q, k, v = _inputs(torch, m, n, lq, lk, g)
    masks = {
        "none": {},
        "bool attn (True = not allowed)": dict(attn_mask=torch.rand(lq, lk, generator=g) > 0.6),
        "float attn 3-D": dict(attn_mask=torch.randn(n * 4, lq, lk, generator=g)),
        "bool padding (True = ignored)": dict(key_padding_mask=torch.tensor([[False] * 5 + [True] * 2, [False] * 7])),
        "float padding + bool attn": dict(
            key_padding_mask=torch.randn(n, lk, generator=g),
            attn_mask=torch.triu(torch.ones(lq, lk, dtype=torch.bool), 1),
        ),
        "causal hint": dict(attn_mask=torch.triu(torch.ones(lq, lk, dtype=torch.bool), 1), is_causal=True),
    }
    for (name, kw), average in itertools.product(masks.items(), (True, False)):
        with torch.no_grad():
            want, want_w = m(q, k, v, average_attn_weights=average, **kw)
        got, got_w = ours(q, k, v, average_attn_weights=average, **kw)
        assert isinstance(got, torch.Tensor)
        assert _close(got, want) < TOL, name
        assert _close(got_w, want_w) < TOL, name
    # need_weights=False: no weights.
    with torch.no_grad():
        want, _ = m(q, k, v, need_weights=False)
    got, w = ours(q, k, v, need_weights=False)
    assert w is None and _close(got, want) < TOL


def test_unbatched_and_numpy_and_f16(torch):
    m = _module(torch, 9, batch_first=True, add_bias_kv=True)
    ours = wgpu_mha.MultiheadAttention.from_torch(m)
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(4, 16, generator=g), torch.randn(6, 16, generator=g)
    kpm = torch.tensor([False, False, True, False, False, True])
    with torch.no_grad():
        want, want_w = m(q, k, k, key_padding_mask=kpm)
    got, got_w = ours(q, k, k, key_padding_mask=kpm)
    assert _close(got, want) < TOL and _close(got_w, want_w) < TOL
    out, w = ours(q.numpy(), k.numpy(), k.numpy(), key_padding_mask=kpm.numpy())
    assert isinstance(out, np.ndarray) and np.abs(out - want.numpy()).max() < TOL
    # float16 inputs take a float16 module (torch's rule: the inputs' dtype is the weights').
    m16 = copy.deepcopy(m).half()
    out16, w16 = wgpu_mha.MultiheadAttention.from_torch(m16)(q.half(), k.half(), k.half())
    assert out16.dtype == torch.float16 and w16.dtype == torch.float16
    with torch.no_grad():
        want16, _ = m16.float()(q.half().float(), k.half().float(), k.half().float())
    assert (out16.float() - want16).abs().max().item() < 2e-3


def test_refusals(torch):
    m = _module(torch, 1, batch_first=True)
    ours = wgpu_mha.MultiheadAttention.from_torch(m)
    x = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match="is_causal"):
        ours(x, x, x, is_causal=True)
    with pytest.raises(ValueError, match="2D attn_mask"):
        ours(x, x, x, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask"):
        ours(x, x, x, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError):
        ours(torch.randn(2, 3, 8), x, x)  # wrong embedding width: the engine's message
    with pytest.raises(TypeError):
        wgpu_mha.MultiheadAttention.from_torch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="eval"):
        wgpu_mha.MultiheadAttention.from_torch(torch.nn.MultiheadAttention(16, 4, dropout=0.1))
