#!/usr/bin/env python3
"""Generate attention case files (safetensors) for the wgpu-mha tests.

Each case file holds one whole problem and its answer, following the "Weights
and the case file" section of DESIGN.md:

  metadata  variant         "dmodel" (classic) | "perhead"
            config          JSON; "sizes" = {"d_model","num_heads"} or
                            {"emb_size","q_k_size","v_size","head"}, plus
                            informational keys (name, batch, lq, lk, mask_kind, ...)
            err_f32_vs_f64  str(max |out - out_f64|)
            format          "wgpu-mha-case/1" (informational)
  weights   classic  W_q.weight W_q.bias W_k.* W_v.* W_o.*          f32
            perhead  w_q.weight w_q.bias w_k.* w_v.*                 f32
  inputs    classic  Q [B,Lq,d]  K [B,Lk,d]  V [B,Lk,d]             f32
            perhead  x_q [B,Lq,emb]  x_k_v [B,Lk,emb]               f32
  mask      classic  mask u8, broadcastable to [B,H,Lq,Lk], 0 = masked
                     (absent when the case has no mask)
            perhead  attn_mask bool [B,Lq,Lk], true = masked (always present;
                     all false when the case has no mask)
  expected  out      f32  PyTorch's float32 result
            out_f64  f64  the same f32 data run in float64
            attn_f64 f64  [B,H,Lq,Lk] softmax probabilities (float64 run)

Masked scores are replaced by -1e9 before the softmax (seed semantics), so a
fully masked query row attends uniformly to all keys.

Usage:  python tools/gen_cases.py [--seed N] [--out DIR]
"""

import argparse
import copy
import json
import math
import os
import sys
import zlib

import numpy as np
import torch
from torch import nn

sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

MASK_FILL = -1e9


# --------------------------------------------------------------------------
# The two reference modules (written from the math in DESIGN.md / the seeds).
# Both return (output, attention probabilities [B,H,Lq,Lk]).
# --------------------------------------------------------------------------


class ClassicAttention(nn.Module):
    """d_model / num_heads attention with an output projection.

    mask: broadcastable to [B,H,Lq,Lk]; entries equal to 0 are masked.
    """

    def __init__(self, d_model, num_heads):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError("d_model must be divisible by num_heads")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        # creation order fixes the init stream: q, k, v, o
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def _heads(self, t):
        b, n, _ = t.shape
        return t.reshape(b, n, self.num_heads, self.d_k).permute(0, 2, 1, 3)

    def forward(self, Q, K, V, mask=None):
        q = self._heads(self.W_q(Q))  # [B,H,Lq,dk]
        k = self._heads(self.W_k(K))  # [B,H,Lk,dk]
        v = self._heads(self.W_v(V))  # [B,H,Lk,dk]
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, MASK_FILL)
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.einsum("bhqk,bhkd->bhqd", probs, v)  # [B,H,Lq,dk]
        b, _, lq, _ = ctx.shape
        ctx = ctx.permute(0, 2, 1, 3).reshape(b, lq, self.d_model)
        return self.W_o(ctx), probs


class PerHeadAttention(nn.Module):
    """emb / q_k_size / v_size / head attention without output projection.

    attn_mask: bool [B,Lq,Lk]; true entries are masked (same for all heads).
    Output [B,Lq,head*v_size], column h*v_size + j.
    """

    def __init__(self, emb_size, q_k_size, v_size, head):
        super().__init__()
        self.emb_size = emb_size
        self.q_k_size = q_k_size
        self.v_size = v_size
        self.head = head
        self.w_q = nn.Linear(emb_size, head * q_k_size)
        self.w_k = nn.Linear(emb_size, head * q_k_size)
        self.w_v = nn.Linear(emb_size, head * v_size)

    def forward(self, x_q, x_k_v, attn_mask):
        b, lq, _ = x_q.shape
        lk = x_k_v.shape[1]
        q = self.w_q(x_q).reshape(b, lq, self.head, self.q_k_size).permute(0, 2, 1, 3)
        k = self.w_k(x_k_v).reshape(b, lk, self.head, self.q_k_size).permute(0, 2, 1, 3)
        v = self.w_v(x_k_v).reshape(b, lk, self.head, self.v_size).permute(0, 2, 1, 3)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.q_k_size)
        scores = scores.masked_fill(attn_mask[:, None, :, :], MASK_FILL)
        probs = torch.softmax(scores, dim=-1)
        z = torch.einsum("bhqk,bhkd->bhqd", probs, v)  # [B,H,Lq,v]
        return z.permute(0, 2, 1, 3).reshape(b, lq, self.head * self.v_size), probs


