"""A Hugging Face attention module from a saved checkpoint, and its device KV cache."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple, Union

from . import _native
from ._autograd import refuse_grad
from ._convert import float_input, index_array, padding_mask, size
from ._device import resolve
import numpy as np


class HfAttention:
    """One attention module of a saved checkpoint, weights on the GPU (see :func:`load`)."""

    def __init__(self, native: _native.HfModule):
        self._native = native

    prefix = property(lambda self: self._native.prefix, doc="The module's tensor-name prefix.")
    family = property(lambda self: self._native.family, doc="The tensor layout family (llama, bert, …).")
    model_type = property(lambda self: self._native.model_type, doc="config.json's model_type.")
    is_cross_attention = property(lambda self: self._native.is_cross_attention)
    is_causal = property(lambda self: self._native.is_causal, doc="Query i sees keys j <= i.")
    sliding_window = property(lambda self: self._native.sliding_window)
    hidden_size = property(lambda self: self._native.hidden_size)
    num_heads = property(lambda self: self._native.num_heads)
    num_key_value_heads = property(lambda self: self._native.num_key_value_heads)
    uses_rope = property(lambda self: self._native.uses_rope)

    def forward(
        self,
        hidden_states: Any,
        attention_mask: Optional[Any] = None,
        position_ids: Optional[Any] = None,
        key_value_states: Optional[Any] = None,
    ):
        """The module's output ``[B, Lq, E]`` for ``hidden_states [B, Lq, E]``, with the mask the
        module applies (causal for a decoder's self-attention, its sliding window, T5's relative
        bias) and the padding of ``attention_mask [B, Lk]`` (**1 = a real token, 0 = padding**,
        transformers' 2-D convention). ``position_ids [B, Lq]``: RoPE positions (default
        ``0..Lq``; ignored by modules without RoPE). ``key_value_states [B, Lk, E]``: the
        encoder's output, for a cross-attention module only. Same kind and dtype as
        ``hidden_states``. No backward: an input requiring grad with grad mode on is a
        RuntimeError (call it under ``torch.no_grad()``)."""
        refuse_grad(
            "wgpu_mha.HfAttention.forward", hidden_states=hidden_states, key_value_states=key_value_states
        )
        x, kind = float_input(hidden_states, "hidden_states")
        kv = None
        if key_value_states is not None:
            kv, _ = float_input(key_value_states, "key_value_states")
            kv = np.ascontiguousarray(kv)
        out = self._native.forward(
            np.ascontiguousarray(x),
            padding_mask(attention_mask, "attention_mask"),
            index_array(position_ids, "position_ids"),
            kv,
        )
        return kind.back(out)

    __call__ = forward

    def kv_cache(self, batch: int, capacity: int, kv_dtype: Optional[str] = None) -> "KvCache":
        """A device KV cache of ``batch`` sequences of up to ``capacity`` tokens (a causal
        self-attention module only; ValueError otherwise). Both are integers >= 0 (ValueError
        naming the argument otherwise). ``kv_dtype``: how keys and values are stored —
        ``"f32"``/``"f16"`` (the module's own type only; None picks it), or llama.cpp's
        ``"q8_0"`` (34 bytes per 32 values) / ``"q4_0"`` (18 bytes), quantized as they are
        appended and read dequantized; those need head sizes that are multiples of 32. A
        name that is none of these, or a head size that does not fit, is a ValueError naming
        it."""
        return KvCache(
            self._native.kv_cache(size(batch, "batch"), size(capacity, "capacity"), kv_dtype_name(kv_dtype))
        )

    def __repr__(self) -> str:
        return (
            f"wgpu_mha.HfAttention({self.prefix!r}, family={self.family}, heads={self.num_heads}, "
            f"kv_heads={self.num_key_value_heads}, causal={self.is_causal})"
        )


class KvCache:
    """Keys and values of the tokens decoded so far, kept on the GPU."""

    def __init__(self, native: _native.HfKvCache):
        self._native = native

    def step(self, hidden_states: Any, attention_mask: Optional[Any] = None, position_ids: Optional[Any] = None):
        """The module's output ``[B, n, E]`` for the next ``n`` tokens ``hidden_states [B, n,
        E]``, whose keys and values are appended. ``attention_mask [B, len + n]``: padding of all
        tokens so far and these (1 = real); ``position_ids [B, n]`` (default ``len..len + n``).
        A step past ``capacity`` is a ValueError and leaves the cache as it was. No backward:
        ``hidden_states`` requiring grad with grad mode on is a RuntimeError."""
        refuse_grad("wgpu_mha.KvCache.step", hidden_states=hidden_states)
        x, kind = float_input(hidden_states, "hidden_states")
        out = self._native.step(
            np.ascontiguousarray(x),
            padding_mask(attention_mask, "attention_mask"),
            index_array(position_ids, "position_ids"),
        )
        return kind.back(out)

    def __len__(self) -> int:
        return len(self._native)

    @property
    def capacity(self) -> int:
        return self._native.capacity

    @property
    def batch(self) -> int:
        return self._native.batch

    @property
    def dtype(self) -> str:
        """How keys and values are stored: ``"f32"``, ``"f16"``, ``"q8_0"`` or ``"q4_0"``."""
        return self._native.dtype

    @property
    def bytes_per_token(self) -> int:
        """Bytes of keys and values one token of one sequence takes on the device (the blocks'
        in a quantized cache: 34 per 32 values in q8_0, 18 in q4_0)."""
        return self._native.bytes_per_token

    def nbytes(self) -> Dict[str, int]:
        """Device bytes held: ``keys_values`` (at the full capacity), ``step`` (step buffers),
        ``scores`` (multi-pass only) and ``per_token``."""
        return dict(self._native.nbytes())

    def read_keys_values(self) -> Tuple[np.ndarray, np.ndarray]:
        """The cached keys ``[B, H_kv, len, dk]`` and values ``[B, H_kv, len, dv]`` (RoPE
        applied) as float32 NumPy arrays; a quantized cache's as its blocks decode them, which
        is what its steps attend to."""
        return self._native.read_keys_values()

    def reset(self) -> None:
        """Forget every token (the device memory is kept)."""
        self._native.reset()


def kv_dtype_name(kv_dtype: Optional[str]) -> Optional[str]:
    """``kv_dtype``'s canonical name (``"q8_0"`` for ``"Q8_0"``, ``"f32"`` for ``"float32"``),
    None for None; ValueError naming it when it is not a KV cache type, TypeError when it is
    not a string."""
    if kv_dtype is None:
        return None
    if not isinstance(kv_dtype, str):
        raise TypeError(f"kv_dtype must be a string such as \"q8_0\" or None, got {type(kv_dtype).__name__}")
    return _native.kv_dtype_name(kv_dtype)


def load(
    path: Union[str, "os.PathLike[str]"],
    layer: Optional[int] = None,
    prefix: Optional[str] = None,
    *,
    device: Optional[_native.Device] = None,
) -> HfAttention:
    """The attention module of a saved Hugging Face checkpoint: a directory (``config.json`` and
    ``model.safetensors`` or shards with their index, as ``save_pretrained`` writes) or one
    safetensors file. ``prefix`` names the module (``"model.layers.0.self_attn."``); else
    ``layer`` picks the one attention module of that layer; else the checkpoint must hold just
    one. A model type or config key the engine does not implement is a ValueError naming it."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    layer = None if layer is None else size(layer, "layer")
    return HfAttention(_native.HfModule(resolve(device), path, layer, prefix))
