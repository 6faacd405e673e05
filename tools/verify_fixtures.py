#!/usr/bin/env python3
"""Check the fixtures with an independent numpy float64 implementation.

For every case file in tests/fixtures/ (or --dir):
  * dtypes/shapes follow DESIGN.md's case-file rules;
  * numpy f64 forward on the stored f32 data matches `out_f64` (< --tol) and
    `attn_f64`; `err_f32_vs_f64` equals max|out - out_f64|;
  * every fully masked query row equals the mean of the projected V over all
    keys (per-head: directly; classic: after W_o).
For every file in tests/fixtures/weights/: numpy nn.MultiheadAttention / classic
forward on the stored weights matches `out_f64`.
Also opens each file with the official `safetensors` package when installed.

Needs only numpy (torch is not used).  Exit status 1 on any failure.
"""

import argparse
import glob
import json
import os
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

FILL = -1e9


def linear(x, w, b):
    return x @ w.T + b


def softmax(s):
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    return e / e.sum(axis=-1, keepdims=True)


def attend(q, k, v, scale, keep):
    """q [B,H,Lq,dq], k [B,H,Lk,dq], v [B,H,Lk,dv], keep broadcast to [B,H,Lq,Lk]."""
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if keep is not None:
        s = np.where(np.broadcast_to(keep, s.shape), s, FILL)
    p = softmax(s)
    return np.matmul(p, v), p


def split(x, h, d):
    b, n, _ = x.shape
    return x.reshape(b, n, h, d).transpose(0, 2, 1, 3)


def merge(x):
    b, h, n, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def f64(t, name):
    return t[name].astype(np.float64)


def check_case(path, tol):
    t, meta = st_io.load(path)
    variant = meta["variant"]
    cfg = json.loads(meta["config"])
    sz = cfg["sizes"]
    problems = []
    if variant == "dmodel":
        d, h = sz["d_model"], sz["num_heads"]
        dk = d // h
        for n in ["Q", "K", "V"] + [f"W_{x}.{y}" for x in "qkvo" for y in ("weight", "bias")]:
            assert t[n].dtype == np.float32, n
        W = {x: (f64(t, f"W_{x}.weight"), f64(t, f"W_{x}.bias")) for x in "qkvo"}
        q = split(linear(f64(t, "Q"), *W["q"]), h, dk)
        k = split(linear(f64(t, "K"), *W["k"]), h, dk)
        vp = linear(f64(t, "V"), *W["v"])
        v = split(vp, h, dk)
        keep = None
        if "mask" in t:
            assert t["mask"].dtype == np.uint8 and t["mask"].ndim == 4
            keep = t["mask"] != 0
        ctx, p = attend(q, k, v, 1.0 / np.sqrt(dk), keep)
        out = linear(merge(ctx), *W["o"])
        B, Lq, Lk = q.shape[0], q.shape[2], k.shape[2]
        if keep is not None:
            full = ~np.broadcast_to(keep, (B, h, Lq, Lk)).any(-1)  # [B,H,Lq]
            mean_v = linear(np.broadcast_to(vp.mean(axis=1, keepdims=True), (B, Lq, d)).copy(), *W["o"])
            # only rows fully masked in every head reduce to W_o(mean V)
            rows = full.all(axis=1)
            for b_, i in zip(*np.nonzero(rows)):
                e = np.abs(t["out_f64"][b_, i] - mean_v[b_, i]).max()
                if e > tol:
                    problems.append(f"fully masked row ({b_},{i}) != W_o(mean V): {e:.3e}")
            n_full = int(rows.sum())
        else:
            n_full = 0
    elif variant == "perhead":
        e_, qk, vs, h = sz["emb_size"], sz["q_k_size"], sz["v_size"], sz["head"]
        for n in ["x_q", "x_k_v"] + [f"w_{x}.{y}" for x in "qkv" for y in ("weight", "bias")]:
            assert t[n].dtype == np.float32, n
        assert "W_o.weight" not in t and "w_o.weight" not in t
        am = t["attn_mask"]
        assert am.dtype == np.bool_ and am.ndim == 3
        W = {x: (f64(t, f"w_{x}.weight"), f64(t, f"w_{x}.bias")) for x in "qkv"}
        q = split(linear(f64(t, "x_q"), *W["q"]), h, qk)
        k = split(linear(f64(t, "x_k_v"), *W["k"]), h, qk)
        vp = linear(f64(t, "x_k_v"), *W["v"])
        v = split(vp, h, vs)
        ctx, p = attend(q, k, v, 1.0 / np.sqrt(qk), ~am[:, None])
        out = merge(ctx)
        rows = am.all(axis=-1)  # [B,Lq]
        for b_, i in zip(*np.nonzero(rows)):
            e = np.abs(t["out_f64"][b_, i] - vp[b_].mean(axis=0)).max()
            if e > tol:
                problems.append(f"fully masked row ({b_},{i}) != mean V: {e:.3e}")
        n_full = int(rows.sum())
    else:
        raise ValueError(variant)
    assert t["out_f64"].dtype == np.float64 and t["attn_f64"].dtype == np.float64
    assert t["out"].dtype == np.float32
    assert t["out_f64"].shape == out.shape == t["out"].shape, (t["out_f64"].shape, out.shape)
    assert t["attn_f64"].shape == p.shape
    err_out = np.abs(out - t["out_f64"]).max()
    err_p = np.abs(p - t["attn_f64"]).max()
    err32 = np.abs(t["out"].astype(np.float64) - t["out_f64"]).max()
    if err_out > tol:
        problems.append(f"out_f64 mismatch {err_out:.3e}")
    if err_p > tol:
        problems.append(f"attn_f64 mismatch {err_p:.3e}")
    if float(meta["err_f32_vs_f64"]) != err32:
        problems.append(f"err_f32_vs_f64 {meta['err_f32_vs_f64']} != {err32!r}")
    if not np.all(np.isfinite(t["out_f64"])):
        problems.append("non-finite out_f64")
    return err_out, err_p, n_full, problems


