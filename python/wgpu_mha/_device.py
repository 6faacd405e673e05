"""The process-wide default device, made on first use."""

from __future__ import annotations

import threading
from typing import Optional

from . import _native

_lock = threading.Lock()
_default: Optional[_native.Device] = None


def default_device() -> _native.Device:
    """``Device()`` (``WGPU_BACKEND`` / ``WGPU_ADAPTER_NAME`` honoured), made once."""
    global _default
    with _lock:
        if _default is None:
            _default = _native.Device()
        return _default


def resolve(device: Optional[_native.Device]) -> _native.Device:
    if device is None:
        return default_device()
    if not isinstance(device, _native.Device):
        raise TypeError(f"device must be a wgpu_mha.Device, got {type(device).__name__}")
    return device
