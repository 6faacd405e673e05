"""Type stubs of wgpu_mha. Shapes in brackets; polarities stated on each mask argument.

Array = a numpy array or a torch tensor (float32 or float16, bfloat16 computed in float32,
float64 computed in float32; tensors on another device are copied to the host and back; meta
tensors: ValueError). Results come back as the kind and dtype of the first input.
Errors: ValueError (arguments, shapes, masks, sizes, files, configs), TypeError (types, dtypes),
RuntimeError (no adapter, the device, an input requiring grad where there is no backward),
FileNotFoundError (load of a missing path). docs/python.md ("From Python") tables every difference from
torch.
"""

import os
from typing import Any, Dict, List, Optional, Tuple, Union

Array = Any

__version__: str

class Device:
    """One GPU adapter with its device and queue.

    backend: "vulkan" | "metal" | "dx12" | "gl" (comma-separated list allowed); adapter: a
    case-insensitive substring of the adapter's name. None: the environment variables
    WGPU_BACKEND / WGPU_ADAPTER_NAME, then the first adapter found."""

    def __init__(self, backend: Optional[str] = None, adapter: Optional[str] = None) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def shader_f16(self) -> bool:
        """float16 inputs are computed in float16 (else widened to float32 first)."""
    @property
    def kernel_class(self) -> str:
        """"cpu" (a software adapter's kernel shapes, or WGPU_MHA_KERNELS=cpu) or "gpu"."""
    @property
    def preferred_kv_layout(self) -> str:
        """The page layout this adapter reads fastest: "HND" on a CPU adapter, "NHD" on a GPU."""
    def __repr__(self) -> str: ...

def adapters(backend: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every adapter wgpu finds: dicts with name, backend, device_type, driver, shader_f16. An
    unknown backend: Device(backend=...)'s ValueError."""

def default_device() -> Device:
    """The process-wide Device() every call without device= uses (made on first use)."""

def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    attn_mask: Optional[Array] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    device: Optional[Device] = None,
) -> Array:
    """torch.nn.functional.scaled_dot_product_attention.

    query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev] -> [..., Hq, L, Ev];
    leading dims broadcast as torch's. Hkv == Hq (or 1) unless enable_gqa=True (Hkv divides Hq;
    query head h uses key/value head h // (Hq // Hkv)).
    attn_mask: rank >= 2, broadcast right-aligned to [..., Hq, L, S]. bool: True = the key takes
    part, False = masked out. float: added to the scaled scores. A row with every key masked
    out is zeros (torch's). is_causal: query i sees keys j <= i (top-left); attn_mask must be
    None then. is_causal, enable_gqa: bool (TypeError otherwise, as torch). scale: default
    1/sqrt(E); NaN/inf: ValueError. dropout_p > 0: ValueError (inference only). enable_gqa with
    key and value of different head counts: ValueError (torch accepts it).

    Differentiable: with grad mode on and q, k, v or a float attn_mask requiring grad (all three
    torch tensors), the backward is torch's math on the saved inputs in float64."""

