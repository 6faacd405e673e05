"""``nn.MultiheadAttention`` on the GPU: weights uploaded once, called as torch's forward."""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _native
from ._convert import bool_or_float_mask, float_input
from ._device import resolve


def safetensors_bytes(tensors: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """A safetensors file of float32 tensors, in memory."""
    header: Dict[str, Any] = {}
    blobs = []
    offset = 0
    for name, a in tensors.items():
        data = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def _additive(mask: np.ndarray) -> np.ndarray:
    """torch's ``_canonical_mask``: bool True = not allowed → −inf; float as given."""
    if mask.dtype == np.bool_:
        return np.where(mask, np.float32(-np.inf), np.float32(0.0))
    return mask.astype(np.float32, copy=False)


class MultiheadAttention:
    """A ``torch.nn.MultiheadAttention`` whose weights live on the GPU.

    Make one with :meth:`from_torch`; call it as the module's ``forward``.
    """

    def __init__(self, native: _native.Mha, batch_first: bool):
        self._native = native
        self.batch_first = batch_first
        self.embed_dim = native.embed_dim
        self.kdim = native.kdim
        self.vdim = native.vdim
        self.num_heads = native.num_heads

    @classmethod
    def from_torch(cls, module: Any, *, device: Optional[_native.Device] = None) -> "MultiheadAttention":
        """Copies ``module``'s weights (packed or kdim/vdim projections, biases, ``bias_k``/
        ``bias_v``) and takes its ``num_heads``, ``add_zero_attn`` and ``batch_first``. Later
        changes to the module are not seen. A module in training mode with ``dropout > 0`` is a
        ValueError (inference only: call ``module.eval()``)."""
        import torch

        if not isinstance(module, torch.nn.MultiheadAttention):
            raise TypeError(f"from_torch takes a torch.nn.MultiheadAttention, got {type(module).__name__}")
        if module.training and module.dropout > 0:
            raise ValueError(
                f"the module is in training mode with dropout={module.dropout}; wgpu_mha is for "
                "inference only: call module.eval() first"
            )
        state = {
            name: t.detach().to(device="cpu", dtype=torch.float32).numpy()
            for name, t in module.state_dict().items()
        }
        native = _native.Mha(
            resolve(device), safetensors_bytes(state), int(module.num_heads), bool(module.add_zero_attn)
        )
        return cls(native, bool(module.batch_first))

    def __call__(
        self,
        query: Any,
        key: Any,
        value: Any,
        key_padding_mask: Optional[Any] = None,
        need_weights: bool = True,
        attn_mask: Optional[Any] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> Tuple[Any, Optional[Any]]:
        """``nn.MultiheadAttention.forward``: returns ``(attn_output, attn_output_weights)``.

        Shapes: batched ``query (N, L, E)`` with ``batch_first=True``, else ``(L, N, E)``;
        ``key (…, S, kdim)``, ``value (…, S, vdim)`` the same way; unbatched ``(L, E)``.
        ``key_padding_mask (N, S)`` (or ``(S,)`` unbatched): **bool True = that key is ignored**;
        float: added. ``attn_mask (L, S)`` or ``(N·num_heads, L, S)``: **bool True = not
        allowed to attend**; float: added. ``is_causal`` is torch's hint: it needs ``attn_mask``
        (the causal mask itself), which is what is applied. Keys appended by ``bias_k``/``bias_v``
        and ``add_zero_attn`` are seen by every query. Weights: ``(N, L, S')`` averaged over heads,
        or ``(N, num_heads, L, S')`` with ``average_attn_weights=False`` (``S'`` counts appended
        keys); ``None`` when ``need_weights=False``. A row whose every key is masked is NaN, as
        torch's with weights. Output and weights are of the query's kind and dtype.
        """
        if is_causal and attn_mask is None:
            raise ValueError(
                "Need attn_mask if specifying the is_causal hint. You may use the Transformer "
                "module method `generate_square_subsequent_mask` to create this mask."
            )
        q, kind = float_input(query, "query")
        k, _ = float_input(key, "key")
        v, _ = float_input(value, "value")
        batched = q.ndim == 3
        if q.ndim not in (2, 3) or k.ndim != q.ndim or v.ndim != q.ndim:
            raise ValueError(
                f"query, key and value must all be 3-D (batched) or 2-D (unbatched); got {q.shape}, {k.shape}, {v.shape}"
            )
        if not batched:
            q, k, v = q[None], k[None], v[None]
        elif not self.batch_first:
            q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))
        n, lq, _ = q.shape
        lk = k.shape[1]
        h = self.num_heads

        bias = None
        if attn_mask is not None:
            am = _additive(bool_or_float_mask(attn_mask, "attn_mask"))
            if am.ndim == 2:
                if am.shape != (lq, lk):
                    raise ValueError(f"The shape of the 2D attn_mask is {am.shape}, but should be {(lq, lk)}.")
                am = am[None, None]
            elif am.ndim == 3:
                if am.shape != (n * h, lq, lk):
                    raise ValueError(
                        f"The shape of the 3D attn_mask is {am.shape}, but should be {(n * h, lq, lk)}."
                    )
                am = am.reshape(n, h, lq, lk)
            else:
                raise ValueError(f"attn_mask's dimension {am.ndim} is not supported")
            bias = am
        if key_padding_mask is not None:
            kp = _additive(bool_or_float_mask(key_padding_mask, "key_padding_mask"))
            if not batched:
                kp = kp[None]
            if kp.shape != (n, lk):
                raise ValueError(f"expecting key_padding_mask shape of {(n, lk)}, but got {kp.shape}")
            kp = kp[:, None, None, :]
            bias = kp if bias is None else bias + kp
        if bias is not None:
            bias = np.ascontiguousarray(bias, dtype=np.float32)

        out, weights = self._native.forward(
            np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), bias, bool(need_weights)
        )
        if not batched:
            out = out[0]
        elif not self.batch_first:
            out = out.transpose(1, 0, 2)
        if weights is not None:
            if average_attn_weights:
                weights = weights.mean(axis=1)
            if not batched:
                weights = weights[0]
            weights = kind.back(weights)
        return kind.back(out), weights

    forward = __call__

    def __repr__(self) -> str:
        return (
            f"wgpu_mha.MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"kdim={self.kdim}, vdim={self.vdim}, batch_first={self.batch_first})"
        )
