"""Autograd for the attention core: a ``torch.autograd.Function`` whose forward is the engine's
and whose backward is torch's math on the saved inputs, and the refusal the modules without a
backward give. torch is imported only by callers that already hold a torch tensor.

The backward recomputes the probabilities ``P`` (float64 where the tensors' device has it) from
q, k, the mask, scale, causal/window rule, softcap and sinks, then

    dV = Pᵀ·dO,  dP = dO·Vᵀ (+ the weights' gradient),  dS = P ⊙ (dP − rowsum(P ⊙ dP)),
    dQ = dS'·K·scale,  dK = dS'ᵀ·Q·scale   (dS' = dS ⊙ (1 − tanh²) under a softcap),

a float mask's gradient is dS and a sink's −Σ P_sink·rowsum(P ⊙ dP), each summed back to its
input's (broadcast) shape; under GQA, K/V's gradients sum over each head group. Every step is a
torch operation, so the backward is itself differentiable (double backward)."""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, NamedTuple, Optional


class Spec(NamedTuple):
    """What the forward computed, besides its tensors."""

    causal: bool = False  # query i sees keys j <= i (top-left)
    scale: Optional[float] = None  # default 1/sqrt(E)
    gqa: bool = False  # Hkv divides Hq: query head h reads key/value head h // (Hq / Hkv)
    window: Optional[int] = None  # with causal: and j > i - window
    softcap: Optional[float] = None  # scores s -> c·tanh(s/c) before the mask
    # A row whose boolean mask hides every key: "zero" (torch's sdpa: zeros) or "mean" (the
    # engine's own answer, eager transformers' too: the mean of V, with no sinks).
    dead: str = "zero"


def needs_grad(*xs: Any) -> bool:
    """Grad mode is on and one of ``xs`` is a torch tensor requiring grad."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return False
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def refuse_grad(what: str, **inputs: Any) -> None:
    """RuntimeError when ``what`` (an entry point without a backward) would return an output
    detached from inputs that require grad."""
    if not needs_grad(*inputs.values()):
        return
    names = ", ".join(n for n, x in inputs.items() if needs_grad(x))
    raise RuntimeError(
        f"{what} has no backward, and {names} requires_grad (grad mode is on): its output would be "
        "detached from the graph. Call it under torch.no_grad() (or torch.inference_mode()), or "
        "pass .detach()ed inputs"
    )


def _reduce_to(g, shape):
    """``g`` summed over the dims ``shape`` broadcast over (torch's rule for a broadcast input's
    gradient)."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    extra = g.dim() - len(shape)
    if extra:
        g = g.sum(tuple(range(extra)))
    dims = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    if dims:
        g = g.sum(dims, keepdim=True)
    return g.reshape(shape)


def _work_dtype(torch, t):
    # float64 where the device computes it (not MPS); the gradients go back in the input's dtype.
    return torch.float32 if t.device.type == "mps" else torch.float64


def _heads(t) -> int:
    return t.shape[-3] if t.dim() >= 3 else 1


