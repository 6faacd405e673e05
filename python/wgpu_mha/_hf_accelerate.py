"""``wgpu_mha.transformers.accelerate``: a model's attention modules replaced by device-resident
ones (weights uploaded once through :func:`wgpu_mha.load`); a causal self-attention keeps its
keys and values in a device :class:`wgpu_mha.KvCache` across ``generate()`` steps, an encoder's
self-attention and a cross-attention compute their whole call. Each reads the 2-D padding masks
its stack (the decoder or encoder, whose forward takes ``inputs_embeds``) was called with.

transformers' cache keeps its bookkeeping: each replaced module appends a one-wide placeholder
per token to its layer of the ``DynamicCache`` (so ``get_seq_length``, ``cache_position`` and
the masks transformers builds stay right), holding the batch row the token belongs to, which
tells a reordered or cropped cache (beam search, assisted decoding) apart: that is an error,
never a wrong answer.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import tempfile
from typing import Any, List, Optional

import numpy as np

from . import _native
from ._hf import HfAttention, kv_dtype_name, load

log = logging.getLogger("wgpu_mha.transformers")


class _Shared:
    """What the replaced modules of one stack (a model's decoder, encoder: the module whose
    forward takes ``inputs_embeds``) read: the 2-D padding masks of its current call
    (``attention_mask [B, past + n]``, ``encoder_attention_mask [B, S]``; 1 = a real token),
    captured by a pre-hook on the stack."""

    def __init__(self):
        self.attention_mask = None
        self.encoder_attention_mask = None
        self.inside = False  # between the stack's pre-hook and its forward hook


def _dynamic_layer(cache: Any, layer_idx: int):
    from transformers.cache_utils import DynamicLayer

    layer = cache.layers[layer_idx] if hasattr(cache, "layers") else None
    if not isinstance(layer, DynamicLayer):
        raise ValueError(
            f"wgpu_mha.accelerate: layer {layer_idx} of the cache is {type(layer).__name__} in a "
            f"{type(cache).__name__}; accelerated modules keep their keys on the device and follow "
            f"a DynamicCache only (cache_implementation='dynamic', the default)"
        )
    return layer


def _make_module(torch_nn, original: Any, attn: HfAttention, shared: _Shared, name: str, kv_dtype: Optional[str]):
    import torch

    class WgpuAttention(torch_nn.Module):
        """``{name}`` on wgpu: same call and result as the module it replaced."""

        def __init__(self):
            super().__init__()
            self.wgpu = attn
            self.layer_idx = original.layer_idx
            self.is_causal = attn.is_causal
            self.config = getattr(original, "config", None)
            self._cache = None  # device KvCache of the generation in progress
            self._len = 0
            self._history = None  # host copies to refill a grown cache: (x, positions)
            self.kv_dtype = kv_dtype  # the device caches' element type (None: the module's own)
            self.replaced = type(original).__name__

        def extra_repr(self) -> str:
            kv = "" if self.kv_dtype is None else f", {self.kv_dtype} KV cache"
            return f"{name!r} on wgpu (was {self.replaced}{kv})"

        def forward(
            self, hidden_states, key_value_states=None, attention_mask=None, cache=None, past_key_values=None, **kwargs
        ):
            cache = cache if cache is not None else past_key_values
            if not shared.inside:
                raise ValueError(
                    f"wgpu_mha.accelerate: `{name}` was called outside the forward of its model's "
                    f"stack, whose 2-D attention_mask it reads; call the model"
                )
            kv = key_value_states if key_value_states is not None else kwargs.get("encoder_hidden_states")
            if self.wgpu.is_cross_attention:
                if kv is None:
                    raise ValueError(f"wgpu_mha.accelerate: `{name}` is a cross-attention module; it needs key_value_states")
                # The encoder's keys and values are recomputed each call (the cross cache is not used).
                return self.wgpu.forward(hidden_states, attention_mask=shared.encoder_attention_mask, key_value_states=kv), None
            if kv is not None:
                raise ValueError(f"wgpu_mha.accelerate: `{name}` is a self-attention module; got key_value_states")
            if not self.wgpu.is_causal:  # an encoder's: the whole sequence each call
                return self.wgpu.forward(hidden_states, attention_mask=shared.attention_mask), None
            if hasattr(cache, "self_attention_cache"):  # an EncoderDecoderCache
                cache = cache.self_attention_cache
            b, n = hidden_states.shape[:2]
            mask2d = shared.attention_mask
            pos = kwargs.get("position_ids")
            if pos is not None and pos.shape[0] != b:
                pos = pos.expand(b, -1)
            if cache is None:
                return self.wgpu.forward(hidden_states, attention_mask=mask2d, position_ids=pos), None
            past = cache.get_seq_length(self.layer_idx)
            if past == 0:  # a new generation: the device memory of the last one is reused
                if self._cache is not None and self._cache.batch == b:
                    self._cache.reset()
                else:
                    self._cache = None
                self._len, self._history = 0, None
            elif past != self._len or self._cache is None or self._cache.batch != b:
                raise ValueError(
                    f"wgpu_mha.accelerate: `{name}` holds {self._len} tokens on the device but the "
                    f"cache says {past} (batch {b}): a cache cropped, reordered or reused across "
                    f"generations is not followed (greedy search and sampling are)"
                )
            else:
                rows = _dynamic_layer(cache, self.layer_idx).keys[:, 0, :, 0]
                if not torch.equal(rows, torch.arange(b, dtype=rows.dtype).view(b, 1).expand_as(rows)):
                    raise ValueError(
                        f"wgpu_mha.accelerate: the batch rows of the cache were reordered (beam "
                        f"search?); `{name}` keeps its keys on the device and cannot follow that"
                    )
            if pos is None:
                pos = torch.arange(past, past + n).view(1, n).expand(b, n) if self.wgpu.uses_rope else None
            if mask2d is not None and mask2d.shape[-1] != past + n:
                raise ValueError(
                    f"wgpu_mha.accelerate: attention_mask covers {mask2d.shape[-1]} tokens, the cache "
                    f"and this call {past + n}"
                )
            self._ensure_capacity(b, past + n, mask2d)
            out = self._cache.step(hidden_states, attention_mask=mask2d, position_ids=pos)
            self._len = past + n
            self._remember(hidden_states, pos)
            rows = torch.arange(b, dtype=hidden_states.dtype).view(b, 1, 1, 1).expand(b, 1, n, 1)
            _dynamic_layer(cache, self.layer_idx)
            cache.update(rows, rows, self.layer_idx)
            return out, None

        def _remember(self, x, pos):
            x = x.detach().cpu()
            p = None if pos is None else pos.detach().cpu()
            if self._history is None:
                self._history = (x, p)
            else:
                hx, hp = self._history
                self._history = (torch.cat([hx, x], 1), None if p is None else torch.cat([hp, p], 1))

        def _ensure_capacity(self, b, need, mask2d):
            if self._cache is not None and need <= self._cache.capacity:
                return
            cap = 64
            while cap < need:
                cap *= 2
            fresh = self.wgpu.kv_cache(b, cap, self.kv_dtype)
            if self._len:  # refill from the host copies: the same keys and values, recomputed
                hx, hp = self._history
                fresh.step(hx, attention_mask=None if mask2d is None else mask2d[:, : self._len], position_ids=hp)
            self._cache = fresh

    return WgpuAttention()


def _add_norm(torch_nn, output: Any):
    """BERT's ``…attention.output`` after its ``dense`` moved into the device module:
    ``LayerNorm(dropout(h) + input)``, the same submodules (and weights) as before."""

    class AddNorm(torch_nn.Module):
        def __init__(self):
            super().__init__()
            self.dropout = output.dropout
            self.LayerNorm = output.LayerNorm

        def forward(self, hidden_states, input_tensor):
            return self.LayerNorm(self.dropout(hidden_states) + input_tensor)

    return AddNorm()


def _output_beside(model: Any, name: str):
    """For a ``….self`` attention whose sibling ``output`` holds its output projection and the
    add & norm after it (BERT's layout, and the families that copy it): the parent's name and
    that sibling, else None. The loader reads such a module at the parent's prefix."""
    parent_name, _, child = name.rpartition(".")
    if child != "self" or not parent_name:
        return None
    output = getattr(model.get_submodule(parent_name), "output", None)
    if all(hasattr(output, a) for a in ("dense", "LayerNorm", "dropout")):
        return parent_name, output
    return None


def _candidates(model: Any):
    """(name, module) of each attention module transformers built with a layer index."""
    for name, module in model.named_modules():
        if getattr(module, "wgpu", None) is not None:  # replaced by an earlier accelerate()
            continue
        if name and type(module).__name__.endswith("Attention") and hasattr(module, "layer_idx"):
            yield name, module


def _stack_of(model: Any, name: str):
    """The nearest enclosing module whose forward takes ``inputs_embeds`` (a decoder or encoder
    stack, which receives the 2-D masks), else the model."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        m = model.get_submodule(".".join(parts[:i]))
        try:
            if "inputs_embeds" in inspect.signature(m.forward).parameters:
                return m
        except (TypeError, ValueError):
            continue
    return model


def _hook(stack: Any, shared: _Shared, layers: set) -> None:
    signature = inspect.signature(stack.forward)

    def mask_2d(bound, key):
        mask = bound.get(key)
        if mask is not None and mask.dim() != 2:
            raise ValueError(
                f"wgpu_mha.accelerate: the model got a {mask.dim()}-D {key}; accelerated modules take "
                f"transformers' 2-D padding mask [batch, tokens] (1 = a real token)"
            )
        return mask

    def capture(_module, args, kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        for key in ("past_key_values", "cache"):
            c = bound.get(key)
            c = getattr(c, "self_attention_cache", c)
            if c is not None and getattr(c, "layers", None):
                for i in layers:  # those of the replaced causal modules
                    _dynamic_layer(c, i)
        shared.attention_mask = mask_2d(bound, "attention_mask")
        shared.encoder_attention_mask = mask_2d(bound, "encoder_attention_mask")
        shared.inside = True

    def release(_module, _args, _output):
        shared.attention_mask, shared.encoder_attention_mask, shared.inside = None, None, False

    stack.register_forward_pre_hook(capture, with_kwargs=True)
    stack.register_forward_hook(release, always_call=True)


def _check_kv_dtype(attn: HfAttention, name: str, kv_dtype: str) -> None:
    """Makes a one-token cache of ``kv_dtype`` for the causal module ``name``, so that a type
    it cannot hold (a head size that is not whole blocks) is refused now, by name, rather
    than at the first generate()."""
    try:
        attn.kv_cache(1, 1, kv_dtype)
    except ValueError as e:
        raise ValueError(f"wgpu_mha.accelerate: `{name}` cannot keep a {kv_dtype} KV cache: {e}") from e


def accelerate(model: Any, device: Optional[_native.Device] = None, kv_dtype: Optional[str] = None) -> List[str]:
    """Replaces each attention module of ``model`` that :func:`wgpu_mha.load` reads by a
    device-resident one and returns their names; logs (logger ``wgpu_mha.transformers``) each
    attention module left alone and why. ``kv_dtype``: the element type of the causal modules'
    device caches (None: each module's own). See the module's docstring."""
    import torch
    from safetensors.torch import save_file

    kv_dtype = kv_dtype_name(kv_dtype)  # a bad name is refused before any work
    if model.training:
        raise ValueError("wgpu_mha.accelerate: the model is in training mode; call model.eval() first")
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise ValueError("wgpu_mha.accelerate: the model has no transformers config")
    meta = {"hf_config": json.dumps(cfg.to_dict(), default=str)}
    stacks = {}  # id(stack) -> (stack, _Shared, causal layer indices)
    replaced = []
    plan = []  # (name, module, attn, at, beside): replaced only once every module is checked
    with tempfile.TemporaryDirectory(prefix="wgpu_mha_") as tmp:
        for name, module in list(_candidates(model)):
            if getattr(module, "has_relative_attention_bias", None) is not None:
                log.info(
                    "wgpu_mha.accelerate: left %s (%s) alone: T5's modules hand their position bias "
                    "to the next layer (register() computes them on wgpu)",
                    name,
                    type(module).__name__,
                )
                continue
            # BERT's layout: the loader reads q/k/v and the output projection beside them at the
            # parent's prefix; the device module then ends with that projection.
            beside = _output_beside(model, name)
            at, owner = (beside[0], model.get_submodule(beside[0])) if beside else (name, module)
            prefix = at + "."
            tensors = {prefix + k: v.detach().to("cpu").contiguous() for k, v in owner.state_dict().items()}
            path = os.path.join(tmp, "module.safetensors")
            save_file(tensors, path, metadata=meta)
            try:
                attn = load(path, prefix=prefix, device=device)
            except ValueError as e:
                log.info("wgpu_mha.accelerate: left %s (%s) alone: %s", at, type(owner).__name__, e)
                continue
            finally:
                os.unlink(path)
            if kv_dtype is not None and attn.is_causal and not attn.is_cross_attention:
                _check_kv_dtype(attn, at, kv_dtype)
            plan.append((name, module, attn, at, beside))
    for name, module, attn, at, beside in plan:
        stack = _stack_of(model, name)
        _, shared, layers = stacks.setdefault(id(stack), (stack, _Shared(), set()))
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _make_module(torch.nn, module, attn, shared, at, kv_dtype))
        if beside:
            parent.output = _add_norm(torch.nn, beside[1])
        replaced.append(at)
        if attn.is_causal and not attn.is_cross_attention:
            layers.add(module.layer_idx)
    for stack, shared, layers in stacks.values():
        _hook(stack, shared, layers)
    log.info("wgpu_mha.accelerate: %d attention modules on wgpu: %s", len(replaced), ", ".join(replaced))
    return replaced