# --------------------------------------------------------------------------
# Masks.  `keep` is a bool tensor, true = the query may attend to the key.
# --------------------------------------------------------------------------


def causal_keep(lq, lk):
    """Bottom-right aligned: query i sees key j iff j <= i + (lk - lq)."""
    i = torch.arange(lq)[:, None]
    j = torch.arange(lk)[None, :]
    return j <= i + (lk - lq)


def padding_keep(lengths, lq, lk):
    """[B,Lq,Lk]: key j is valid for batch b iff j < lengths[b]."""
    j = torch.arange(lk)[None, None, :]
    lens = torch.tensor(lengths)[:, None, None]
    return (j < lens).expand(len(lengths), lq, lk)


def random_keep(b, lq, lk, p_keep=0.65, full_rows=()):
    """Random [B,Lq,Lk] keep mask; every row keeps at least one key, except
    the (batch, row) pairs listed in `full_rows`, which keep none."""
    keep = torch.rand(b, lq, lk) < p_keep
    # guarantee one visible key per row
    forced = torch.randint(0, lk, (b, lq))
    keep[torch.arange(b)[:, None], torch.arange(lq)[None, :], forced] = True
    for bb, r in full_rows:
        keep[bb, r, :] = False
    return keep


def classic_mask(kind, b, h, lq, lk, spec):
    """u8 mask (1 = attend, 0 = masked) in the broadcast shape of its kind."""
    if kind == "none":
        return None
    if kind == "causal":
        m = causal_keep(lq, lk)[None, None]  # [1,1,Lq,Lk]
    elif kind == "padding":
        lens = spec["lengths"]
        m = (torch.arange(lk)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]  # [B,1,1,Lk]
    elif kind == "random":
        m = random_keep(b, lq, lk, full_rows=spec.get("full_rows", ()))[:, None]  # [B,1,Lq,Lk]
    elif kind == "random_heads":
        m = torch.rand(b, h, lq, lk) < 0.65  # [B,H,Lq,Lk]
        forced = torch.randint(0, lk, (b, h, lq))
        bi = torch.arange(b)[:, None, None]
        hi = torch.arange(h)[None, :, None]
        qi = torch.arange(lq)[None, None, :]
        m[bi, hi, qi, forced] = True
    else:
        raise ValueError(kind)
    return m.to(torch.uint8)


def perhead_mask(kind, b, lq, lk, spec):
    """bool [B,Lq,Lk], true = masked."""
    if kind == "none":
        keep = torch.ones(b, lq, lk, dtype=torch.bool)
    elif kind == "causal":
        keep = causal_keep(lq, lk)[None].expand(b, lq, lk)
    elif kind == "padding":
        keep = padding_keep(spec["lengths"], lq, lk)
    elif kind == "random":
        keep = random_keep(b, lq, lk, full_rows=spec.get("full_rows", ()))
    else:
        raise ValueError(kind)
    return (~keep).contiguous()


# --------------------------------------------------------------------------
# Case list.
# --------------------------------------------------------------------------

