#!/usr/bin/env python3
"""Case files in PyTorch's own conventions, made by PyTorch's own modules.

Every case is a classic ("dmodel") case file (DESIGN.md, "Real checkpoints") whose weights are
an `nn.MultiheadAttention(batch_first=True)` state dict as saved (`in_proj_weight`,
`in_proj_bias`, `out_proj.*`) and whose answer `out_f64` is that module's own forward in
float64 on the same f32 data (`out`: the float32 forward, for `err_f32_vs_f64`):

  tests/fixtures/torch/*.safetensors   must pass `wgpu-mha check`:
    float attn_mask (nn.Transformer.generate_square_subsequent_mask: 0 / -inf), key_padding_mask
    (true = padding) alone, with a bool attn_mask and with a per-head float bias (ALiBi-like),
    a float mask with a row of only -inf (PyTorch's default call: NaN), metadata `scale`
    (computed with F.scaled_dot_product_attention, since nn.MultiheadAttention has no scale
    argument), and add_bias_kv=True (`bias_k`, `bias_v`) / add_zero_attn=True (metadata
    `add_zero_attn`), alone and together with masks and key padding.
  tests/fixtures/refused/*.safetensors  must be refused, never run as another problem:
    `bias_k` without `bias_v`, and metadata `add_zero_attn` that is not "true"/"false".
  tests/fixtures/torch_run/*.safetensors  for `run --weights F --inputs F`: a whole state dict as
    saved (nn.TransformerEncoder, nn.TransformerDecoder, nn.MultiheadAttention; metadata
    `prefix`, `num_heads`), the inputs that really reach the attention module in PyTorch's
    layout (sequence-first, batch-first, unbatched) with the container's masks, and
    `out_f64`/`attn_weights_f64` from the module in float64; metadata `run_flags` names the
    `run` flags the file needs (seq_first, probs, average, add_zero_attn); also all 64 of
    PyTorch's own test samples for nn.MultiheadAttention (module_inputs_torch_nn_MultiheadAttention).
  tests/fixtures/torch_functional/*.safetensors  must pass `wgpu-mha check`: PyTorch's own test
    samples for F.multi_head_attention_forward (sample_inputs_multi_head_attention_forward)
    without dropout, as classic case files.

A 3-D float mask is PyTorch's [B*H, Lq, Lk]; case files store it as [B, H, Lq, Lk] (rank 4).
Boolean masks never mask a whole row here: PyTorch turns them into -inf (NaN for such a row)
where the seeds' -1e9 gives the mean of V.

Usage:  python tools/gen_torch_conventions.py [--out tests/fixtures]   (needs torch, expecttest)
"""

import argparse
import copy
import json
import math
import os
import sys
import zlib

import torch
import torch.nn.functional as F
from torch import nn

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

E, H = 24, 3


def seeded(name):
    torch.manual_seed(zlib.crc32(name.encode()) % (2**31 - 1))


def padding(lengths, lk):
    """[B, Lk] bool, true = padding (keys at j >= length)."""
    return torch.arange(lk)[None, :] >= torch.tensor(lengths)[:, None]


def alibi(b, lq, lk):
    """[B, H, Lq, Lk] float: a per-head linear distance penalty, as ALiBi adds."""
    slopes = torch.tensor([2.0 ** (-(i + 1)) for i in range(H)])
    dist = (torch.arange(lk)[None, :] - torch.arange(lq)[:, None]).abs().float()
    return (-slopes[:, None, None] * dist).expand(b, H, lq, lk).contiguous()


def run(mod, q, k, v, attn_mask, kpm):
    """The module's output; a rank-4 float mask goes in as PyTorch's [B*H, Lq, Lk]."""
    if attn_mask is not None and attn_mask.dim() == 4:
        attn_mask = attn_mask.reshape(-1, *attn_mask.shape[2:])
    # PyTorch's default call (need_weights=True). Its need_weights=False route (SDPA) differs
    # on a row whose keys are all -inf: attention 0 (the output bias) where this one gives NaN.
    out, _ = mod(q, k, v, attn_mask=attn_mask, key_padding_mask=kpm)
    return out


