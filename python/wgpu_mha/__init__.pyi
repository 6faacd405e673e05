"""Type stubs of wgpu_mha. Shapes in brackets; polarities stated on each mask argument.

Array = a numpy array or a torch tensor (float32 or float16, bfloat16 computed in float32,
float64 computed in float32; tensors on another device are copied to the host and back; meta
tensors: ValueError). Results come back as the kind and dtype of the first input.
Errors: ValueError (arguments, shapes, masks, sizes, files, configs), TypeError (types, dtypes),
RuntimeError (no adapter, the device, an input requiring grad where there is no backward),
FileNotFoundError (load of a missing path). README "From Python" tables every difference from
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
    def kv_cache(self, batch: int, capacity: int) -> KvCache:
        """A device KV cache (causal self-attention modules only; ValueError otherwise). batch,
        capacity: integers >= 0 (ValueError naming the argument otherwise)."""

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
