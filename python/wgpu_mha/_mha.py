"""``nn.MultiheadAttention`` on the GPU: weights uploaded once, called as torch's forward."""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _native
from ._autograd import refuse_grad
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


def _projections(state: Dict[str, np.ndarray], module: Any) -> Dict[str, np.ndarray]:
    """The value and output projections (float64): the value weight and bias, the output
    weight and bias (zeros where the module has no bias)."""
    e = int(module.embed_dim)
    wv = state["in_proj_weight"][2 * e :] if "in_proj_weight" in state else state["v_proj_weight"]
    bv = state["in_proj_bias"][2 * e :] if "in_proj_bias" in state else np.zeros(e)
    bo = state.get("out_proj.bias", np.zeros(e))
    return {
        "wv": wv.astype(np.float64),
        "bv": bv.astype(np.float64),
        "wo": state["out_proj.weight"].astype(np.float64),
        "bo": np.asarray(bo, np.float64),
    }


class MultiheadAttention:
    """A ``torch.nn.MultiheadAttention`` whose weights live on the GPU.

    Make one with :meth:`from_torch`; call it as the module's ``forward``.
    """

    def __init__(self, native: _native.Mha, batch_first: bool, dtype: Any = None, host: Optional[Dict[str, np.ndarray]] = None):
        self._native = native
        self.batch_first = batch_first
        # The torch module's dtype (inputs must have it, torch's rule) and its value and output
        # projections on the host (float64), for rows that see no key (see _no_key_rows).
        self._dtype = dtype
        self._host = host
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
        return cls(native, bool(module.batch_first), module.out_proj.weight.dtype, _projections(state, module))

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
        keys); ``None`` when ``need_weights=False``. A query row that sees no key is torch's
        ordinary path's: NaN (output and weights) with ``need_weights=True``, ``out_proj.bias``
        with ``need_weights=False`` (a head that sees no key adds nothing). Output and weights are
        of the query's kind and dtype. Tensor inputs must have the module's dtype (RuntimeError,
        torch's rule). There is no backward: an input requiring grad with grad mode on is a
        RuntimeError (call it under ``torch.no_grad()`` or pass ``.detach()``ed inputs).
        """
        refuse_grad(
            "wgpu_mha.MultiheadAttention",
            query=query,
            key=key,
            value=value,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
        )
        self._check_dtypes(query=query, key=key, value=value)
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

        q, k, v = (np.ascontiguousarray(a) for a in (q, k, v))
        if need_weights or bias is None or self._native.appended_keys:
            out, weights = self._native.forward(q, k, v, bias, bool(need_weights))
        else:
            out, weights = self._no_key_rows(q, k, v, bias), None
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

    def _check_dtypes(self, **inputs: Any) -> None:
        """torch's rule: a tensor input of another dtype than the module's weights is a
        RuntimeError (torch's linear: "mat1 and mat2 must have the same dtype")."""
        if self._dtype is None:
            return
        import torch

        for name, x in inputs.items():
            if isinstance(x, torch.Tensor) and x.dtype != self._dtype:
                raise RuntimeError(
                    f"{name} has dtype {x.dtype} but the module's weights are {self._dtype} (torch: mat1 "
                    f"and mat2 must have the same dtype): convert the input, or the module before from_torch"
                )

    def _no_key_rows(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray) -> np.ndarray:
        """The output with ``need_weights=False`` as torch's ordinary path gives it (its sdpa
        gives zeros for a query row that sees no key): a row no head lets see any key is
        ``out_proj.bias``; a head that sees no key adds nothing to its row. The engine computes
        such a head's row as 0/0, so that row's mask is lifted (0) and the head's contribution,
        from its probabilities and the value projection on the host, taken back out."""
        n, lq, h = q.shape[0], q.shape[1], self.num_heads
        dead = np.broadcast_to(np.isneginf(bias).all(-1), (n, h, lq))
        if not dead.any():
            return self._native.forward(q, k, v, bias, False)[0]
        every = dead.all(1)  # [n, lq]: no head sees a key
        some = dead & ~every[:, None, :]  # [n, h, lq]: this head sees none, another does
        lifted = np.where(np.broadcast_to(dead, (n, h, lq))[..., None], np.float32(0), bias)
        if not some.any():
            out = self._native.forward(q, k, v, np.ascontiguousarray(lifted, np.float32), False)[0]
        else:
            out, probs = self._native.forward(q, k, v, np.ascontiguousarray(lifted, np.float32), True)
            wv, bv, wo = self._host["wv"], self._host["bv"], self._host["wo"]
            e = wo.shape[0]
            vh = (v.astype(np.float64) @ wv.T + bv).reshape(n, -1, h, e // h).transpose(0, 2, 1, 3)
            o = np.einsum("nhls,nhsd->nhld", probs.astype(np.float64), vh) * some[..., None]
            out = (out - np.einsum("nhld,ehd->nle", o, wo.reshape(e, h, e // h))).astype(np.float32)
        out[every] = self._host["bo"].astype(np.float32)
        return out

    def __repr__(self) -> str:
        return (
            f"wgpu_mha.MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"kdim={self.kdim}, vdim={self.vdim}, batch_first={self.batch_first})"
        )
