"""Hugging Face ``transformers`` on wgpu: :func:`register` makes ``attn_implementation="wgpu_mha"``
compute every attention call of a model on the engine's attention core; :func:`accelerate`
(in ``wgpu_mha/_hf_accelerate.py``) replaces whole attention modules by device-resident ones
keys and values stay on the GPU across ``generate()`` steps.

Nothing falls back to torch: what the engine cannot compute (dropout while training, an argument
of the attention call it does not know, a head size the adapter cannot run) is an error naming it.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _native
from ._autograd import Spec, attention, needs_grad
from ._convert import float_input, to_numpy
from ._device import resolve
from ._hf_accelerate import accelerate as _accelerate

__all__ = ["NAME", "accelerate", "attention_forward", "register"]

NAME = "wgpu_mha"

# Arguments transformers passes to every attention function that describe bookkeeping, not the
# answer: the mask transformers built from them already says what attends to what.
_BOOKKEEPING = frozenset(
    {
        "position_ids",
        "cache_position",
        "past_key_values",
        "past_key_value",
        "cache",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "layer_idx",
        # Flash-attention's description of packed sequences; the 4-D mask carries the same.
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "token_type_ids",
        "seq_idx",
        "num_items_in_batch",
    }
)


def _bookkeeping(name: str, value: Any) -> bool:
    # ``output_*`` flags (output_router_logits, …) ask a model for more outputs, not another answer.
    return value is None or name in _BOOKKEEPING or (name.startswith("output_") and isinstance(value, bool))

_device: Optional[_native.Device] = None


def _refuse(module: Any, what: str) -> ValueError:
    return ValueError(
        f"wgpu_mha attention ({type(module).__name__}): {what}; wgpu_mha does not fall back to torch"
    )


def attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Optional[Any],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    position_bias: Optional[Any] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    s_aux: Optional[Any] = None,
    **kwargs: Any,
):
    """transformers' attention-function contract on the engine: ``query [B, H, Lq, D]``, ``key``
    and ``value [B, Hkv, Lk, D]`` (``Hkv`` dividing ``H``: GQA computed without repeating K/V),
    ``attention_mask`` 4-D bool (True = attends) or float (added), broadcasting over heads (None:
    ``is_causal`` — the module's when not given — decides, top-left as torch's sdpa, and only for
    more than one query, as transformers' sdpa backend does). ``scaling`` (default
    ``1/sqrt(D)``), ``position_bias`` (T5, added), ``sliding_window`` (applied by the engine when
    there is no mask; a mask already carries it), ``softcap`` (``c·tanh(s/c)`` before the mask),
    ``s_aux`` (one sink logit per head). Returns ``(out [B, Lq, H, Dv] contiguous, weights)``,
    the weights ``[B, H, Lq, Lk]`` only when ``output_attentions=True`` is passed.

    Differentiable (grad mode on, an input requiring grad): the backward is torch's math on the
    saved q, k, v, mask (the T5 bias within it) and sinks; a row whose boolean mask hides every
    key is the mean of V, eager's answer, constant in q and k."""
    import torch

    if dropout:
        raise _refuse(module, f"dropout={dropout} (a module in training mode): call model.eval()")
    unknown = sorted(k for k, v in kwargs.items() if not _bookkeeping(k, v))
    if unknown:
        raise _refuse(module, f"the attention call passed {', '.join(unknown)}, which it does not compute")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise _refuse(module, f"query, key and value must be [B, H, L, D], got {tuple(query.shape)}, "
                      f"{tuple(key.shape)}, {tuple(value.shape)}")
    B, H, Lq, D = query.shape
    Lk = key.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    causal = bool(is_causal) and attention_mask is None and Lq > 1

    mask = attention_mask
    if mask is not None and mask.shape[-1] > Lk:
        mask = mask[..., :Lk]  # a static cache's mask may be longer than the keys it holds
    if position_bias is not None:
        bias = position_bias
        if causal:
            keep = torch.ones(Lq, Lk, dtype=torch.bool, device=bias.device).tril()
            mask = torch.where(keep, bias, torch.finfo(bias.dtype).min)
            causal = False
        elif mask is None:
            mask = bias
        elif mask.dtype == torch.bool:
            mask = torch.where(mask, bias, torch.finfo(bias.dtype).min)
        else:
            mask = bias + mask
    if mask is not None and mask.dim() != 4:
        raise _refuse(module, f"attention_mask of shape {tuple(mask.shape)}: it needs 4 dims [B, 1|H, Lq, Lk]")
    window = int(sliding_window) if (sliding_window is not None and causal) else None
    softcap = None if softcap is None else float(softcap)
    want_weights = bool(kwargs.get("output_attentions"))

    def engine(query, key, value, mask, s_aux):
        return _engine(module, query, key, value, mask, s_aux, causal, scaling, window, softcap, want_weights)

    if needs_grad(query, key, value, mask, s_aux):
        spec = Spec(causal=causal, scale=None if scaling is None else float(scaling), gqa=True, window=window,
                    softcap=softcap, dead="mean")
        res = attention(engine, spec, query, key, value, mask, s_aux)
        out, weights = res if want_weights else (res, None)
    else:
        out, weights = engine(query, key, value, mask, s_aux)
    return out.transpose(1, 2).contiguous(), weights