class MultiheadAttention:
    """torch.nn.MultiheadAttention with its weights on the GPU."""

    batch_first: bool
    embed_dim: int
    kdim: int
    vdim: int
    num_heads: int
    @classmethod
    def from_torch(cls, module: Any, *, device: Optional[Device] = None) -> "MultiheadAttention":
        """Copies the module's weights (in_proj or q/k/v_proj for kdim/vdim, biases, bias_k,
        bias_v) and takes num_heads, add_zero_attn, batch_first. Training mode with
        dropout > 0: ValueError (call module.eval())."""
    def __call__(
        self,
        query: Array,
        key: Array,
        value: Array,
        key_padding_mask: Optional[Array] = None,
        need_weights: bool = True,
        attn_mask: Optional[Array] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> Tuple[Array, Optional[Array]]:
        """nn.MultiheadAttention.forward -> (attn_output, attn_output_weights).

        query [N, L, E] (batch_first) or [L, N, E], or unbatched [L, E]; key [.., S, kdim],
        value [.., S, vdim] alike. key_padding_mask [N, S] / [S]: bool True = that key is
        ignored; float: added. attn_mask [L, S] or [N*num_heads, L, S]: bool True = not allowed
        to attend; float: added. is_causal: torch's hint, needs attn_mask (applied as given).
        Output [N, L, E] / [L, N, E] / [L, E]. Weights [N, L, S'] averaged over heads, or
        [N, num_heads, L, S'] with average_attn_weights=False (S' = S + appended bias_k / zero
        keys); None with need_weights=False. A query row that sees no key is torch's ordinary
        path's: NaN (output and weights) with need_weights=True, out_proj.bias with
        need_weights=False (a head that sees no key adds nothing to its row). Tensor inputs must
        have the module's dtype (RuntimeError, torch's rule). No backward: an input requiring
        grad with grad mode on is a RuntimeError (use torch.no_grad() or .detach())."""
    forward = __call__

class KvCache:
    """Keys and values of the tokens decoded so far, on the GPU."""

    def step(
        self, hidden_states: Array, attention_mask: Optional[Array] = None, position_ids: Optional[Array] = None
    ) -> Array:
        """hidden_states [B, n, E] -> [B, n, E]; their keys/values appended. attention_mask
        [B, len + n]: 1 = a real token, 0 = padding, over every token so far and these.
        position_ids [B, n] (RoPE; default len..len+n). Past capacity: ValueError, cache kept.
        No backward: hidden_states requiring grad with grad mode on is a RuntimeError."""
    def __len__(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def batch(self) -> int: ...
    @property
    def dtype(self) -> str:
        """How keys and values are stored: "f32", "f16", "q8_0" or "q4_0"."""
    @property
    def bytes_per_token(self) -> int:
        """Key/value bytes of one token of one sequence (34 per 32 values in q8_0, 18 in q4_0)."""
    def nbytes(self) -> Dict[str, int]:
        """Device bytes held: keys_values, step, scores, per_token."""
    def read_keys_values(self) -> Tuple[Any, Any]:
        """Keys [B, H_kv, len, dk] and values [B, H_kv, len, dv] as float32 NumPy arrays (RoPE
        applied; a quantized cache's as its blocks decode them)."""
    def reset(self) -> None: ...

class HfAttention:
    """One attention module of a saved Hugging Face checkpoint (see load)."""

    @property
    def prefix(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def model_type(self) -> Optional[str]: ...
    @property
    def is_cross_attention(self) -> bool: ...
    @property
    def is_causal(self) -> bool: ...
    @property
    def sliding_window(self) -> Optional[int]: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def uses_rope(self) -> bool: ...
    def forward(
        self,
        hidden_states: Array,
        attention_mask: Optional[Array] = None,
        position_ids: Optional[Array] = None,
        key_value_states: Optional[Array] = None,
    ) -> Array:
        """hidden_states [B, Lq, E] -> [B, Lq, E], with the module's own mask (causal, sliding
        window, T5 relative bias). attention_mask [B, Lk]: 1 = a real token, 0 = padding.
        position_ids [B, Lq]: RoPE positions (default 0..Lq). key_value_states [B, Lk, E]:
        cross-attention modules only. No backward: an input requiring grad with grad mode on
        is a RuntimeError (use torch.no_grad() or .detach())."""
    __call__ = forward
    def kv_cache(self, batch: int, capacity: int, kv_dtype: Optional[str] = None) -> KvCache:
        """A device KV cache (causal self-attention modules only; ValueError otherwise). batch,
        capacity: integers >= 0 (ValueError naming the argument otherwise). kv_dtype: "f32" /
        "f16" (the module's own type only; None picks it), "q8_0" or "q4_0" (llama.cpp's
        blocks; head sizes must be multiples of 32); anything else a ValueError naming it."""

def load(
    path: Union[str, "os.PathLike[str]"],
    layer: Optional[int] = None,
    prefix: Optional[str] = None,
    *,
    device: Optional[Device] = None,
) -> HfAttention:
    """The attention module of a checkpoint directory (config.json + safetensors, sharded or
    not) or safetensors file: by prefix, else the one module of layer (an integer >= 0), else
    the only one."""

class PagedKVCache:
    """One layer's keys and values in pages on the GPU, zeros at first: [max_pages, 2,
    page_size, num_kv_heads, head_dim] (kv_layout "NHD") or [max_pages, 2, num_kv_heads,
    page_size, head_dim] ("HND"). dtype: float32 or float16 (torch.float16, np.float16,
    "float16"; RuntimeError without SHADER_F16, e.g. on GL). page_size: a power of two 1..256."""

    max_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    def __init__(
        self,
        max_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Any = "float32",
        kv_layout: str = "NHD",
        *,
        device: Optional[Device] = None,
    ) -> None: ...
    @classmethod
    def from_array(
        cls, array: Array, kv_layout: str = "NHD", dtype: Any = None, *, device: Optional[Device] = None
    ) -> "PagedKVCache":
        """A copy of a host pool array; dtype defaults to the array's (float16 stays float16,
        other floats become float32)."""
    @property
    def shape(self) -> Tuple[int, int, int, int, int]: ...
    @property
    def dtype(self) -> Any:
        """np.float16 or np.float32."""
    @property
    def kv_layout(self) -> str: ...
    @property
    def device(self) -> Device: ...
    def to_numpy(self) -> Any:
        """A host copy of the whole cache, in its shape and dtype."""

def append_paged_kv_cache(
    append_key: Array,
    append_value: Array,
    batch_indices: Array,
    positions: Array,
    paged_kv_cache: Union[PagedKVCache, Array],
    kv_indices: Array,
    kv_indptr: Array,
    kv_last_page_len: Array,
    kv_layout: Optional[str] = None,
) -> None:
    """FlashInfer's append: token t of append_key/append_value [n, H_kv, D] goes to sequence
    batch_indices[t] at position positions[t] (page kv_indices[kv_indptr[b] + pos // page_size],
    offset pos % page_size; the table after the append). Index arrays int32/int64; every index
    checked first (ValueError naming it), two tokens to one slot a ValueError. paged_kv_cache:
    a PagedKVCache (written on the GPU) or a float numpy array / torch tensor written in place."""

class BatchAttention:
    """FlashInfer's batched attention over a paged KV cache: plan once per step, run per layer."""

    def __init__(self, kv_layout: str = "NHD", *, device: Optional[Device] = None) -> None: ...
    @property
    def kv_layout(self) -> str: ...
    def warm_up(self, num_qo_heads: int, num_kv_heads: int, head_dim: int, *, kv_data_type: Any = None) -> int: ...
    def plan(
        self,
        qo_indptr: Array,
        kv_indptr: Array,
        kv_indices: Array,
        kv_last_page_len: Array,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        causal: bool = True,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        *,
        kv_data_type: Any = None,
    ) -> None:
        """CSR tables (int32/int64; ValueError naming the first bad index). A sequence's query
        rows are its last tokens: with causal, the row at position i sees keys j <= i; window_left
        (-1 = none): and j >= i - window_left. logits_soft_cap c: c·tanh(s/c) (None/0 = none).
        sm_scale: default 1/sqrt(head_dim). kv_data_type: float32 (default) or float16."""
    def run(self, q: Array, paged_kv_cache: Union[PagedKVCache, Array], return_lse: bool = False) -> Any:
        """q [total_q, num_qo_heads, head_dim] (computed in float32) -> out of q's kind and dtype,
        or (out, lse [total_q, num_qo_heads] float32, natural log) with return_lse.
        paged_kv_cache: a PagedKVCache of the planned layout and dtype, or a host array in the
        layout's shape (copied to the GPU for this call)."""

def merge_state(v_a: Array, s_a: Array, v_b: Array, s_b: Array) -> Tuple[Array, Array]:
    """Two attention states over disjoint keys, v [n, H, D] with lse s [n, H] (natural log) ->
    (v, s): s = logaddexp(s_a, s_b), v = v_a·exp(s_a - s) + v_b·exp(s_b - s), in float64 on the
    host; v as v_a's kind and dtype, s float32. s = -inf (no keys) weighs 0."""
