"""Minimal, byte-deterministic safetensors reader/writer shared by the tools.

The official `safetensors` package stores the `__metadata__` map through a hash
map, so the order of its keys (and therefore the file bytes) can change from run
to run.  The fixtures must be reproducible byte for byte, so the generators
write the format themselves here:

    u64 little-endian header length N
    N bytes of JSON header (padded with spaces to a multiple of 8)
    raw little-endian tensor data, tensors back to back in header order

The header is `{"__metadata__": {str: str}, name: {"dtype", "shape",
"data_offsets": [begin, end]}, ...}`; offsets are relative to the end of the
header.  Files written here load with `safetensors.safe_open` and with the Rust
`safetensors` crate (the generators check the former).
"""

import json
import struct

import numpy as np

# numpy dtype -> safetensors dtype tag
_NP_TO_TAG = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("uint8"): "U8",
    np.dtype("int8"): "I8",
    np.dtype("int32"): "I32",
    np.dtype("int64"): "I64",
    np.dtype("bool"): "BOOL",
}
_TAG_TO_NP = {v: k for k, v in _NP_TO_TAG.items()}


class Raw:
    """Tensor given as raw little-endian bytes with an explicit dtype tag
    (used for BF16, which numpy cannot represent)."""

    def __init__(self, tag, shape, data):
        self.tag = tag
        self.shape = list(shape)
        self.data = bytes(data)


def save(path, tensors, metadata):
    """Write `tensors` (name -> numpy array or Raw) with string `metadata`.

    Tensors are laid out in sorted name order; metadata keys are sorted too.
    """
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must be str -> str, got {k!r}: {type(v)}")
    header = {"__metadata__": {k: metadata[k] for k in sorted(metadata)}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, Raw):
            tag, shape, data = t.tag, t.shape, t.data
        else:
            arr = np.ascontiguousarray(t)
            if arr.dtype not in _NP_TO_TAG:
                raise TypeError(f"{name}: unsupported dtype {arr.dtype}")
            tag = _NP_TO_TAG[arr.dtype]
            shape = list(arr.shape)
            data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": tag,
            "shape": [int(s) for s in shape],
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for b in blobs:
            f.write(b)


def load(path):
    """Read a safetensors file into (dict name -> numpy array, metadata).

    BF16 tensors are widened exactly to float32.
    """
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8 : 8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = buf[base + b : base + e]
        tag = info["dtype"]
        shape = info["shape"]
        if tag == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32).reshape(shape)
        else:
            arr = np.frombuffer(raw, dtype=_TAG_TO_NP[tag].newbyteorder("<"))
            arr = arr.astype(_TAG_TO_NP[tag]).reshape(shape)
        out[name] = arr
    return out, meta