def scaled_forward(mod, q, k, v, scale):
    """nn.MultiheadAttention's math with another score scale (F.scaled_dot_product_attention)."""
    w_q, w_k, w_v = mod.in_proj_weight.chunk(3)
    b_q, b_k, b_v = mod.in_proj_bias.chunk(3)
    heads = lambda t: t.unflatten(-1, (H, E // H)).transpose(1, 2)  # noqa: E731
    o = F.scaled_dot_product_attention(
        heads(F.linear(q, w_q, b_q)), heads(F.linear(k, w_k, b_k)), heads(F.linear(v, w_v, b_v)),
        scale=scale)
    return mod.out_proj(o.transpose(1, 2).flatten(-2))


CASES = [
    # name, B, Lq, Lk, self-attention, mask builder -> (attn_mask, key_padding_mask)
    ("torch_float_causal_mask", 2, 6, 6, True,
     lambda b, lq, lk: (nn.Transformer.generate_square_subsequent_mask(lq), None)),
    ("torch_key_padding_cross", 3, 4, 7, False,
     lambda b, lq, lk: (None, padding([7, 3, 5], lk))),
    ("torch_bool_mask_and_key_padding", 2, 5, 6, False,
     lambda b, lq, lk: (torch.rand(lq, lk) < 0.3, padding([6, 4], lk))),
    ("torch_causal_bool_and_key_padding_self", 2, 6, 6, True,
     lambda b, lq, lk: (torch.ones(lq, lk, dtype=torch.bool).triu(1), padding([6, 4], lk))),
    ("torch_alibi_bias_and_key_padding", 2, 5, 5, True,
     lambda b, lq, lk: (alibi(b, lq, lk), padding([5, 3], lk))),
    ("torch_float_mask_row_all_neg_inf", 1, 3, 4, False,
     lambda b, lq, lk: (torch.tensor([[0.0, -1.0, 0.5, 0.0],
                                      [-math.inf] * 4,
                                      [0.0, -math.inf, 0.0, 2.0]]), None)),
]

BOTH = {"add_bias_kv": True, "add_zero_attn": True}
APPENDED_KEY_CASES = [
    # name, B, Lq, Lk, self-attention, masks, nn.MultiheadAttention options. The appended keys
    # are never masked: batch 2 of the padded cases has every key of its own padded.
    ("torch_add_bias_kv_cross", 2, 4, 5, False, lambda b, lq, lk: (None, None),
     {"add_bias_kv": True}),
    ("torch_add_zero_attn_float_causal_self", 2, 5, 5, True,
     lambda b, lq, lk: (nn.Transformer.generate_square_subsequent_mask(lq), None),
     {"add_zero_attn": True}),
    ("torch_bias_kv_zero_attn_bool_mask_and_key_padding", 3, 4, 6, False,
     lambda b, lq, lk: (torch.rand(lq, lk) < 0.3, padding([6, 2, 0], lk)), BOTH),
    ("torch_bias_kv_zero_attn_alibi_and_key_padding", 3, 5, 5, True,
     lambda b, lq, lk: (alibi(b, lq, lk), padding([5, 3, 0], lk)), BOTH),
]


def write(path, tensors, meta):
    arrays = {k: t.detach().contiguous().numpy() for k, t in tensors.items()}
    st_io.save(path, arrays, meta)
    print("wrote", path)


def metadata(name, b, lq, lk, err, **extra):
    cfg = {"name": name, "sizes": {"d_model": E, "num_heads": H}, "batch": b, "lq": lq, "lk": lk}
    meta = {"variant": "dmodel", "config": json.dumps(cfg, sort_keys=True),
            "err_f32_vs_f64": repr(err), "format": "wgpu-mha-case/1",
            "generator": "tools/gen_torch_conventions.py"}
    meta.update(extra)
    return meta


def inputs(b, lq, lk, self_attn):
    q = torch.randn(b, lq, E)
    k = q.clone() if self_attn else torch.randn(b, lk, E)
    v = q.clone() if self_attn else torch.randn(b, lk, E)
    return q, k, v


def answer_case(out_dir, name, b, lq, lk, self_attn, masks, options=None):
    """`options`: add_bias_kv / add_zero_attn, as nn.MultiheadAttention takes them."""
    options = options or {}
    seeded(name)
    mod = nn.MultiheadAttention(E, H, batch_first=True, **options).eval()
    q, k, v = inputs(b, lq, lk, self_attn)
    attn_mask, kpm = masks(b, lq, lk)
    with torch.no_grad():
        out = run(mod, q, k, v, attn_mask, kpm)
        m64 = copy.deepcopy(mod).double()
        cast = lambda t: t.double() if t is not None and t.is_floating_point() else t  # noqa: E731
        out64 = run(m64, q.double(), k.double(), v.double(), cast(attn_mask), kpm)
    err = float((out.double() - out64).abs().nan_to_num(0.0).max())
    tensors = dict(mod.state_dict())
    tensors.update({"Q": q, "K": k, "V": v, "out": out, "out_f64": out64})
    if attn_mask is not None:
        tensors["attn_mask"] = attn_mask
    if kpm is not None:
        tensors["key_padding_mask"] = kpm
    extra = {"add_zero_attn": "true"} if options.get("add_zero_attn") else {}
    write(os.path.join(out_dir, "torch", name + ".safetensors"), tensors,
          metadata(name, b, lq, lk, err, **extra))


def scale_case(out_dir):
    name, b, l, scale = "torch_scale_override", 2, 5, 0.9
    seeded(name)
    mod = nn.MultiheadAttention(E, H, batch_first=True).eval()
    q, k, v = inputs(b, l, l, False)
    with torch.no_grad():
        # The rewrite reproduces the module at its own scale before it is trusted at another.
        default = scaled_forward(mod, q, k, v, 1.0 / math.sqrt(E // H))
        assert torch.allclose(default, run(mod, q, k, v, None, None), atol=1e-6)
        out = scaled_forward(mod, q, k, v, scale)
        out64 = scaled_forward(copy.deepcopy(mod).double(), q.double(), k.double(), v.double(), scale)
    err = float((out.double() - out64).abs().max())
    tensors = dict(mod.state_dict())
    tensors.update({"Q": q, "K": k, "V": v, "out": out, "out_f64": out64})
    write(os.path.join(out_dir, "torch", name + ".safetensors"), tensors,
          metadata(name, b, l, l, err, scale=repr(scale)))


def refused_cases(out_dir):
    """Files that must be refused, never run as another problem: `bias_k` without `bias_v`,
    and `add_zero_attn` that is neither "true" nor "false"."""
    for name, drop, extra in [
        ("torch_bias_k_without_bias_v", "bias_v", {}),
        ("torch_add_zero_attn_not_a_bool", None, {"add_zero_attn": "yes"}),
    ]:
        seeded(name)
        mod = nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True).eval()
        q, k, v = inputs(2, 4, 4, False)
        with torch.no_grad():
            out = run(mod, q, k, v, None, None)
            out64 = run(copy.deepcopy(mod).double(), q.double(), k.double(), v.double(), None, None)
        err = float((out.double() - out64).abs().max())
        tensors = {n: t for n, t in mod.state_dict().items() if n != drop}
        tensors.update({"Q": q, "K": k, "V": v, "out": out, "out_f64": out64})
        write(os.path.join(out_dir, "refused", name + ".safetensors"), tensors,
              metadata(name, 2, 4, 4, err, **extra))


def capture(module, call):
    """The (args, kwargs) of `module`'s first call during `call()`."""
    seen = []
    hook = module.register_forward_hook(
        lambda m, args, kwargs, out: seen.append((args, kwargs)), with_kwargs=True)
    try:
        call()
    finally:
        hook.remove()
    return seen[0]


def attention_run(mod, q, k, v, attn_mask, kpm, average):
    """Output and weights of `mod` on f32 data, and of its float64 copy on the same data."""
    kw = dict(attn_mask=attn_mask, key_padding_mask=kpm, average_attn_weights=average)
    with torch.no_grad():
        out, w = mod(q, k, v, **kw)
        m64 = copy.deepcopy(mod).double()
        if attn_mask is not None and attn_mask.is_floating_point():
            kw["attn_mask"] = attn_mask.double()
        out64, w64 = m64(q.double(), k.double(), v.double(), **kw)
    return out, out64, w64


def run_fixture(out_dir, name, state, prefix, heads, q, k, v, attn_mask, kpm, out, out64, w64,
                **flags):
    """An `run --weights F --inputs F` file: a state dict as saved, inputs in PyTorch's layout."""
    tensors = {k_: t for k_, t in state.items()}
    tensors.update({"query": q, "key": k, "value": v, "out_f64": out64, "attn_weights_f64": w64})
    if attn_mask is not None:
        tensors["attn_mask"] = attn_mask
    if kpm is not None:
        tensors["key_padding_mask"] = kpm
    err = float((out.double() - out64).abs().max())
    meta = {"num_heads": str(heads), "prefix": prefix, "err_f32_vs_f64": repr(err),
            "run_flags": json.dumps(flags, sort_keys=True),
            "generator": "tools/gen_torch_conventions.py"}
    write(os.path.join(out_dir, "torch_run", name + ".safetensors"), tensors, meta)


def run_cases(out_dir):
    # nn.TransformerEncoder as PyTorch builds it: sequence-first (batch_first=False), a float
    # causal src_mask and a bool src_key_padding_mask; layer 1's self-attention, with the input
    # that really reaches it. Training mode with dropout 0 keeps PyTorch off its fused fast path
    # (which would bypass the attention module).
    name = "encoder_layer1_self_attn_seq_first"
    seeded(name)
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=32, dropout=0.0)
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).train()
    L, B = 6, 2
    src = torch.randn(L, B, E)
    mask = nn.Transformer.generate_square_subsequent_mask(L)
    kpm = padding([6, 4], L)
    with torch.no_grad():
        args, kwargs = capture(enc.layers[1].self_attn,
                               lambda: enc(src, mask=mask, src_key_padding_mask=kpm))
    x = args[0].detach()
    out, out64, w64 = attention_run(enc.layers[1].self_attn, x, x, x, mask, kpm, True)
    run_fixture(out_dir, name, enc.state_dict(), "layers.1.self_attn.", H, x, x, x, mask, kpm,
                out, out64, w64, seq_first=True, probs=True, average=True)

    # nn.TransformerDecoder (batch_first=True): the cross-attention of layer 0 over a padded
    # memory, with the query the layer really computes.
    name = "decoder_layer0_cross_attn_batch_first"
    seeded(name)
    dlayer = nn.TransformerDecoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=True)
    dec = nn.TransformerDecoder(dlayer, num_layers=1).train()
    tgt, memory = torch.randn(2, 4, E), torch.randn(2, 7, E)
    mem_kpm = padding([7, 5], 7)
    with torch.no_grad():
        args, _ = capture(dec.layers[0].multihead_attn,
                          lambda: dec(tgt, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(4),
                                      memory_key_padding_mask=mem_kpm))
    q = args[0].detach()
    out, out64, w64 = attention_run(dec.layers[0].multihead_attn, q, memory, memory, None, mem_kpm,
                                    False)
    run_fixture(out_dir, name, dec.state_dict(), "layers.0.multihead_attn.", H, q, memory, memory,
                None, mem_kpm, out, out64, w64, probs=True)

    # Unbatched [L, E] cross-attention with a per-query float bias.
    name = "mha_unbatched_float_mask"
    seeded(name)
    mod = nn.MultiheadAttention(E, H).eval()
    q, k, v = torch.randn(3, E), torch.randn(5, E), torch.randn(5, E)
    bias = torch.randn(3, 5)
    out, out64, w64 = attention_run(mod, q, k, v, bias, None, False)
    run_fixture(out_dir, name, mod.state_dict(), "", H, q, k, v, bias, None, out, out64, w64,
                probs=True)


