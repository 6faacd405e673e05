"""Where a PyTorch user meets the edges (issue 42): autograd (gradients against torch's own and
torch.autograd.gradcheck), MultiheadAttention's rows that see no key against torch's ordinary
path, and the argument rules torch applies (types, dtypes, sizes, backends, meta tensors)."""

import math

import numpy as np
import pytest

import wgpu_mha
from wgpu_mha import _autograd
from conftest import HF_FIXTURES, read_safetensors

torch = pytest.importorskip("torch")
F = torch.nn.functional

# ---------------------------------------------------------------------------------------------
# 1. Autograd


def _math(q, k, v, mask=None, causal=False, scale=None, gqa=False, window=None, softcap=None, sinks=None,
          probs=False):
    """Attention written out in torch (differentiable by torch's autograd): torch's rules, plus
    the transformers backend's softcap, window and sinks. Rows that see no key give zeros."""
    if gqa and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    L, S = s.shape[-2:]
    keep = torch.ones(L, S, dtype=torch.bool)
    if causal:
        keep = keep.tril()
        if window is not None:
            keep = keep & ~torch.ones(L, S, dtype=torch.bool).tril(-window)
    if mask is not None and mask.dtype == torch.bool:
        keep = keep & mask
    elif mask is not None:
        s = s + mask
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(-1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    return (p @ v, p) if probs else p @ v


def _leaves(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


SDPA_CASES = {
    "plain": dict(shapes=[(2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)]),
    "causal+scale": dict(shapes=[(1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 4)], kw=dict(is_causal=True, scale=0.3)),
    "gqa": dict(shapes=[(2, 4, 3, 8), (2, 2, 6, 8), (2, 2, 6, 8)], kw=dict(enable_gqa=True)),
    "bool mask, a dead row": dict(shapes=[(2, 2, 4, 8), (2, 2, 5, 8), (2, 2, 5, 8)], mask="bool"),
    "float mask needing grad, broadcast": dict(shapes=[(2, 2, 4, 8), (2, 2, 5, 8), (2, 2, 5, 8)], mask="float"),
    "broadcast leading dims": dict(shapes=[(2, 3, 4, 8), (3, 5, 8), (1, 3, 5, 8)]),
}


@pytest.mark.parametrize("name", SDPA_CASES)
def test_sdpa_gradients_equal_torchs(name):
    case = SDPA_CASES[name]
    q, k, v = _leaves(*case["shapes"], seed=len(name))
    kw = dict(case.get("kw", {}))
    g = torch.Generator().manual_seed(7)
    mask = None
    if case.get("mask") == "bool":
        mask = torch.rand(4, 5, generator=g) > 0.4
        mask[1] = False  # a query row that sees no key: zeros, and no gradient, in both
    elif case.get("mask") == "float":
        mask = torch.randn(2, 1, 4, 5, generator=g).requires_grad_()
    got = wgpu_mha.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    assert got.grad_fn is not None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    assert (got - want).abs().max().item() < 2e-5
    d_out = torch.randn(want.shape, generator=g)
    inputs = [q, k, v] + ([mask] if mask is not None and mask.requires_grad else [])
    got_grads = torch.autograd.grad(got, inputs, d_out)
    want_grads = torch.autograd.grad(want, inputs, d_out)
    for what, a, b in zip("qkvm", got_grads, want_grads):
        assert a.shape == b.shape and a.dtype == b.dtype, what
        assert (a - b).abs().max().item() < 1e-5, what


def _exact_engine(**kw):
    """The forward in float64 torch (what the engine approximates in float32), so that
    gradcheck's finite differences test the backward formula to float64 precision."""

    def engine(q, k, v, mask, sinks):
        return _math(q, k, v, mask, sinks=sinks, **kw), None

    return engine


GRADCHECK_CASES = {
    "float mask, causal-free, GQA": (dict(gqa=True), dict(mask=True)),
    "causal, scale": (dict(causal=True, scale=0.7), {}),
    "window, softcap, sinks, GQA": (dict(causal=True, window=2, softcap=2.0, gqa=True), dict(sinks=True)),
    "bool mask with a dead row": (dict(), dict(bool_mask=True)),
}


@pytest.mark.parametrize("name", GRADCHECK_CASES)
def test_backward_formula_passes_gradcheck_in_float64(name):
    spec_kw, extra = GRADCHECK_CASES[name]
    hq, hk = (4, 2) if spec_kw.get("gqa") else (2, 2)
    q, k, v = _leaves((1, hq, 3, 4), (1, hk, 4, 4), (1, hk, 4, 3), dtype=torch.float64, seed=3)
    mask = sinks = None
    if extra.get("mask"):
        mask = torch.randn(1, 1, 3, 4, dtype=torch.float64).requires_grad_()
    if extra.get("bool_mask"):
        mask = torch.tensor([[True, False, True, True], [False] * 4, [True] * 4])
    if extra.get("sinks"):
        sinks = torch.randn(hq, dtype=torch.float64).requires_grad_()
    spec = _autograd.Spec(**spec_kw)
    engine = _exact_engine(**spec_kw)

    def f(q, k, v, mask, sinks):
        return _autograd.attention(engine, spec, q, k, v, mask, sinks)

    args = (q, k, v, mask, sinks)
    assert torch.autograd.gradcheck(f, args)
    if name == "window, softcap, sinks, GQA":
        # The backward is torch operations, so it has a backward too (double backward).
        small = (q[:, :, :2, :2], k[:, :, :3, :2], v[:, :, :3, :1], None, sinks)
        small = tuple(None if t is None else t.detach().clone().requires_grad_() for t in small)
        assert torch.autograd.gradgradcheck(f, small)


def test_the_engine_path_passes_a_float32_gradcheck():
    """gradcheck of the real entry point: float64 inputs are computed in float32 by the engine,
    so the finite differences are taken with eps=1e-3 and compared at float32's precision."""
    q, k, v = _leaves((1, 2, 3, 4), (1, 2, 4, 4), (1, 2, 4, 4), dtype=torch.float64, seed=5)
    mask = torch.randn(3, 4, dtype=torch.float64).requires_grad_()

    def f(q, k, v, mask):
        return wgpu_mha.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    assert torch.autograd.gradcheck(f, (q, k, v, mask), eps=1e-3, atol=1e-3, rtol=1e-2)


def test_transformers_backend_gradients():
    """attention_forward (register()'s backend) is differentiable through q, k, v, a float
    mask / T5 position bias, and gpt-oss sinks, with softcap and sliding window, its output
    [B, L, H, D] and its weights."""
    from wgpu_mha.transformers import attention_forward

    class Module:
        is_causal = True

    q, k, v = _leaves((1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8), seed=11)

    def ref(**kw):
        return _math(q, k, v, scale=0.5, gqa=True, **kw)

    sinks, bias = _leaves((4,), (1, 4, 5, 5), seed=12)
    g = torch.Generator().manual_seed(13)
    d_out = torch.randn(1, 5, 4, 8, generator=g)
    dead_mask = torch.rand(1, 1, 5, 5, generator=g) > 0.3
    dead_mask[..., 2, :] = False
    dead = ~dead_mask.any(-1, keepdim=True)
    cases = [
        (dict(sliding_window=2, softcap=3.0, s_aux=sinks), lambda: ref(causal=True, window=2, softcap=3.0, sinks=sinks)),
        (dict(position_bias=bias, is_causal=False), lambda: ref(mask=bias)),
        # A row whose boolean mask hides every key is the engine's mean of V (eager's finfo.min
        # mask gives it too), a constant in q and k.
        (
            dict(attention_mask=dead_mask),
            lambda: ref(mask=dead_mask) + dead * v.repeat_interleave(2, -3).mean(-2, keepdim=True),
        ),
    ]
    for kw, reference in cases:
        kw = dict(attention_mask=None, **kw) if "attention_mask" not in kw else kw
        got, _ = attention_forward(Module(), q, k, v, scaling=0.5, **kw)
        want = reference().transpose(1, 2)
        assert (got - want).abs().max().item() < 1e-5
        leaves = [q, k, v] + [kw[n] for n in ("s_aux", "position_bias") if n in kw]
        for a, b in zip(torch.autograd.grad(got, leaves, d_out), torch.autograd.grad(want, leaves, d_out)):
            assert (a - b).abs().max().item() < 1e-5
    # The weights are an output too: their gradient joins the output's.
    out, w = attention_forward(Module(), q, k, v, None, output_attentions=True)
    want, want_w = _math(q, k, v, causal=True, gqa=True, probs=True)
    assert (w - want_w).abs().max().item() < 1e-5
    got = torch.autograd.grad((out * d_out).sum() + (w * w).sum(), [q, k, v])
    expected = torch.autograd.grad((want.transpose(1, 2) * d_out).sum() + (want_w * want_w).sum(), [q, k, v])
    for a, b in zip(got, expected):
        assert (a - b).abs().max().item() < 1e-5


def test_modules_without_a_backward_refuse_inputs_requiring_grad():
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ours = wgpu_mha.MultiheadAttention.from_torch(m)
    x = torch.randn(1, 3, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"requires_grad.*torch\.no_grad\(\).*\.detach\(\)"):
        ours(x, x, x)
    with torch.no_grad():
        assert ours(x, x, x)[0].grad_fn is None
    assert ours(x.detach(), x.detach(), x.detach())[0].shape == (1, 3, 8)

    path = HF_FIXTURES / "gpt2_self_layer1_causal_padding.safetensors"
    t, meta = read_safetensors(path)
    attn = wgpu_mha.load(path, prefix=meta["prefix"])
    h = torch.from_numpy(t["hidden_states"].astype(np.float32)).requires_grad_()
    with pytest.raises(RuntimeError, match="requires_grad"):
        attn(h)
    cache = attn.kv_cache(h.shape[0], 8)
    with pytest.raises(RuntimeError, match="requires_grad"):
        cache.step(h[:, :1])
    assert len(cache) == 0
    with torch.no_grad():
        assert attn(h).shape == h.shape and cache.step(h[:, :1]).shape == h[:, :1].shape
    # numpy inputs with a query requiring grad elsewhere: no silent detach either.
    with pytest.raises(RuntimeError, match="torch tensors"):
        wgpu_mha.scaled_dot_product_attention(x.detach().numpy()[None], x[None], x[None])


# ---------------------------------------------------------------------------------------------
# 2. MultiheadAttention rows that see no key


def test_mha_rows_that_see_no_key_follow_torchs_ordinary_path():
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    with torch.no_grad():
        m.out_proj.bias.normal_()  # torch initialises it to zeros: make "0 + bias" visible
        m.in_proj_bias.normal_()
    ours = wgpu_mha.MultiheadAttention.from_torch(m)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 8, generator=g, dtype=torch.float64) for _ in range(3))
    kpm = torch.tensor([[True, True, True], [False, True, False]])  # batch 0 sees nothing
    per_head = torch.zeros(2 * 2, 3, 3, dtype=torch.bool)
    per_head[1, 2] = True  # batch 0, head 1, query 2: no key; head 0 sees them
    per_head[2, 0] = True  # batch 1, head 0, query 0
    row = torch.zeros(3, 3, dtype=torch.bool)
    row[1] = True  # query 1 sees no key in any head
    masks = [dict(key_padding_mask=kpm), dict(attn_mask=per_head), dict(attn_mask=row),
             dict(attn_mask=per_head, key_padding_mask=kpm)]
    saved = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the ordinary path (not the fused kernel's NaN)
    try:
        for kw in masks:
            for need_weights in (False, True):
                with torch.no_grad():
                    want, want_w = m(q, k, v, need_weights=need_weights, **kw)
                got, got_w = ours(q, k, v, need_weights=need_weights, **kw)
                assert torch.equal(torch.isnan(got), torch.isnan(want)), (kw, need_weights)
                assert (got - want).nan_to_num().abs().max().item() < 2e-5, (kw, need_weights)
                if need_weights:
                    assert torch.equal(torch.isnan(got_w), torch.isnan(want_w))
        # The rule stated: need_weights=False, a row no head lets see a key is out_proj.bias.
        got, _ = ours(q, k, v, need_weights=False, key_padding_mask=kpm)
        assert (got[0] - m.out_proj.bias).abs().max().item() < 1e-6
    finally:
        torch.backends.mha.set_fastpath_enabled(saved)


# ---------------------------------------------------------------------------------------------
# 3. Argument rules


def test_argument_rules_as_torchs(tmp_path):
    q = torch.randn(1, 2, 3, 4)
    for arg in ("is_causal", "enable_gqa"):
        with pytest.raises(TypeError, match=f"'{arg}' must be bool, not str"):
            F.scaled_dot_product_attention(q, q, q, **{arg: "yes"})
        with pytest.raises(TypeError, match=f"'{arg}' must be bool, not str"):
            wgpu_mha.scaled_dot_product_attention(q, q, q, **{arg: "yes"})
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be finite"):
            wgpu_mha.scaled_dot_product_attention(q, q, q, scale=bad)
    # k and v with different head counts under GQA: refused (torch accepts them).
    with pytest.raises(ValueError, match="enable_gqa.*same number of heads"):
        wgpu_mha.scaled_dot_product_attention(
            torch.randn(1, 4, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4), enable_gqa=True
        )

    m = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ours = wgpu_mha.MultiheadAttention.from_torch(m)
    x = torch.randn(1, 3, 8)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        y = x.to(dtype)
        with pytest.raises(RuntimeError, match="same dtype") as theirs, torch.no_grad():
            m(y, y, y)
        with pytest.raises(type(theirs.value), match=f"query has dtype {dtype}.*same dtype"):
            ours(y, y, y)

    with pytest.raises(ValueError) as device_error:
        wgpu_mha.Device(backend="nonsense")
    with pytest.raises(ValueError) as adapters_error:
        wgpu_mha.adapters("nonsense")
    assert str(adapters_error.value) == str(device_error.value) and "nonsense" in str(device_error.value)

    meta = torch.empty(1, 2, 3, 4, device="meta")
    with pytest.raises(ValueError, match="query is a meta tensor"):
        wgpu_mha.scaled_dot_product_attention(meta, q, q)
    with pytest.raises(ValueError, match="key is a meta tensor"):
        ours(x, torch.empty(1, 3, 8, device="meta"), x)

    path = HF_FIXTURES / "gpt2_self_layer1_causal_padding.safetensors"
    attn = wgpu_mha.load(path, prefix=read_safetensors(path)[1]["prefix"])
    with pytest.raises(ValueError, match="capacity must be >= 0, got -1"):
        attn.kv_cache(1, -1)
    with pytest.raises(ValueError, match="batch must be >= 0, got -2"):
        attn.kv_cache(-2, 4)
    with pytest.raises(TypeError, match="capacity must be an integer"):
        attn.kv_cache(1, 2.5)
    with pytest.raises(ValueError, match="layer must be >= 0, got -1"):
        wgpu_mha.load(path, layer=-1)
