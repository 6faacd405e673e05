"""wgpu_mha: Transformer attention on any GPU (Vulkan, Metal, DX12, GL) through wgpu, called like
PyTorch.

* :func:`scaled_dot_product_attention` — ``torch.nn.functional.scaled_dot_product_attention``;
* :class:`MultiheadAttention` — ``MultiheadAttention.from_torch(nn.MultiheadAttention)``;
* :func:`load` — one attention module of a saved Hugging Face checkpoint, with a KV cache;
* :class:`BatchAttention`, :class:`PagedKVCache`, :func:`append_paged_kv_cache`,
  :func:`merge_state` — serving many sequences from a paged KV cache, FlashInfer's names;
* :class:`Device`, :func:`adapters` — which GPU (``WGPU_BACKEND``, ``WGPU_ADAPTER_NAME``).
* :mod:`wgpu_mha.transformers` — ``register()`` (``attn_implementation="wgpu_mha"``) and
  ``accelerate(model)`` for Hugging Face transformers (imported on its own: needs transformers).

Inputs are numpy arrays or torch tensors (float32, float16; bfloat16 and float64 computed in
float32); results come back as the kind and dtype that came in. torch is optional.
scaled_dot_product_attention (and the transformers backend) is differentiable; the modules have
no backward and refuse inputs requiring grad (RuntimeError). The GIL is released while the GPU
works; engine errors are ValueError (bad arguments), TypeError (bad types) or RuntimeError (the
device), with the engine's message.
"""

import importlib.util as _ilu
import os as _os
import sys as _sys


def _load_triton_first():
    """Triton's bundled LLVM segfaults when its library is loaded after Mesa's LLVM (lavapipe,
    llvmpipe, radeonsi), as transformers and torch.compile load it lazily once a device is
    open: load it first where it is installed (0.3 s). WGPU_MHA_NO_TRITON_PRELOAD=1 skips it."""
    if "triton" in _sys.modules or _os.environ.get("WGPU_MHA_NO_TRITON_PRELOAD") == "1":
        return
    try:
        if _ilu.find_spec("triton") is not None:
            import triton  # noqa: F401
    except Exception:  # a broken triton install is not ours to report
        pass


_load_triton_first()

from ._native import Device, __version__  # noqa: E402
from ._native import adapters as _adapters  # noqa: E402
from ._device import default_device  # noqa: E402
from ._sdpa import scaled_dot_product_attention  # noqa: E402
from ._mha import MultiheadAttention  # noqa: E402
from ._hf import HfAttention, KvCache, load  # noqa: E402
from ._serve import BatchAttention, PagedKVCache, append_paged_kv_cache, merge_state  # noqa: E402


def adapters(backend=None):
    """Every adapter wgpu finds (``backend``: "vulkan", "metal", "dx12", "gl" to look at one), as
    dicts with ``name``, ``backend``, ``device_type``, ``driver``, ``shader_f16``."""
    return _adapters(backend)


__all__ = [
    "BatchAttention",
    "Device",
    "HfAttention",
    "KvCache",
    "MultiheadAttention",
    "PagedKVCache",
    "adapters",
    "append_paged_kv_cache",
    "default_device",
    "load",
    "merge_state",
    "scaled_dot_product_attention",
    "__version__",
]