def check_weights(path, tol):
    t, meta = st_io.load(path)
    layout, h = meta["layout"], int(meta["num_heads"])
    pre = meta.get("prefix", "")
    E = int(meta["embed_dim"])
    q_in, k_in, v_in = (f64(t, n) for n in ("query", "key", "value"))
    if layout.startswith("torch_mha"):
        if layout == "torch_mha_packed":
            w = f64(t, pre + "in_proj_weight")
            wq, wk, wv = w[:E], w[E : 2 * E], w[2 * E :]
        else:
            wq, wk, wv = (f64(t, pre + f"{x}_proj_weight") for x in "qkv")
        bias = f64(t, pre + "in_proj_bias")
        bq, bk, bv = bias[:E], bias[E : 2 * E], bias[2 * E :]
        wo, bo = f64(t, pre + "out_proj.weight"), f64(t, pre + "out_proj.bias")
    elif layout == "dmodel":
        (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (
            (f64(t, f"W_{x}.weight"), f64(t, f"W_{x}.bias")) for x in "qkvo"
        )
    else:
        raise ValueError(layout)
    dk = E // h
    q = split(linear(q_in, wq, bq), h, dk)
    k = split(linear(k_in, wk, bk), h, dk)
    v = split(linear(v_in, wv, bv), h, dk)
    ctx, _ = attend(q, k, v, 1.0 / np.sqrt(dk), None)
    out = linear(merge(ctx), wo, bo)
    err = np.abs(out - t["out_f64"]).max()
    return err, ([] if err <= tol else [f"out_f64 mismatch {err:.3e}"])


def official_open(path):
    try:
        from safetensors import safe_open
    except ImportError:
        return
    with safe_open(path, framework="np" if "bf16" not in path else "pt") as f:
        for k in f.keys():
            f.get_tensor(k)
        f.metadata()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.normpath(os.path.join(here, "..", "tests", "fixtures")))
    ap.add_argument("--tol", type=float, default=1e-12)
    args = ap.parse_args()
    bad = 0
    cases = sorted(glob.glob(os.path.join(args.dir, "*.safetensors")))
    for p in cases:
        official_open(p)
        err_out, err_p, n_full, probs = check_case(p, args.tol)
        bad += bool(probs)
        tag = "FAIL " + "; ".join(probs) if probs else "ok"
        print(f"{os.path.basename(p):62s} out {err_out:.1e} attn {err_p:.1e} "
              f"full-rows {n_full:2d}  {tag}")
    wfiles = sorted(glob.glob(os.path.join(args.dir, "weights", "*.safetensors")))
    for p in wfiles:
        official_open(p)
        err, probs = check_weights(p, args.tol)
        bad += bool(probs)
        print(f"weights/{os.path.basename(p):54s} out {err:.1e}  {'FAIL ' + '; '.join(probs) if probs else 'ok'}")
    print(f"{len(cases) + len(wfiles) - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