def _engine(module, query, key, value, mask, s_aux, causal, scaling, window, softcap, want_weights):
    """The engine's attention of torch tensors ``[B, H, L, D]`` → ``(out [B, H, Lq, Dv],
    weights | None)`` as torch tensors of the query's dtype."""
    mask_np = None
    if mask is not None:
        m = to_numpy(mask, "attention_mask")
        m = m if m.dtype == np.bool_ else m.astype(np.float32, copy=False)
        mask_np = np.ascontiguousarray(m)
    q, kind = float_input(query, "query")
    k, _ = float_input(key, "key")
    v, _ = float_input(value, "value")
    if not (q.dtype == k.dtype == v.dtype):
        q, k, v = (a.astype(np.float32, copy=False) for a in (q, k, v))
    sinks = None
    if s_aux is not None:
        sinks = np.ascontiguousarray(to_numpy(s_aux, "s_aux"), dtype=np.float32).reshape(-1)
    if want_weights:
        q, k, v = (a.astype(np.float32, copy=False) for a in (q, k, v))
    try:
        out, probs = _native.sdpa(
            resolve(_device),
            np.ascontiguousarray(q),
            np.ascontiguousarray(k),
            np.ascontiguousarray(v),
            mask_np,
            causal,
            None if scaling is None else float(scaling),
            want_weights,
            window=window,
            softcap=softcap,
            sinks=sinks,
        )
    except ValueError as e:
        raise _refuse(module, str(e)) from None
    weights = None if probs is None else kind.back(probs)
    return kind.back(out), weights


def _require() -> None:
    """transformers 5's interfaces (AttentionMaskInterface, the cache's layers): older releases
    spell them otherwise, untested here."""
    import transformers

    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise RuntimeError(
            f"wgpu_mha.transformers needs transformers >= 5 (tested with 5.25); found {transformers.__version__}"
        )


def register(device: Optional[_native.Device] = None) -> str:
    """Adds the attention backend ``"wgpu_mha"`` to transformers' ``AttentionInterface`` and its
    mask function to ``AttentionMaskInterface`` (transformers builds no mask at all for a
    backend without one): boolean 4-D masks, True = attends, the causal one left out where the
    engine's own causal rule gives the same (transformers' sdpa rules). Then
    ``from_pretrained(..., attn_implementation="wgpu_mha")``, ``from_config(cfg,
    attn_implementation="wgpu_mha")`` or ``model.set_attn_implementation("wgpu_mha")`` run
    every attention call of the model on ``device`` (default: :func:`wgpu_mha.default_device`).
    Returns the name."""
    global _device
    _require()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if device is not None:
        resolve(device)
    _device = device
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def accelerate(model: Any, device: Optional[_native.Device] = None, kv_dtype: Optional[str] = None):
    """Replaces each attention module of ``model`` that :func:`wgpu_mha.load` reads by a
    device-resident one (weights uploaded once; a causal self-attention keeps its keys and values
    in a device KvCache across ``generate()`` steps; encoder and cross-attention modules compute
    each call whole) and returns their names; each attention module left alone is logged
    (logger ``wgpu_mha.transformers``) with the reason. Greedy search and sampling with
    transformers' DynamicCache are followed; a cache reordered or cropped (beam search, assisted
    decoding) or a static cache is a ValueError.

    ``kv_dtype``: how those device caches store keys and values — None (the module's own type),
    ``"f32"``, or llama.cpp's ``"q8_0"`` / ``"q4_0"`` blocks (about a quarter / a seventh of an
    f32 cache's bytes; see :meth:`wgpu_mha.HfAttention.kv_cache`). A name that is none of
    these, or a causal module whose head size a quantized cache cannot hold (not a multiple of
    32), is a ValueError naming it, raised here, before any module is replaced."""
    _require()
    return _accelerate(model, device, kv_dtype=kv_dtype)
