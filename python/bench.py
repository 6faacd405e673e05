"""Per-call overhead of the Python path against the Rust path on the same adapter.

    python python/bench.py [--iters N]

For each shape: the median milliseconds of one host-to-host causal attention call
(upload q, k, v; run the core; read the output back) made
  * in Rust, in a loop inside the extension (no Python between calls: the Rust path);
  * from Python through the raw binding ``wgpu_mha._native.sdpa`` (numpy [B, H, L, D]);
  * through ``wgpu_mha.scaled_dot_product_attention`` with numpy arrays and with torch
    tensors (torch's argument rules, broadcasting, conversion back);
and torch's own CPU ``scaled_dot_product_attention`` for scale. The overhead is the Python
figures less the Rust one. WGPU_BACKEND / WGPU_ADAPTER_NAME pick the adapter.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

# Run as a script, this directory comes first on sys.path, and its wgpu_mha/ holds the sources
# without the built extension: import the installed package instead.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import wgpu_mha  # noqa: E402
from wgpu_mha import _native  # noqa: E402

SHAPES = [
    # (name, B, H, Hkv, L, S, D)
    ("decode b=1 h=8 kvh=2 d=64 ctx=128", 1, 8, 2, 1, 128, 64),
    ("prefill b=1 h=8 kvh=2 d=64 L=64", 1, 8, 2, 64, 64, 64),
    ("tiny b=2 h=4 d=8 L=8", 2, 4, 4, 8, 8, 8),
]


def median_ms(fn, iters):
    fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    dev = wgpu_mha.default_device()
    print(f"adapter: {dev!r}")
    try:
        import torch
    except ImportError:
        torch = None
    rows = []
    for name, b, h, hkv, l, s, d in SHAPES:
        rng = np.random.default_rng(0)
        q = rng.standard_normal((b, h, l, d), dtype=np.float32)
        k = rng.standard_normal((b, hkv, s, d), dtype=np.float32)
        v = rng.standard_normal((b, hkv, s, d), dtype=np.float32)
        rust = _native.bench_rust_sdpa(dev, b, h, hkv, l, s, d, args.iters)
        raw = median_ms(lambda: _native.sdpa(dev, q, k, v, None, True), args.iters)
        wrapped = median_ms(
            lambda: wgpu_mha.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), args.iters
        )
        row = [name, rust, raw, wrapped]
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            row.append(
                median_ms(
                    lambda: wgpu_mha.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True),
                    args.iters,
                )
            )
            row.append(
                median_ms(
                    lambda: torch.nn.functional.scaled_dot_product_attention(
                        tq, tk, tv, is_causal=True, enable_gqa=True
                    ),
                    args.iters,
                )
            )
        rows.append(row)
    head = ["shape", "Rust", "_native.sdpa", "sdpa(numpy)", "sdpa(torch)", "torch CPU"]
    print(" | ".join(head[: len(rows[0])]))
    for r in rows:
        cells = [r[0]] + [f"{x:.3f} ms" for x in r[1:]]
        over = f"  (Python overhead: +{r[3] - r[1]:.3f} ms numpy" + (
            f", +{r[4] - r[1]:.3f} ms torch)" if len(r) > 4 else ")"
        )
        print(" | ".join(cells) + over)


if __name__ == "__main__":
    main()