CASES = [
    # ---- classic (d_model / num_heads) ----
    dict(v="dmodel", name="classic_b1_l4_d16_h2_none", B=1, Lq=4, Lk=4, d=16, h=2, mask="none"),
    dict(v="dmodel", name="classic_b2_lq5_lk7_d48_h4_padding", B=2, Lq=5, Lk=7, d=48, h=4,
         mask="padding", lengths=[7, 4]),
    dict(v="dmodel", name="classic_b2_l6_d32_h4_causal", B=2, Lq=6, Lk=6, d=32, h=4, mask="causal"),
    dict(v="dmodel", name="classic_b2_lq3_lk8_d32_h4_causal", B=2, Lq=3, Lk=8, d=32, h=4, mask="causal"),
    # Lq > Lk causal: query rows 0..Lq-Lk-1 see no key at all (fully masked rows)
    dict(v="dmodel", name="classic_b2_lq8_lk3_d32_h4_causal_fullrows", B=2, Lq=8, Lk=3, d=32, h=4,
         mask="causal"),
    dict(v="dmodel", name="classic_b3_lq5_lk6_d72_h3_random", B=3, Lq=5, Lk=6, d=72, h=3, mask="random"),
    dict(v="dmodel", name="classic_b2_lq1_lk9_d32_h4_padding", B=2, Lq=1, Lk=9, d=32, h=4,
         mask="padding", lengths=[9, 3]),
    dict(v="dmodel", name="classic_b2_lq6_lk1_d32_h4_none", B=2, Lq=6, Lk=1, d=32, h=4, mask="none"),
    dict(v="dmodel", name="classic_b4_l5_d24_h6_none", B=4, Lq=5, Lk=5, d=24, h=6, mask="none"),
    dict(v="dmodel", name="classic_b2_l6_d32_h4_random_fullrow", B=2, Lq=6, Lk=6, d=32, h=4,
         mask="random", full_rows=[(0, 1), (1, 5)]),
    # batch 1 has zero valid keys: every query row of that batch is fully masked
    dict(v="dmodel", name="classic_b3_lq4_lk6_d48_h4_padding_emptyseq", B=3, Lq=4, Lk=6, d=48, h=4,
         mask="padding", lengths=[6, 0, 2]),
    dict(v="dmodel", name="classic_b2_l7_d32_h2_causal_scaled30", B=2, Lq=7, Lk=7, d=32, h=2,
         mask="causal", scale=30.0),
    dict(v="dmodel", name="classic_b1_l8_d64_h8_none", B=1, Lq=8, Lk=8, d=64, h=8, mask="none"),
    dict(v="dmodel", name="classic_b3_lq4_lk5_d40_h5_random", B=3, Lq=4, Lk=5, d=40, h=5, mask="random"),
    dict(v="dmodel", name="classic_b2_lq3_lk5_d24_h3_headmask", B=2, Lq=3, Lk=5, d=24, h=3,
         mask="random_heads"),
    dict(v="dmodel", name="classic_b1_lq1_lk1_d8_h1_none", B=1, Lq=1, Lk=1, d=8, h=1, mask="none"),
    # ---- per-head (emb / q_k_size / v_size / head) ----
    dict(v="perhead", name="perhead_b1_l4_e16_qk8_v8_h2_none", B=1, Lq=4, Lk=4, e=16, qk=8, vs=8, h=2,
         mask="none"),
    dict(v="perhead", name="perhead_b2_lq5_lk7_e72_qk16_v24_h3_random", B=2, Lq=5, Lk=7, e=72, qk=16,
         vs=24, h=3, mask="random"),
    dict(v="perhead", name="perhead_b2_l6_e32_qk8_v12_h4_causal", B=2, Lq=6, Lk=6, e=32, qk=8, vs=12,
         h=4, mask="causal"),
    dict(v="perhead", name="perhead_b3_lq7_lk4_e24_qk6_v10_h2_causal_fullrows", B=3, Lq=7, Lk=4, e=24,
         qk=6, vs=10, h=2, mask="causal"),
    dict(v="perhead", name="perhead_b2_lq3_lk8_e24_qk6_v10_h2_causal", B=2, Lq=3, Lk=8, e=24, qk=6,
         vs=10, h=2, mask="causal"),
    dict(v="perhead", name="perhead_b2_lq1_lk6_e32_qk8_v8_h4_padding", B=2, Lq=1, Lk=6, e=32, qk=8,
         vs=8, h=4, mask="padding", lengths=[6, 2]),
    dict(v="perhead", name="perhead_b2_lq5_lk1_e20_qk4_v12_h3_none", B=2, Lq=5, Lk=1, e=20, qk=4,
         vs=12, h=3, mask="none"),
    dict(v="perhead", name="perhead_b2_l6_e32_qk8_v16_h2_random_fullrow", B=2, Lq=6, Lk=6, e=32, qk=8,
         vs=16, h=2, mask="random", full_rows=[(0, 0), (1, 3)]),
    dict(v="perhead", name="perhead_b4_lq3_lk5_e16_qk8_v4_h2_random", B=4, Lq=3, Lk=5, e=16, qk=8,
         vs=4, h=2, mask="random"),
    dict(v="perhead", name="perhead_b2_l5_e24_qk12_v12_h1_padding", B=2, Lq=5, Lk=5, e=24, qk=12,
         vs=12, h=1, mask="padding", lengths=[3, 5]),
    dict(v="perhead", name="perhead_b2_l6_e32_qk8_v8_h4_random_scaled30", B=2, Lq=6, Lk=6, e=32, qk=8,
         vs=8, h=4, mask="random", scale=30.0),
    # the seed's own size, self-attention (x_q == x_k_v); ~4 MB because of the weights
    dict(v="perhead", name="perhead_b1_l8_e128_qk256_v512_h8_selfattn_seedsize", B=1, Lq=8, Lk=8,
         e=128, qk=256, vs=512, h=8, mask="none", self_attn=True),
]


def case_seed(base_seed, name):
    # stable per-case seed: adding/removing cases does not change the others
    return (base_seed * 1_000_003 + zlib.crc32(name.encode())) % (2**31 - 1)


