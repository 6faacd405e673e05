"""wgpu_mha: Transformer attention on any GPU (Vulkan, Metal, DX12, GL) through wgpu, called like
PyTorch.

* :func:`scaled_dot_product_attention` — ``torch.nn.functional.scaled_dot_product_attention``;
* :class:`MultiheadAttention` — ``MultiheadAttention.from_torch(nn.MultiheadAttention)``;
* :func:`load` — one attention module of a saved Hugging Face checkpoint, with a KV cache;
* :class:`Device`, :func:`adapters` — which GPU (``WGPU_BACKEND``, ``WGPU_ADAPTER_NAME``).

Inputs are numpy arrays or torch CPU tensors (float32, float16; bfloat16 tensors computed in
float32); results come back as the kind and dtype that came in. torch is optional. The GIL is
released while the GPU works; engine errors are ValueError (bad arguments), TypeError (bad
types) or RuntimeError (the device), with the engine's message.
"""

from ._native import Device, __version__
from ._native import adapters as _adapters
from ._device import default_device
from ._sdpa import scaled_dot_product_attention
from ._mha import MultiheadAttention
from ._hf import HfAttention, KvCache, load


def adapters(backend=None):
    """Every adapter wgpu finds (``backend``: "vulkan", "metal", "dx12", "gl" to look at one), as
    dicts with ``name``, ``backend``, ``device_type``, ``driver``, ``shader_f16``."""
    return _adapters(backend)


__all__ = [
    "Device",
    "HfAttention",
    "KvCache",
    "MultiheadAttention",
    "adapters",
    "default_device",
    "load",
    "scaled_dot_product_attention",
    "__version__",
]
