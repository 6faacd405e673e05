"""``scaled_dot_product_attention`` with torch's arguments, rules and broadcasting, on the
engine's attention core (``[B, H, L, D]`` tensors and a rank-4 mask whose size-1 dims
broadcast)."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from . import _native
from ._autograd import Spec, attention, needs_grad
from ._convert import bool_or_float_mask, float_input
from ._device import resolve


def _lift(a: np.ndarray, rank: int) -> np.ndarray:
    return a.reshape((1,) * (rank - a.ndim) + a.shape)


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Optional[Any] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    device: Optional[_native.Device] = None,
):
    """``torch.nn.functional.scaled_dot_product_attention`` on the GPU through wgpu.

    Shapes (torch's): ``query (..., Hq, L, E)``, ``key (..., Hkv, S, E)``, ``value (..., Hkv,
    S, Ev)`` → ``(..., Hq, L, Ev)``; the leading dims broadcast as torch broadcasts them, and
    ``Hkv`` must equal ``Hq`` (or be 1) unless ``enable_gqa=True``, where it must divide ``Hq``
    (query head ``h`` uses key/value head ``h // (Hq // Hkv)``, torch's ``repeat_interleave``).

    ``attn_mask`` broadcasts (right-aligned) to ``(..., Hq, L, S)``: **bool: True = the key
    takes part**, False = masked out; float: added to the scaled scores. A query row whose
    every key is masked out gives zeros, as torch does. ``is_causal=True``: query ``i`` sees
    keys ``j <= i`` (top-left aligned, torch's rule), and ``attn_mask`` must then be None.
    ``scale`` defaults to ``1/sqrt(E)``. ``dropout_p > 0`` is a ValueError (inference only).

    ``is_causal`` and ``enable_gqa`` are bools (TypeError otherwise, as torch); a NaN or
    infinite ``scale`` is a ValueError.

    Inputs: numpy arrays or torch tensors, float32 or float16 (bfloat16 tensors are computed in
    float32, float64 in float32), any strides. The result is of the query's kind and dtype.
    With grad mode on and q, k, v or a float ``attn_mask`` requiring grad, the result is
    differentiable: torch's math on the saved inputs, in float64, is the backward (see
    ``_autograd.py``).
    """
    if dropout_p:
        raise ValueError(
            f"dropout_p={dropout_p}: wgpu_mha computes attention for inference only; pass dropout_p=0.0"
        )
    _bool_arg(is_causal, "is_causal")
    _bool_arg(enable_gqa, "enable_gqa")
    if attn_mask is not None and is_causal:
        raise ValueError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
            raise TypeError(f"scaled_dot_product_attention(): argument 'scale' must be float, not {type(scale).__name__}")
        scale = float(scale)
        if not math.isfinite(scale):
            # torch computes NaN outputs from it; the engine refuses it up front.
            raise ValueError(f"scale must be finite, got {scale}")
    if not needs_grad(query, key, value, attn_mask):
        return _forward(query, key, value, attn_mask, is_causal, scale, enable_gqa, device)
    import torch

    if not all(isinstance(x, torch.Tensor) for x in (query, key, value)):
        raise RuntimeError(
            "scaled_dot_product_attention: an input requires_grad, so query, key and value must all "
            "be torch tensors for the backward; or call it under torch.no_grad() / with .detach()ed inputs"
        )
    mask = attn_mask
    if mask is not None and not isinstance(mask, torch.Tensor):
        mask = torch.as_tensor(np.asarray(mask))

    def engine(q, k, v, m, _sinks):
        return _forward(q, k, v, m, is_causal, scale, enable_gqa, device), None

    spec = Spec(causal=bool(is_causal), scale=scale, gqa=bool(enable_gqa))
    return attention(engine, spec, query, key, value, mask)


def _bool_arg(x: Any, name: str) -> None:
    # torch's argument parser: a bool, nothing else truthy.
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"scaled_dot_product_attention(): argument '{name}' must be bool, not {type(x).__name__}")


def _forward(query, key, value, attn_mask, is_causal, scale, enable_gqa, device):
    """The forward on the engine, torch's rules and broadcasting (no autograd)."""
    q, kind = float_input(query, "query")
    k, _ = float_input(key, "key")
    v, _ = float_input(value, "value")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"Expected query, key, and value to have the same dtype, got {q.dtype}, {k.dtype} and {v.dtype}"
        )
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ValueError(
            f"query, key and value need at least 2 dims (..., L, E); got {q.shape}, {k.shape}, {v.shape}"
        )
    (L, E), (S, Ek), (Sv, Ev) = q.shape[-2:], k.shape[-2:], v.shape[-2:]
    if Ek != E:
        raise ValueError(f"query's last dim is {E}, key's {Ek}: they must be equal")
    if Sv != S:
        raise ValueError(f"key has {S} positions, value {Sv}: they must be equal")
    rank = max(q.ndim, k.ndim, v.ndim)
    qx, kx, vx = (_lift(a, max(rank, 3)) for a in (q, k, v))
    hq, hk, hv = qx.shape[-3], kx.shape[-3], vx.shape[-3]

    try:
        if enable_gqa and (hk != hq or hv != hq):
            if hk != hv or hq % hk:
                raise ValueError(
                    f"enable_gqa: query has {hq} heads, key {hk}, value {hv}; key and value need "
                    f"the same number of heads, dividing the query's"
                )
            lead = np.broadcast_shapes(qx.shape[:-3], kx.shape[:-3], vx.shape[:-3])
            kv_heads = hk
        else:
            batch = np.broadcast_shapes(qx.shape[:-2], kx.shape[:-2], vx.shape[:-2])
            lead = batch[:-1]
            # Key/value heads of 1 broadcast over the query's without a copy (GQA with one group).
            kv_heads = 1 if (hk == 1 and hv == 1) else batch[-1]
            hq = batch[-1]
    except ValueError as e:
        if "enable_gqa" in str(e):
            raise
        raise ValueError(
            f"query {q.shape}, key {k.shape} and value {v.shape} do not broadcast over their "
            f"leading dims (different head counts need enable_gqa=True)"
        ) from None
    B = int(np.prod(lead, dtype=np.int64)) if lead else 1
    q4 = np.ascontiguousarray(np.broadcast_to(qx, lead + (hq, L, E))).reshape(B, hq, L, E)
    k4 = np.ascontiguousarray(np.broadcast_to(kx, lead + (kv_heads, S, E))).reshape(B, kv_heads, S, E)
    v4 = np.ascontiguousarray(np.broadcast_to(vx, lead + (kv_heads, S, Ev))).reshape(B, kv_heads, S, Ev)

    m4 = None
    dead = None
    if attn_mask is not None:
        m = bool_or_float_mask(attn_mask, "attn_mask")
        full = lead + (hq, L, S)
        if m.ndim < 2:
            raise ValueError(f"attn_mask needs at least 2 dims (L, S), as torch's; got shape {m.shape}")
        try:
            fits = np.broadcast_shapes(m.shape, full) == full
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"attn_mask of shape {m.shape} does not broadcast to the attention's {full}")
        mx = _lift(m, len(full))
        if any(d != 1 for d in mx.shape[:-3]):
            mx = np.broadcast_to(mx, lead + mx.shape[-3:])
            mb = B
        else:
            mb = 1
        m4 = np.ascontiguousarray(mx).reshape((mb,) + mx.shape[-3:])
        # Rows whose every key is masked out: torch gives zeros there.
        dead = ~m4.any(-1) if m4.dtype == np.bool_ else np.isneginf(m4).all(-1)

    shape = (lead + (hq,) if rank > 2 else ()) + (L, Ev)
    # Sizes the core refuses, with torch's answers: nothing to compute, or a sum over no keys
    # (zeros); E = 0 makes every score 0, which width-1 zero vectors give too.
    if B * hq * L * Ev == 0 or S == 0:
        return kind.back(np.zeros(shape, np.float32))
    if E == 0:
        q4 = np.zeros((B, hq, L, 1), q4.dtype)
        k4 = np.zeros((B, kv_heads, S, 1), k4.dtype)

    out, _ = _native.sdpa(
        resolve(device),
        q4,
        k4,
        v4,
        m4,
        bool(is_causal),
        scale,
    )
    if dead is not None and dead.any():
        out[np.broadcast_to(dead, (B, hq, L))] = 0.0
    return kind.back(out.reshape(shape))