def f64_copy(module):
    return copy.deepcopy(module).double()


def build_case(spec, base_seed):
    seed = case_seed(base_seed, spec["name"])
    torch.manual_seed(seed)
    B, Lq, Lk = spec["B"], spec["Lq"], spec["Lk"]
    in_scale = float(spec.get("scale", 1.0))
    tensors = {}
    cfg = {
        "name": spec["name"],
        "batch": B,
        "lq": Lq,
        "lk": Lk,
        "mask_kind": spec["mask"],
        "input_scale": in_scale,
        "seed": seed,
        "mask_fill": MASK_FILL,
    }
    with torch.no_grad():
        if spec["v"] == "dmodel":
            d, h = spec["d"], spec["h"]
            mod = ClassicAttention(d, h).eval()
            Q = torch.randn(B, Lq, d) * in_scale
            K = torch.randn(B, Lk, d) * in_scale
            V = torch.randn(B, Lk, d) * in_scale
            mask = classic_mask(spec["mask"], B, h, Lq, Lk, spec)
            out, _ = mod(Q, K, V, mask)
            m64 = f64_copy(mod)
            out64, attn64 = m64(Q.double(), K.double(), V.double(), mask)
            tensors.update({"Q": Q, "K": K, "V": V})
            if mask is not None:
                tensors["mask"] = mask
                cfg["mask_shape"] = list(mask.shape)
            cfg["sizes"] = {"d_model": d, "num_heads": h}
            cfg["scale"] = 1.0 / math.sqrt(d // h)
        else:
            e, qk, vs, h = spec["e"], spec["qk"], spec["vs"], spec["h"]
            mod = PerHeadAttention(e, qk, vs, h).eval()
            x_q = torch.randn(B, Lq, e) * in_scale
            if spec.get("self_attn"):
                assert Lq == Lk
                x_k_v = x_q.clone()
                cfg["self_attention"] = True
            else:
                x_k_v = torch.randn(B, Lk, e) * in_scale
            attn_mask = perhead_mask(spec["mask"], B, Lq, Lk, spec)
            out, _ = mod(x_q, x_k_v, attn_mask)
            m64 = f64_copy(mod)
            out64, attn64 = m64(x_q.double(), x_k_v.double(), attn_mask)
            tensors.update({"x_q": x_q, "x_k_v": x_k_v, "attn_mask": attn_mask})
            cfg["sizes"] = {"emb_size": e, "q_k_size": qk, "v_size": vs, "head": h}
            cfg["scale"] = 1.0 / math.sqrt(qk)
        if "lengths" in spec:
            cfg["lengths"] = list(spec["lengths"])
        if "full_rows" in spec:
            cfg["full_rows"] = [list(r) for r in spec["full_rows"]]
        for k, w in mod.state_dict().items():
            tensors[k] = w
        tensors["out"] = out
        tensors["out_f64"] = out64
        tensors["attn_f64"] = attn64
    err = float((out.double() - out64).abs().max())
    meta = {
        "variant": spec["v"],
        "config": json.dumps(cfg, sort_keys=True),
        "err_f32_vs_f64": repr(err),
        "format": "wgpu-mha-case/1",
        "generator": "tools/gen_cases.py",
    }
    arrays = {k: t.detach().contiguous().numpy() for k, t in tensors.items()}
    # dtype contract
    for k, a in arrays.items():
        if k in ("out_f64", "attn_f64"):
            assert a.dtype == np.float64, k
        elif k == "mask":
            assert a.dtype == np.uint8, k
        elif k == "attn_mask":
            assert a.dtype == np.bool_, k
        else:
            assert a.dtype == np.float32, k
    return arrays, meta, err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20240601, help="base seed (default %(default)s)")
    ap.add_argument("--out", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "fixtures")),
                    help="output directory (default tests/fixtures)")
    ap.add_argument("--only", default=None, help="generate only cases whose name contains this")
    args = ap.parse_args()

    torch.set_num_threads(1)  # bit-identical float32 results run to run
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    names = set()
    for spec in CASES:
        if args.only and args.only not in spec["name"]:
            continue
        assert spec["name"] not in names, spec["name"]
        names.add(spec["name"])
        arrays, meta, err = build_case(spec, args.seed)
        path = os.path.join(args.out, spec["name"] + ".safetensors")
        st_io.save(path, arrays, meta)
        print(f"{path}  {os.path.getsize(path):>9} B  err_f32_vs_f64={err:.3e}")


if __name__ == "__main__":
    main()
