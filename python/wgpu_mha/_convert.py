"""Inputs as numpy arrays, results back as the kind that came in (numpy or torch).

torch is never imported here: a torch tensor can only exist once torch is imported, so
``sys.modules`` tells whether an input may be one.
"""

from __future__ import annotations

import operator
import sys
from typing import Any, Optional, Tuple

import numpy as np

_FLOATS = (np.float32, np.float16)


class Kind:
    """Where an input came from, so the result can go back the same way."""

    __slots__ = ("torch_dtype", "torch_device", "np_dtype")

    def __init__(self, np_dtype, torch_dtype=None, torch_device=None):
        self.np_dtype = np_dtype
        self.torch_dtype = torch_dtype
        self.torch_device = torch_device

    def back(self, array: np.ndarray):
        """A float32 result as this kind: numpy in the input's dtype, or a torch tensor of the
        input's dtype on its device."""
        if self.torch_dtype is None:
            return array.astype(self.np_dtype, copy=False)
        import torch

        return torch.from_numpy(np.ascontiguousarray(array)).to(
            dtype=self.torch_dtype, device=self.torch_device
        )


def _torch_tensor(x: Any):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch
    return None


def to_numpy(x: Any, name: str) -> np.ndarray:
    """Any array-like as numpy, without a copy where possible (torch CPU tensors share memory)."""
    torch = _torch_tensor(x)
    if torch is not None:
        if x.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor: it has a shape but no values to compute with")
        t = x.detach()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)
        if t.device.type != "cpu":
            t = t.cpu()
        return t.numpy()
    return np.asarray(x)


def float_input(x: Any, name: str) -> Tuple[np.ndarray, Kind]:
    """A float input as float32 or float16 numpy, and its kind. bfloat16 torch tensors are
    widened to float32 (the result goes back as bfloat16); float64 is computed in float32."""
    torch = _torch_tensor(x)
    if torch is not None:
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        kind = Kind(None, x.dtype, x.device)
    else:
        kind = None
    a = to_numpy(x, name)
    if a.dtype.kind != "f":
        raise TypeError(f"{name} must be an array of floats (float32 or float16), got dtype {a.dtype}")
    if a.dtype not in _FLOATS:
        a = a.astype(np.float32)
    if kind is None:
        kind = Kind(np.asarray(x).dtype)
    return a, kind


def bool_or_float_mask(x: Any, name: str) -> np.ndarray:
    """A mask as a bool array or a float32 array (anything else is a TypeError)."""
    a = to_numpy(x, name)
    if a.dtype == np.bool_:
        return a
    if a.dtype.kind == "f":
        return a.astype(np.float32, copy=False)
    raise TypeError(f"{name} must be bool or floating point, got dtype {a.dtype}")


def size(x: Any, name: str) -> int:
    """A count or index given by the caller: an integer (TypeError otherwise), >= 0 (ValueError
    naming it otherwise; the extension takes unsigned sizes)."""
    if isinstance(x, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        n = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}") from None
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def _optional_of_kinds(x: Optional[Any], name: str, kinds: str, what: str) -> Optional[np.ndarray]:
    """None, or ``x`` as numpy when its dtype kind is one of ``kinds`` (TypeError saying that
    ``name`` must be ``what`` otherwise)."""
    if x is None:
        return None
    a = to_numpy(x, name)
    if a.dtype.kind not in kinds:
        raise TypeError(f"{name} must {what}, got dtype {a.dtype}")
    return a


def index_array(x: Optional[Any], name: str) -> Optional[np.ndarray]:
    a = _optional_of_kinds(x, name, "iu", "hold integers")
    return None if a is None else np.ascontiguousarray(a, dtype=np.int64)


def padding_mask(x: Optional[Any], name: str) -> Optional[np.ndarray]:
    """A Hugging Face ``attention_mask`` ``[batch, keys]`` (1 = a real token) as uint8."""
    a = _optional_of_kinds(x, name, "biuf", "be bool or numeric")
    return None if a is None else np.ascontiguousarray(a != 0, dtype=np.uint8)