def module_input_cases(out_dir):
    """PyTorch's own test samples for nn.MultiheadAttention (`module_inputs_torch_nn_
    MultiheadAttention`, needs `pip install expecttest`), all 64: unbatched [3, 3] inputs,
    per-head [H, L, L] bool masks and [L] key padding masks, with and without biases,
    add_bias_kv and add_zero_attn."""
    from torch.testing._internal.common_modules import module_db
    info = next(m for m in module_db if m.module_cls is nn.MultiheadAttention)
    torch.manual_seed(0)  # the sample inputs come from the global generator
    samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                      requires_grad=False, training=False)
    for i, sample in enumerate(samples):
        kwargs = sample.constructor_input.kwargs
        seeded(f"module_inputs_{i}")
        mod = nn.MultiheadAttention(*sample.constructor_input.args, **kwargs).eval()
        q, k, v = sample.forward_input.args
        attn_mask = sample.forward_input.kwargs.get("attn_mask")
        kpm = sample.forward_input.kwargs.get("key_padding_mask")
        out, out64, w64 = attention_run(mod, q, k, v, attn_mask, kpm, True)
        if attn_mask is not None and attn_mask.dim() == 3:  # [H, L, S] unbatched
            attn_mask = attn_mask.unsqueeze(0)
        tags = "".join(["_bias" if kwargs.get("bias", True) else "_nobias",
                        "_biaskv" if kwargs.get("add_bias_kv") else "",
                        "_zeroattn" if kwargs.get("add_zero_attn") else "",
                        "_attnmask" if attn_mask is not None else "",
                        "_padding" if kpm is not None else ""])
        flags = {"add_zero_attn": True} if kwargs.get("add_zero_attn") else {}
        run_fixture(out_dir, f"module_inputs_{i:02d}{tags}", mod.state_dict(), "",
                    mod.num_heads, q, k, v, attn_mask, kpm, out, out64, w64,
                    probs=True, average=True, **flags)


