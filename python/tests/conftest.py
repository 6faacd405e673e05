"""Shared helpers: a float64 numpy reference of attention, the repository's fixtures, and a
reader of safetensors files (numpy only)."""

import json
import os
import pathlib
import struct

import numpy as np
import pytest

from tiny_models import decoder_sizes

ROOT = pathlib.Path(__file__).resolve().parents[2]
HF_FIXTURES = ROOT / "tests" / "fixtures" / "hf"

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """(tensors as numpy arrays, metadata) of a safetensors file."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, t in header.items():
        lo, hi = t["data_offsets"]
        tensors[name] = np.frombuffer(raw[base + lo : base + hi], dtype=_DTYPES[t["dtype"]]).reshape(t["shape"])
    return tensors, meta


def reference_sdpa(q, k, v, mask=None, causal=False, scale=None):
    """float64 attention over [..., H, L, E] arrays (k/v heads already matching), torch's
    rules: bool mask True = takes part, float mask added, wholly masked rows give 0."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("...ld,...sd->...ls", q, k) * scale
    L, S = s.shape[-2:]
    if causal:
        keep = np.tril(np.ones((L, S), dtype=bool))
        s = np.where(keep, s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    tot = e.sum(-1, keepdims=True)
    p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
    return p @ v


def tiny_llama_config(transformers, max_position_embeddings=64):
    """A two-layer llama config (hidden 32, 4 heads over 2 key/value heads: GQA, RoPE), eager."""
    cfg = transformers.LlamaConfig(**decoder_sizes(max_positions=max_position_embeddings))
    cfg._attn_implementation = "eager"
    return cfg


@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch")
