#!/usr/bin/env python3
"""Generate weight-layout fixtures (safetensors) for the wgpu-mha weight loader.

Writes into tests/fixtures/weights/ (or --out):

  mha_packed_e32_h4.safetensors
      torch.nn.MultiheadAttention(embed_dim=32, num_heads=4, batch_first=True)
      state dict: in_proj_weight [96,32], in_proj_bias [96],
                  out_proj.weight [32,32], out_proj.bias [32]          (f32)
  mha_packed_prefixed_e32_h4.safetensors
      the same attention weights inside a one-layer nn.TransformerEncoder held
      by a wrapper module, so the names are
      encoder.layers.0.self_attn.in_proj_weight, ...; the file also holds the
      layer's other tensors (linear1/linear2/norm1/norm2) that a loader must skip.
  mha_separate_e32_h4_k20_v12.safetensors
      nn.MultiheadAttention(32, 4, kdim=20, vdim=12, batch_first=True):
      q_proj_weight [32,32], k_proj_weight [32,20], v_proj_weight [32,12],
      in_proj_bias [96], out_proj.weight, out_proj.bias                 (f32)
  classic_d32_h4_f16.safetensors / classic_d32_h4_bf16.safetensors
      a classic (seed 000) state dict W_q.weight ... W_o.bias stored as F16 / BF16.

Every file also holds inputs `query` [B,Lq,E], `key` [B,Lk,kdim], `value`
[B,Lk,vdim] (f32) and `out_f64` (f64): the module's forward on exactly the
stored weights (after f16/bf16 rounding) and inputs, computed in float64 with
no mask (nn.MultiheadAttention: need_weights=False, scale 1/sqrt(E/num_heads),
output = out_proj(concat heads)).  Metadata: `layout`, `num_heads`,
`embed_dim`, `kdim`, `vdim`, `prefix`, `weight_dtype`, `batch_first`.

The biases of nn.MultiheadAttention start at zero; they are refilled with
random values here so that a loader that drops them is caught.

Usage:  python tools/gen_weights.py [--seed N] [--out DIR]
"""

import argparse
import os
import sys

import numpy as np
import torch
from torch import nn

sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
from gen_cases import ClassicAttention  # noqa: E402

E, H = 32, 4


def rand_biases(mha):
    with torch.no_grad():
        mha.in_proj_bias.copy_(torch.randn_like(mha.in_proj_bias) * 0.1)
        mha.out_proj.bias.copy_(torch.randn_like(mha.out_proj.bias) * 0.1)


def mha_f64(mha, q, k, v):
    m = nn.MultiheadAttention(
        mha.embed_dim, mha.num_heads, kdim=mha.kdim, vdim=mha.vdim, batch_first=True
    ).double()
    m.load_state_dict({k_: t.double() for k_, t in mha.state_dict().items()})
    m.eval()
    with torch.no_grad():
        out, w = m(q.double(), k.double(), v.double(), need_weights=False)
    assert w is None
    return out


def to_np(sd):
    return {k: t.detach().contiguous().numpy() for k, t in sd.items()}


def meta_for(layout, embed_dim, kdim, vdim, prefix, dtype):
    return {
        "layout": layout,
        "num_heads": str(H),
        "embed_dim": str(embed_dim),
        "kdim": str(kdim),
        "vdim": str(vdim),
        "prefix": prefix,
        "weight_dtype": dtype,
        "batch_first": "true",
        "format": "wgpu-mha-weights/1",
        "generator": "tools/gen_weights.py",
    }


class Wrapper(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20240602)
    ap.add_argument("--out", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "fixtures", "weights")))
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    written = []

    def write(name, tensors, meta):
        path = os.path.join(args.out, name)
        st_io.save(path, tensors, meta)
        written.append(path)

    B, Lq, Lk = 2, 5, 6

    # (a) packed in_proj, plain and under a prefix -------------------------
    torch.manual_seed(args.seed)
    mha = nn.MultiheadAttention(E, H, batch_first=True).eval()
    rand_biases(mha)
    query = torch.randn(B, Lq, E)
    key = torch.randn(B, Lk, E)
    value = torch.randn(B, Lk, E)
    out64 = mha_f64(mha, query, key, value)
    io = {"query": query, "key": key, "value": value}
    sd = dict(mha.state_dict())
    assert set(sd) == {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}, set(sd)
    t = to_np({**sd, **io})
    t["out_f64"] = out64.numpy()
    write("mha_packed_e32_h4.safetensors", t, meta_for("torch_mha_packed", E, E, E, "", "F32"))

    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, batch_first=True)
    wrapper = Wrapper(layer).eval()
    with torch.no_grad():
        wrapper.encoder.layers[0].self_attn.load_state_dict(mha.state_dict())
    prefix = "encoder.layers.0.self_attn."
    wsd = dict(wrapper.state_dict())
    assert prefix + "in_proj_weight" in wsd, sorted(wsd)
    t = to_np({**wsd, **io})
    t["out_f64"] = out64.numpy()
    write("mha_packed_prefixed_e32_h4.safetensors", t,
          meta_for("torch_mha_packed", E, E, E, prefix, "F32"))

    # (b) separate q/k/v projections (kdim, vdim != embed_dim) -------------
    torch.manual_seed(args.seed + 1)
    KD, VD = 20, 12
    mha2 = nn.MultiheadAttention(E, H, kdim=KD, vdim=VD, batch_first=True).eval()
    rand_biases(mha2)
    sd2 = dict(mha2.state_dict())
    assert {"q_proj_weight", "k_proj_weight", "v_proj_weight"} <= set(sd2), set(sd2)
    query2 = torch.randn(B, Lq, E)
    key2 = torch.randn(B, Lk, KD)
    value2 = torch.randn(B, Lk, VD)
    out64b = mha_f64(mha2, query2, key2, value2)
    t = to_np({**sd2, "query": query2, "key": key2, "value": value2})
    t["out_f64"] = out64b.numpy()
    write("mha_separate_e32_h4_k20_v12.safetensors", t,
          meta_for("torch_mha_separate", E, KD, VD, "", "F32"))

    # (c) classic seed state dict in f16 / bf16 -----------------------------
    torch.manual_seed(args.seed + 2)
    cls = ClassicAttention(E, H).eval()
    query3 = torch.randn(B, Lq, E)
    key3 = torch.randn(B, Lk, E)
    value3 = torch.randn(B, Lk, E)
    for dt, tag in ((torch.float16, "F16"), (torch.bfloat16, "BF16")):
        low = {k: w.to(dt) for k, w in cls.state_dict().items()}
        ref = ClassicAttention(E, H).double().eval()
        ref.load_state_dict({k: w.double() for k, w in low.items()})
        with torch.no_grad():
            out64c, _ = ref(query3.double(), key3.double(), value3.double(), None)
        t = {}
        for k, w in low.items():
            if dt == torch.bfloat16:
                bits = w.contiguous().view(torch.int16).numpy().astype("<i2")
                t[k] = st_io.Raw("BF16", list(w.shape), bits.tobytes())
            else:
                t[k] = w.contiguous().numpy()
        t.update(to_np({"query": query3, "key": key3, "value": value3}))
        t["out_f64"] = out64c.numpy()
        meta = meta_for("dmodel", E, E, E, "", tag)
        meta["d_model"] = str(E)
        write(f"classic_d32_h4_{tag.lower()}.safetensors", t, meta)

    for p in written:
        print(f"{p}  {os.path.getsize(p):>8} B")


if __name__ == "__main__":
    main()
