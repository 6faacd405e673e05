"""Serving many sequences with FlashInfer's names: a paged KV cache on the device
(:class:`PagedKVCache`), ragged appends (:func:`append_paged_kv_cache`), batched attention
planned once per step and run per layer (:class:`BatchAttention`), and :func:`merge_state`.

A sequence's keys and values live in pages of ``page_size`` tokens, listed by FlashInfer's CSR
table: ``kv_indptr [n+1]``, ``kv_indices`` (page ids), ``kv_last_page_len [n]`` (1..page_size).
Query rows are packed ``[total_q, H, D]`` with ``qo_indptr [n+1]``; a sequence's query rows are
its **last** tokens (bottom-right causal).
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Tuple

import numpy as np

from . import _native
from ._convert import Kind, _torch_tensor, float_input, size, to_numpy
from ._device import resolve

_U32_MAX = 2**32 - 1


def _layout(kv_layout: Any) -> str:
    if not isinstance(kv_layout, str) or kv_layout.upper() not in ("NHD", "HND"):
        raise ValueError(f'kv_layout must be "NHD" or "HND", got {kv_layout!r}')
    return kv_layout.upper()


_QUANTIZED = ("q8_0", "q4_0")


def _kv_dtype(dtype: Any, name: str) -> str:
    """The native pool type: "f16" for float16 (torch.float16, np.float16, "float16"), "f32" for
    float32 (those, or None), or llama.cpp's blocks "q8_0" / "q4_0" (head sizes of whole blocks
    of 32; values are quantized on append and read back dequantized, as float32)."""
    if dtype is None:
        return "f32"
    if isinstance(dtype, str) and dtype.lower() in _QUANTIZED:
        return dtype.lower()
    if type(dtype).__module__ == "torch":
        text = str(dtype).replace("torch.", "")  # a torch.dtype
    else:
        try:
            text = np.dtype(dtype).name
        except TypeError:
            text = str(dtype)
    if text in ("float16", "float32"):
        return "f16" if text == "float16" else "f32"
    raise TypeError(f"{name} must be float32 or float16 (or \"q8_0\", \"q4_0\"), got {dtype!r}")


def _kv_name(kv: str) -> str:
    return {"f32": "float32", "f16": "float16"}.get(kv, kv)


def _indices(x: Any, name: str) -> np.ndarray:
    """A 1-D integer array as int64, every value in 0 ..= 2³²−1 (ValueError naming the first
    one that is not)."""
    a = to_numpy(x, name)
    if a.size == 0 and a.dtype.kind == "f":
        a = a.astype(np.int64)  # an empty list
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an array of integers (int32 or int64), got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    a = a.astype(np.int64) if a.dtype != np.uint64 else a
    bad = np.flatnonzero((a < 0) | (a > _U32_MAX))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] is {a[i]}: out of range (0 ..= {_U32_MAX})")
    return np.ascontiguousarray(a, dtype=np.int64)


def _sizes(**named: Any) -> list:
    """Each argument as a size (`size`'s checks, naming it), in order."""
    return [size(x, name) for name, x in named.items()]


def _u32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.uint32)


def _pool_shape(layout: str, max_pages: int, page_size: int, kv_heads: int, head_dim: int) -> tuple:
    if layout == "NHD":
        return (max_pages, 2, page_size, kv_heads, head_dim)
    return (max_pages, 2, kv_heads, page_size, head_dim)


def _pool_dims(shape: tuple, layout: str, name: str) -> Tuple[int, int, int, int]:
    """(max_pages, page_size, kv_heads, head_dim) of a host pool array's shape."""
    want = "[max_pages, 2, page_size, H_kv, D]" if layout == "NHD" else "[max_pages, 2, H_kv, page_size, D]"
    if len(shape) != 5 or shape[1] != 2:
        raise ValueError(f"{name} must be {want} ({layout}), got shape {tuple(shape)}")
    p, _, a, b, d = shape
    return (p, a, b, d) if layout == "NHD" else (p, b, a, d)