def backward_math(spec: Spec, q, k, v, mask, sinks, d_out, d_probs):
    """(dq, dk, dv, dmask, dsinks) of attention at (q, k, v, mask, sinks) for the output's
    gradient ``d_out`` and the probabilities' ``d_probs`` (either may be None); dmask only for a
    float mask, dsinks only with sinks."""
    import torch

    wd = _work_dtype(torch, q)
    qf, kf, vf = (t.to(wd) for t in (q, k, v))
    E = q.shape[-1]
    scale = spec.scale if spec.scale is not None else (1.0 / math.sqrt(E) if E else 1.0)
    hq, hk = _heads(q), _heads(k)
    group = hq // hk if (spec.gqa and hk != hq and hk > 0) else 1
    if group > 1:
        kf, vf = kf.repeat_interleave(group, -3), vf.repeat_interleave(group, -3)

    raw = (qf @ kf.transpose(-1, -2)) * scale
    if spec.softcap is not None:
        tanh = torch.tanh(raw / spec.softcap)
        s = spec.softcap * tanh
    else:
        s = raw
    L, S = s.shape[-2:]
    allowed = None
    if spec.causal:
        i = torch.arange(L, device=q.device)[:, None]
        j = torch.arange(S, device=q.device)[None, :]
        allowed = j <= i
        if spec.window is not None:
            allowed = allowed & (j > i - spec.window)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = mask if allowed is None else allowed & mask
        else:
            s = s + mask.to(wd)
    dead = None
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
        if spec.dead == "mean" and sinks is None:
            dead = ~allowed.any(-1, keepdim=True)
            s = torch.where(dead, torch.zeros_like(s), s)  # uniform, and constant in q and k

    # softmax over the keys (and the sink logit, which joins the denominator only).
    m = s.amax(-1, keepdim=True)
    sink = None
    if sinks is not None:
        sink = sinks.to(wd).reshape(-1, 1, 1)  # [H, 1, 1]
        m = torch.maximum(m, sink)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    if sink is not None:
        e_sink = torch.exp(sink - m)
        den = den + e_sink
    live = den > 0  # a row no key reaches (and no sink) is zeros, as the forward gives
    den = torch.where(live, den, torch.ones_like(den))
    p = e / den

    dp = torch.zeros_like(p)
    if d_out is not None:
        dp = d_out.to(wd) @ vf.transpose(-1, -2)
    if d_probs is not None:
        dp = dp + d_probs.to(wd)
    rowsum = (p * dp).sum(-1, keepdim=True)
    ds = p * (dp - rowsum)
    if dead is not None:
        ds = torch.where(dead, torch.zeros_like(ds), ds)
    d_raw = ds * (1 - tanh * tanh) if spec.softcap is not None else ds

    dq = (d_raw @ kf) * scale
    dk = (d_raw.transpose(-1, -2) @ qf) * scale
    dv = p.transpose(-1, -2) @ d_out.to(wd) if d_out is not None else torch.zeros_like(vf)
    if group > 1:
        dk = dk.unflatten(-3, (hk, group)).sum(-3)
        dv = dv.unflatten(-3, (hk, group)).sum(-3)
    dq = _reduce_to(dq, q.shape).to(q.dtype)
    dk = _reduce_to(dk, k.shape).to(k.dtype)
    dv = _reduce_to(dv, v.shape).to(v.dtype)
    dmask = None
    if mask is not None and mask.is_floating_point():
        dmask = _reduce_to(ds, mask.shape).to(mask.dtype)
    dsinks = None
    if sink is not None:
        p_sink = e_sink / den
        g = -(p_sink * rowsum)  # [..., H, L, 1]
        g = g.reshape((-1,) + tuple(g.shape[-3:])).sum((0, 2, 3))
        dsinks = g.reshape(sinks.shape).to(sinks.dtype)
    return dq, dk, dv, dmask, dsinks


def _function():
    import torch

    class Attention(torch.autograd.Function):
        """``engine(q, k, v, mask, sinks) -> (out, probs | None)`` forward (torch tensors, no
        grad), :func:`backward_math` backward."""

        @staticmethod
        def forward(ctx, engine, spec, q, k, v, mask, sinks):
            out, probs = engine(q, k, v, mask, sinks)
            ctx.spec = spec
            ctx.save_for_backward(q, k, v, mask, sinks)
            if probs is None:
                return out
            return out, probs

        @staticmethod
        def backward(ctx, d_out, *rest):
            q, k, v, mask, sinks = ctx.saved_tensors
            d_probs = rest[0] if rest else None
            dq, dk, dv, dmask, dsinks = backward_math(ctx.spec, q, k, v, mask, sinks, d_out, d_probs)
            need = ctx.needs_input_grad
            return (
                None,
                None,
                dq if need[2] else None,
                dk if need[3] else None,
                dv if need[4] else None,
                dmask if need[5] else None,
                dsinks if need[6] else None,
            )

    return Attention


_ATTENTION = None


def attention(engine: Callable, spec: Spec, q, k, v, mask=None, sinks=None):
    """The engine's attention as a differentiable torch operation: ``engine(q, k, v, mask,
    sinks)`` gives ``(out, probs | None)`` as torch tensors; ``mask`` and ``sinks`` are torch
    tensors or None (a numpy or bool mask takes no gradient). Returns ``out`` or ``(out,
    probs)``."""
    global _ATTENTION
    if _ATTENTION is None:
        _ATTENTION = _function()
    return _ATTENTION.apply(engine, spec, q, k, v, mask, sinks)