def functional_cases(out_dir):
    """PyTorch's own test samples for F.multi_head_attention_forward (`sample_inputs_multi_
    head_attention_forward`) as classic case files: sequence-first and unbatched inputs (stored
    batch-first), packed and separate projection weights, bias_k/bias_v ([E]), float masks
    2-D and 3-D ([B·H, Lq, Lk], stored as [B, H, Lq, Lk]). Samples with dropout are left out
    (random by design)."""
    from torch.testing._internal.common_methods_invocations import op_db
    info = next(o for o in op_db if o.name == "nn.functional.multi_head_attention_forward")
    torch.manual_seed(0)
    samples = list(info.sample_inputs("cpu", torch.float32, requires_grad=False))
    kept = 0
    for i, sample in enumerate(samples):
        (k, v, e, heads, in_w, in_b, bias_k, bias_v, zero_attn, dropout, out_w,
         out_b) = sample.args
        kw = dict(sample.kwargs)
        if dropout > 0.0:
            continue
        q = sample.input
        mask = kw["attn_mask"]
        def forward(cast):  # noqa: E306
            c = lambda t: None if t is None else cast(t)  # noqa: E731
            out, _ = F.multi_head_attention_forward(
                c(q), c(k), c(v), e, heads, c(in_w), c(in_b), c(bias_k), c(bias_v), zero_attn,
                0.0, c(out_w), c(out_b), training=False, attn_mask=c(mask),
                use_separate_proj_weight=kw["use_separate_proj_weight"],
                q_proj_weight=c(kw["q_proj_weight"]), k_proj_weight=c(kw["k_proj_weight"]),
                v_proj_weight=c(kw["v_proj_weight"]))
            return out
        with torch.no_grad():
            out, out64 = forward(lambda t: t), forward(lambda t: t.double())
        batched = q.dim() == 3
        first = (lambda t: t.transpose(0, 1)) if batched else (lambda t: t.unsqueeze(0))  # noqa: E731
        b = q.shape[1] if batched else 1
        tensors = {"out_proj.weight": out_w, "out_proj.bias": out_b, "in_proj_bias": in_b,
                   "bias_k": bias_k, "bias_v": bias_v}
        if kw["use_separate_proj_weight"]:
            tensors.update({n: kw[n] for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight")})
        else:
            tensors["in_proj_weight"] = in_w
        tensors.update({"Q": first(q), "K": first(k), "V": first(v), "out": first(out),
                        "out_f64": first(out64)})
        if mask is not None:
            tensors["attn_mask"] = (mask.reshape(b, heads, *mask.shape[1:]) if mask.dim() == 3
                                    else mask)
        err = float((out.double() - out64).abs().max())
        name = "mha_forward_{:02d}_{}_{}_e{}_h{}_lk{}_{}".format(
            i, "batched" if batched else "unbatched",
            "separate" if kw["use_separate_proj_weight"] else "packed", e, heads, k.shape[0],
            "nomask" if mask is None else f"mask{mask.dim()}d")
        meta = metadata(name, b, q.shape[0], k.shape[0], err)
        meta["config"] = json.dumps({"name": name, "sizes": {"d_model": e, "num_heads": heads}},
                                    sort_keys=True)
        write(os.path.join(out_dir, "torch_functional", name + ".safetensors"), tensors, meta)
        kept += 1
    assert kept == 96, kept


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("tests", "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # byte-identical files on every run
    for sub in ("torch", "refused", "torch_run", "torch_functional"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    for name, b, lq, lk, self_attn, masks in CASES:
        answer_case(args.out, name, b, lq, lk, self_attn, masks)
    for name, b, lq, lk, self_attn, masks, options in APPENDED_KEY_CASES:
        answer_case(args.out, name, b, lq, lk, self_attn, masks, options)
    scale_case(args.out)
    refused_cases(args.out)
    run_cases(args.out)
    module_input_cases(args.out)
    functional_cases(args.out)


if __name__ == "__main__":
    main()
