"""The extension module under wgpu_mha (see wgpu_mha/__init__.pyi for the public API).
Arrays are numpy; q/k/v [B, H, L, D] float32 or float16; results float32."""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

__version__: str

class Device:
    def __init__(self, backend: Optional[str] = None, adapter: Optional[str] = None) -> None: ...
    name: str
    backend: str
    shader_f16: bool
    kernel_class: str  # "cpu" or "gpu"
    preferred_kv_layout: str  # "HND" on a CPU adapter, "NHD" on a GPU

def adapters(backend: Optional[str] = None) -> List[Dict[str, Any]]: ...
def sdpa(
    device: Device,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    mask: Optional[np.ndarray] = None,
    causal: bool = False,
    scale: Optional[float] = None,
    return_probs: bool = False,
    *,
    window: Optional[int] = None,
    bottom_right: bool = False,
    softcap: Optional[float] = None,
    sinks: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """mask: rank 4, each dim full or 1; bool/uint8 nonzero = takes part, float32 added.
    causal: query i sees keys j <= i (top-left), j <= i + Lk - Lq with bottom_right; window
    (causal only): and j > i - window. softcap: s -> c·tanh(s/c) before the mask. sinks: float32
    [H] logits joining each softmax's denominator. Wholly masked rows are the engine's (mean of
    V / NaN), not zeroed. probs need float32 inputs (multi-pass path)."""

class Mha:
    def __init__(self, device: Device, safetensors: bytes, heads: int, add_zero_attn: bool = False) -> None: ...
    embed_dim: int
    kdim: int
    vdim: int
    num_heads: int
    appended_keys: int
    def forward(
        self, query: np.ndarray, key: np.ndarray, value: np.ndarray, bias: Optional[np.ndarray] = None, need_weights: bool = False
    ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """Batch-first [B, L, *]; bias float32 [B|1, H|1, Lq|1, Lk|1] added (−inf = not allowed)."""

class HfKvCache:
    def step(
        self, hidden_states: np.ndarray, attention_mask: Optional[np.ndarray] = None, position_ids: Optional[np.ndarray] = None
    ) -> np.ndarray: ...
    def __len__(self) -> int: ...
    capacity: int
    batch: int
    dtype: str
    bytes_per_token: int
    def nbytes(self) -> Dict[str, int]: ...
    def read_keys_values(self) -> Tuple[np.ndarray, np.ndarray]: ...
    def reset(self) -> None: ...

class HfModule:
    def __init__(self, device: Device, path: str, layer: Optional[int] = None, prefix: Optional[str] = None) -> None: ...
    prefix: str
    family: str
    model_type: Optional[str]
    is_cross_attention: bool
    is_causal: bool
    sliding_window: Optional[int]
    hidden_size: int
    num_heads: int
    num_key_value_heads: int
    uses_rope: bool
    def forward(
        self,
        hidden_states: np.ndarray,
        attention_mask: Optional[np.ndarray] = None,
        position_ids: Optional[np.ndarray] = None,
        key_value_states: Optional[np.ndarray] = None,
    ) -> np.ndarray: ...
    def kv_cache(self, batch: int, capacity: int, kv_dtype: Optional[str] = None) -> HfKvCache: ...

def kv_dtype_name(name: str) -> str: ...

class PagedPool:
    """One layer's pages on the device. data: float32/float16 in the layout's shape."""

    def __init__(
        self,
        device: Device,
        max_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        kv_layout: str,
        f16: bool,
        data: Optional[np.ndarray] = None,
    ) -> None: ...
    shape: List[int]
    kv_layout: str
    f16: bool
    def read(self) -> np.ndarray:
        """The whole pool as float32 in its layout's shape."""
    def append(self, keys: np.ndarray, values: np.ndarray, slots: np.ndarray) -> None:
        """keys, values float32 [n, kv_heads, head_dim]; slots int64 [n] (page·page_size +
        offset; negative skips)."""

class WarmPasses:
    """Every paged attention pass a plan of these heads can pick, compiled and held."""

    def __init__(self, device: Device, num_qo_heads: int, num_kv_heads: int, head_dim: int, kv_dtype: str) -> None: ...
    def __len__(self) -> int: ...

class BatchPlan:
    """Tables uint32; always plans the lse."""

    def __init__(
        self,
        device: Device,
        qo_indptr: np.ndarray,
        kv_indptr: np.ndarray,
        kv_indices: np.ndarray,
        kv_last_page_len: np.ndarray,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        kv_layout: str,
        f16: bool,
        causal: bool,
        window_left: Optional[int] = None,
        softcap: Optional[float] = None,
        scale: Optional[float] = None,
    ) -> None: ...
    total_q: int
    chunk_keys: int
    def run(self, q: np.ndarray, pool: PagedPool, return_lse: bool) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """q float32 [total_q, H, D] -> (out [total_q, H, D], lse [total_q, H] natural log, or None)."""

def check_page_table(
    kv_indptr: np.ndarray, kv_indices: np.ndarray, kv_last_page_len: np.ndarray, max_pages: int, page_size: int
) -> None:
    """uint32 arrays; ValueError naming the first bad index."""