class PagedKVCache:
    """One layer's keys and values in pages on the GPU: ``[max_pages, 2, page_size, H_kv, D]``
    (``kv_layout="NHD"``) or ``[max_pages, 2, H_kv, page_size, D]`` (``"HND"``), zeros at first.
    ``dtype``: float32, or float16 where the adapter has ``SHADER_F16`` (RuntimeError otherwise,
    e.g. on GL). ``page_size``: a power of two from 1 to 256."""

    def __init__(
        self,
        max_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Any = "float32",
        kv_layout: str = "NHD",
        *,
        device: Optional[_native.Device] = None,
        _data: Optional[np.ndarray] = None,
    ):
        self._device = resolve(device)
        self._layout = _layout(kv_layout)
        self._kv = _kv_dtype(dtype, "dtype")
        dims = [size(x, n) for x, n in ((max_pages, "max_pages"), (page_size, "page_size"),
                                        (num_kv_heads, "num_kv_heads"), (head_dim, "head_dim"))]
        self.max_pages, self.page_size, self.num_kv_heads, self.head_dim = dims
        self._native = _native.PagedPool(self._device, *dims, self._layout, self._kv, _data)

    @classmethod
    def from_array(
        cls, array: Any, kv_layout: str = "NHD", dtype: Any = None, *, device: Optional[_native.Device] = None
    ) -> "PagedKVCache":
        """A cache holding a copy of ``array`` (numpy or torch, in ``kv_layout``'s shape).
        ``dtype`` defaults to the array's: float16 stays float16, any other float is float32."""
        layout = _layout(kv_layout)
        a, _ = float_input(array, "array")
        dims = _pool_dims(a.shape, layout, "array")
        if dtype is None:
            dtype = "float16" if a.dtype == np.float16 else "float32"
        return cls(*dims, dtype=dtype, kv_layout=layout, device=device, _data=np.ascontiguousarray(a))

    @property
    def shape(self) -> tuple:
        return _pool_shape(self._layout, self.max_pages, self.page_size, self.num_kv_heads, self.head_dim)

    @property
    def dtype(self) -> np.dtype:
        """What :meth:`to_numpy` gives: float16 for a float16 cache, else float32 (a q8_0 /
        q4_0 cache's blocks dequantized; see :attr:`kv_dtype`)."""
        return np.dtype(np.float16 if self._kv == "f16" else np.float32)

    @property
    def kv_dtype(self) -> str:
        """How the cache stores its values: "float32", "float16", "q8_0" or "q4_0"."""
        return _kv_name(self._kv)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's keys and values take (q8_0: 34 per 32 values, q4_0: 18)."""
        return self._native.bytes_per_token

    @property
    def kv_layout(self) -> str:
        return self._layout

    @property
    def device(self) -> _native.Device:
        return self._device

    def to_numpy(self) -> np.ndarray:
        """A copy of the whole cache on the host, in its shape and dtype."""
        return self._native.read().astype(self.dtype, copy=False)

    def __repr__(self) -> str:
        return (
            f"wgpu_mha.PagedKVCache(shape={self.shape}, kv_dtype={self.kv_dtype}, kv_layout={self._layout!r})"
        )


def _slots(batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, n, max_pages, page_size):
    """Each new token's slot ``page·page_size + offset``, every index checked."""
    b = _indices(batch_indices, "batch_indices")
    pos = _indices(positions, "positions")
    indptr = _indices(kv_indptr, "kv_indptr")
    indices = _indices(kv_indices, "kv_indices")
    last = _indices(kv_last_page_len, "kv_last_page_len")
    for name, a in (("batch_indices", b), ("positions", pos)):
        if a.shape[0] != n:
            raise ValueError(f"{name} has {a.shape[0]} entries, expected one per appended token ({n})")
    _native.check_page_table(_u32(indptr), _u32(indices), _u32(last), max_pages, page_size)
    seqs = last.shape[0]
    bad = np.flatnonzero(b >= seqs)
    if bad.size:
        t = int(bad[0])
        raise ValueError(f"batch_indices[{t}] is {b[t]}, but the page table has {seqs} sequences")
    pages = indptr[1:] - indptr[:-1]
    tokens = np.where(pages > 0, (pages - 1) * page_size + last, 0)
    bad = np.flatnonzero(pos >= tokens[b])
    if bad.size:
        t = int(bad[0])
        raise ValueError(
            f"positions[{t}] is {pos[t]}, past sequence {b[t]}'s {tokens[b[t]]} tokens "
            f"(kv_indptr, kv_last_page_len count the tokens after the append)"
        )
    slots = indices[indptr[b] + pos // page_size] * page_size + pos % page_size
    uniq, first, counts = np.unique(slots, return_index=True, return_counts=True)
    if (counts > 1).any():
        s = uniq[counts > 1][0]
        t0, t1 = np.flatnonzero(slots == s)[:2]
        raise ValueError(f"tokens {t0} and {t1} are both appended to sequence {b[t0]}'s position {pos[t0]}")
    return slots


def append_paged_kv_cache(
    append_key: Any,
    append_value: Any,
    batch_indices: Any,
    positions: Any,
    paged_kv_cache: Any,
    kv_indices: Any,
    kv_indptr: Any,
    kv_last_page_len: Any,
    kv_layout: Optional[str] = None,
) -> None:
    """FlashInfer's ``append_paged_kv_cache``: token ``t`` of ``append_key``/``append_value``
    ``[n, H_kv, D]`` goes to sequence ``batch_indices[t]`` at position ``positions[t]``, i.e. page
    ``kv_indices[kv_indptr[b] + pos // page_size]``, offset ``pos % page_size``. The table is
    the one *after* the append (each position below its sequence's tokens). Every index is
    checked first (ValueError naming it); two tokens to one slot is a ValueError.

    ``paged_kv_cache``: a :class:`PagedKVCache` (written on the GPU), or a host pool array
    (numpy, or a torch tensor) written in place; ``kv_layout`` defaults to the cache's own, "NHD"
    for an array."""
    is_cache = isinstance(paged_kv_cache, PagedKVCache)
    if is_cache:
        layout = paged_kv_cache.kv_layout
        if kv_layout is not None and _layout(kv_layout) != layout:
            raise ValueError(f"kv_layout {kv_layout!r}, but the cache is {layout}")
        max_pages, page_size = paged_kv_cache.max_pages, paged_kv_cache.page_size
        kv_heads, head_dim = paged_kv_cache.num_kv_heads, paged_kv_cache.head_dim
    else:
        layout = _layout("NHD" if kv_layout is None else kv_layout)
        torch = _torch_tensor(paged_kv_cache)
        _check_host_pool(paged_kv_cache, torch)
        max_pages, page_size, kv_heads, head_dim = _pool_dims(tuple(paged_kv_cache.shape), layout, "paged_kv_cache")
    k, _ = float_input(append_key, "append_key")
    v, _ = float_input(append_value, "append_value")
    n = k.shape[0] if k.ndim else 0
    for name, a in (("append_key", k), ("append_value", v)):
        if a.shape != (n, kv_heads, head_dim):
            raise ValueError(f"{name} must be [n, H_kv {kv_heads}, D {head_dim}] with n = {n}, got shape {a.shape}")
    slots = _slots(batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, n, max_pages, page_size)
    if n == 0:
        return
    if is_cache:
        f32 = [np.ascontiguousarray(a, dtype=np.float32) for a in (k, v)]
        paged_kv_cache._native.append(f32[0], f32[1], slots)
        return
    page, offset = slots // page_size, slots % page_size
    if torch is not None:
        page, offset = torch.from_numpy(page), torch.from_numpy(offset)
    for which, a in ((0, k), (1, v)):
        if torch is not None:
            a = torch.from_numpy(np.ascontiguousarray(a)).to(device=paged_kv_cache.device, dtype=paged_kv_cache.dtype)
        half = paged_kv_cache[:, which]  # a view: [max_pages, page_size, H_kv, D] or [.., H_kv, page_size, D]
        if layout == "NHD":
            half[page, offset] = a
        else:
            half[page, :, offset] = a


def _check_host_pool(pool: Any, torch: Any) -> None:
    """TypeError unless ``pool`` is a float numpy array or torch tensor (written in place)."""
    if torch is not None:
        floats = pool.is_floating_point()
    else:
        floats = isinstance(pool, np.ndarray) and pool.dtype.kind == "f"
    if not floats:
        raise TypeError(
            "paged_kv_cache must be a wgpu_mha.PagedKVCache, or a float numpy array or torch tensor to "
            f"write in place; got {type(pool).__name__} {getattr(pool, 'dtype', '')}"
        )


class BatchAttention:
    """FlashInfer's batched attention over a paged KV cache: :meth:`plan` once per step (the
    table checked, each sequence's keys split to fill the device), then :meth:`run` for every
    layer. ``kv_layout``: "NHD" (default) or "HND", the layout of the caches given to run."""

    def __init__(self, kv_layout: str = "NHD", *, device: Optional[_native.Device] = None):
        self._layout = _layout(kv_layout)
        self._device = resolve(device)
        self._plan = None
        self._kv = "f32"
        self._warm = []

    @property
    def kv_layout(self) -> str:
        return self._layout

    def warm_up(self, num_qo_heads: int, num_kv_heads: int, head_dim: int, *, kv_data_type: Any = None) -> int:
        """Compiles every attention pass a :meth:`plan` of these heads can pick on this device
        (each at every width of query rows, and the merge of split keys), so that no step pays
        for compiling — on a software adapter that is most of a second at the first plan. The
        passes stay compiled while this object lives. Not in FlashInfer, whose plan compiles
        ahead of time. Returns how many passes are held."""
        dims = _sizes(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)
        kv = _kv_dtype(kv_data_type, "kv_data_type")
        warm = _native.WarmPasses(self._device, *dims, kv)
        self._warm.append(warm)
        return len(warm)

    def plan(
        self,
        qo_indptr: Any,
        kv_indptr: Any,
        kv_indices: Any,
        kv_last_page_len: Any,
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
        """Checks the table (ValueError naming the first bad index) and plans the step.

        ``causal``: a sequence's query row at position ``i`` sees keys ``j <= i`` (its rows are
        its last tokens). ``window_left`` (FlashInfer's): and ``j >= i - window_left``; -1 = no
        window. ``logits_soft_cap`` ``c``: scores become ``c·tanh(s/c)`` (None or 0 = none).
        ``sm_scale``: default ``1/sqrt(head_dim)``. ``kv_data_type``: the caches' dtype,
        float32 (default), float16 (RuntimeError without ``SHADER_F16``), "q8_0" or "q4_0".

        The plan always writes the log-sum-exp, so :meth:`run` returns it or not without
        planning again (``total_q × H`` floats more per layer; read back only when asked)."""
        if not isinstance(causal, (bool, np.bool_)):
            raise TypeError(f"causal must be bool, got {type(causal).__name__}")
        window = _integer(window_left, "window_left")
        if window < -1:
            raise ValueError(f"window_left must be -1 (no window) or >= 0, got {window}")
        cap = None if logits_soft_cap in (None, 0, 0.0) else _positive(logits_soft_cap, "logits_soft_cap")
        scale = None if sm_scale is None else _positive(sm_scale, "sm_scale")
        tables = [
            _u32(_indices(x, name))
            for x, name in (
                (qo_indptr, "qo_indptr"),
                (kv_indptr, "kv_indptr"),
                (kv_indices, "kv_indices"),
                (kv_last_page_len, "kv_last_page_len"),
            )
        ]
        dims = _sizes(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size)
        kv = _kv_dtype(kv_data_type, "kv_data_type")
        self._plan = _native.BatchPlan(
            self._device, *tables, *dims, self._layout, kv, bool(causal), None if window < 0 else window, cap, scale
        )
        self._kv = kv
        self._dims = dims

    def run(self, q: Any, paged_kv_cache: Any, return_lse: bool = False):
        """``q [total_q, num_qo_heads, head_dim]`` over ``paged_kv_cache`` → ``out [total_q,
        num_qo_heads, head_dim]`` of q's kind and dtype, and with ``return_lse`` the pair ``(out,
        lse [total_q, num_qo_heads])``, lse float32 in natural log. q is computed in float32
        (float16, bfloat16, float64 cast). ``paged_kv_cache``: a :class:`PagedKVCache` of the
        planned layout and dtype, or a host array in the plan's layout (copied to the GPU for
        this call, in the planned dtype)."""
        if self._plan is None:
            raise RuntimeError("BatchAttention.run before plan: call plan(...) first")
        qa, kind = float_input(q, "q")
        qa = np.ascontiguousarray(qa, dtype=np.float32)
        _, hkv, d, ps = self._dims
        want_dtype = _kv_name(self._kv)
        if isinstance(paged_kv_cache, PagedKVCache):
            c = paged_kv_cache
            if c.kv_layout != self._layout:
                raise ValueError(f"the cache is {c.kv_layout}, but this BatchAttention is {self._layout}")
            if c._kv != self._kv:
                raise ValueError(f"the cache is {c.kv_dtype}, but the plan's kv_data_type is {want_dtype}")
            if c.device is not self._device:
                raise ValueError("the cache lives on another wgpu_mha.Device than this BatchAttention")
            pool = c._native
        else:
            a, _ = float_input(paged_kv_cache, "paged_kv_cache")
            dims = _pool_dims(a.shape, self._layout, "paged_kv_cache")
            if dims[1:] != (ps, hkv, d):
                raise ValueError(
                    f"paged_kv_cache of shape {a.shape} is not the planned {self._layout} pool "
                    f"(page_size {ps}, num_kv_heads {hkv}, head_dim {d})"
                )
            a = a if (self._kv == "f16" and a.dtype == np.float16) else a.astype(np.float32, copy=False)
            pool = _native.PagedPool(self._device, *dims, self._layout, self._kv, np.ascontiguousarray(a))
        out, lse = self._plan.run(qa, pool, bool(return_lse))
        out = kind.back(out)
        if not return_lse:
            return out
        return out, _float32_like(kind).back(lse)


def _float32_like(kind: Kind) -> Kind:
    """float32 results of the kind (numpy, or torch on its device) of an input."""
    if kind.torch_dtype is None:
        return Kind(np.float32)
    import torch

    return Kind(None, torch.float32, kind.torch_device)


def _positive(x: Any, name: str) -> float:
    value = float(x)
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {x!r}")
    return value


def _integer(x: Any, name: str) -> int:
    if isinstance(x, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}") from None


def _float64(x: Any, name: str) -> np.ndarray:
    a = to_numpy(x, name)
    if a.dtype.kind != "f":
        raise TypeError(f"{name} must be an array of floats, got dtype {a.dtype}")
    return a.astype(np.float64)


def merge_state(v_a: Any, s_a: Any, v_b: Any, s_b: Any):
    """Merges two attention states over disjoint key sets (FlashInfer's ``merge_state``):
    ``v [n, H, D]`` with its log-sum-exp ``s [n, H]`` (natural log) → ``(v, s)``, ``s =
    logaddexp(s_a, s_b)``, ``v = v_a·exp(s_a − s) + v_b·exp(s_b − s)``. A side with ``s = −inf``
    (no keys) has weight 0; both: ``v = 0``, ``s = −inf``. Computed in float64 on the host; ``v``
    comes back as ``v_a``'s kind and dtype, ``s`` as float32 of that kind."""
    _, kind = float_input(v_a, "v_a")  # the result's kind; the values as given, in float64
    va, vb, sa, sb = (_float64(x, n) for x, n in ((v_a, "v_a"), (v_b, "v_b"), (s_a, "s_a"), (s_b, "s_b")))
    if va.ndim != 3 or vb.shape != va.shape:
        raise ValueError(f"v_a and v_b must both be [n, H, D], got {va.shape} and {vb.shape}")
    for name, s in (("s_a", sa), ("s_b", sb)):
        if s.shape != va.shape[:2]:
            raise ValueError(f"{name} must be [n, H] = {va.shape[:2]}, got {s.shape}")
    s = np.logaddexp(sa, sb)
    live = np.isfinite(s)
    safe = np.where(live, s, 0.0)
    wa = np.where(live, np.exp(sa - safe), 0.0)[..., None]
    wb = np.where(live, np.exp(sb - safe), 0.0)[..., None]
    v = va * wa + vb * wb
    return kind.back(v), _float32_like(kind).back(s)
