#!/usr/bin/env python3
"""How far q8_0 / q4_0 KV caches move a model from its f32-cache answers (issue 37).

(a) Through ``wgpu_mha.transformers.accelerate``: a tiny seeded random-init Llama (nothing
    downloaded) generates ``--tokens`` tokens greedily with an f32 device cache; the same token
    sequence is then decoded teacher-forced (the prompt in one step, then one token a step) with
    each cache type, and the next-token distributions at those positions are compared with the
    f32 cache's: mean and max KL(p_f32 || p_q), max and mean |Δlogit|, top-1 agreement. The
    row "f32 vs eager" is the engine's own error (f32 cache against transformers' eager
    attention on the CPU), for scale.
(b) Attention output: the model's layer-0 attention (transformers-made, saved and read back with
    ``wgpu_mha.load``) stepped through a ``kv_cache`` of each type over ``--steps`` tokens of N(0, 1)
    hidden states (a prefill of 16, then one token a step); each step's output against the f32
    cache's: max |err| / max |ref| over all steps, and the mean of each step's ratio.

Numbers are reported, not asserted, beyond a loose sanity bound: exit status 1 when something
is wildly off (q8_0: mean KL > 1e-2 or attention error > 5e-2; q4_0: mean KL > 1; any NaN).

Usage: python tools/kv_quant_accuracy.py [--tokens 64] [--steps 128] [--seed 0] [--init-range 0.1]
"""

import argparse
import copy
import inspect
import math
import os
import sys
import tempfile

import numpy as np
import torch
import transformers

import wgpu_mha
import wgpu_mha.transformers as wt

# The tests' tiny decoders (python/tests/test_kv_quant.py checks what this measures).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
from tiny_models import decoder_sizes  # noqa: E402

QUANT = ("q8_0", "q4_0")
PROMPT = 8


def tiny_llama(seed: int, init_range: float):
    """2 layers, hidden 256, 8 heads over 4 key/value heads of 32, vocab 512. A larger init
    than transformers' 0.02 so that attention and the next-token distributions are far from
    uniform (at 0.02 every distribution is nearly flat and any cache looks exact)."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**decoder_sizes(256, 8, 4, 512, 512, head_dim=32,
                                                   initializer_range=init_range))
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def teacher_forced(model, seq: torch.Tensor, tokens: int) -> torch.Tensor:
    """Next-token logits ``[tokens, vocab]`` (float64) after ``seq[:, :PROMPT + i]`` for i in
    0..tokens: the prompt in one step, then one token a step, through a DynamicCache (an
    accelerated model's device caches follow it)."""
    # transformers 5.x renames past_key_values to cache (the old name warns).
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    kw = {key: transformers.DynamicCache(config=model.config), "use_cache": True}
    out = []
    with torch.no_grad():
        step = model(seq[:, :PROMPT], **kw)
        out.append(step.logits[0, -1])
        for t in range(PROMPT, PROMPT + tokens - 1):
            step = model(seq[:, t : t + 1], **kw)
            out.append(step.logits[0, -1])
    return torch.stack(out).double()


def compare_logits(ref: torch.Tensor, got: torch.Tensor) -> dict:
    logp, logq = torch.log_softmax(ref, -1), torch.log_softmax(got, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    diff = (got - ref).abs()
    return {
        "kl_mean": kl.mean().item(),
        "kl_max": kl.max().item(),
        "dlogit_max": diff.max().item(),
        "dlogit_mean": diff.mean().item(),
        "top1": (got.argmax(-1) == ref.argmax(-1)).double().mean().item(),
    }


def part_a(seed: int, init_range: float, tokens: int):
    base = tiny_llama(seed, init_range)
    g = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(1, base.config.vocab_size, (1, PROMPT), generator=g)
    models = {"eager": base}
    for dtype in ("f32",) + QUANT:
        models[dtype] = copy.deepcopy(base)
        wt.accelerate(models[dtype], kv_dtype=dtype)
    with torch.no_grad():
        seq = models["f32"].generate(
            prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0
        )
    logits = {name: teacher_forced(m, seq, tokens) for name, m in models.items()}
    p = torch.softmax(logits["f32"], -1)
    entropy = -(p * torch.log(p)).sum(-1).mean().item()
    rows = [("f32 vs eager", compare_logits(logits["eager"], logits["f32"]))]
    rows += [(f"{d} vs f32", compare_logits(logits["f32"], logits[d])) for d in QUANT]
    cache = models["q8_0"].model.layers[0].self_attn._cache
    sizes = {d: models[d].model.layers[0].self_attn._cache.bytes_per_token for d in ("f32",) + QUANT}
    return base, rows, entropy, sizes, len(cache)


def part_b(model, steps: int, seed: int):
    with tempfile.TemporaryDirectory(prefix="kv_quant_") as tmp:
        model.save_pretrained(tmp)
        attn = wgpu_mha.load(tmp, layer=0)
    g = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(1, steps, attn.hidden_size, generator=g)
    outs = {}
    for dtype in ("f32",) + QUANT:
        cache = attn.kv_cache(1, steps, kv_dtype=dtype)
        parts = [cache.step(x[:, :16])]
        parts += [cache.step(x[:, t : t + 1]) for t in range(16, steps)]
        outs[dtype] = torch.cat(parts, 1).double()
    ref = outs["f32"]
    rows = []
    for dtype in QUANT:
        err = (outs[dtype] - ref).abs()
        per_step = err.amax(-1) / ref.abs().amax(-1)
        rows.append((dtype, (err.max() / ref.abs().max()).item(), per_step.mean().item(), err.max().item()))
    return attn, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens compared (a)")
    ap.add_argument("--steps", type=int, default=128, help="tokens stepped through the layer (b)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-range", type=float, default=0.1, help="the Llama's initializer_range")
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()

    print(f"device: {wgpu_mha.default_device()}")
    model, rows, entropy, sizes, cached = part_a(args.seed, args.init_range, args.tokens)
    print(
        f"\n(a) accelerate(): tiny Llama (2 layers, hidden 256, 8 heads / 4 kv heads of 32, vocab 512, "
        f"init {args.init_range}, seed {args.seed}), {args.tokens} greedy tokens after a prompt of {PROMPT}, "
        f"teacher-forced; f32 next-token entropy {entropy:.2f} nats; bytes per token per layer "
        + ", ".join(f"{d} {b}" for d, b in sizes.items())
    )
    print(f"{'cache':<14}{'mean KL':>10}{'max KL':>10}{'max |dlogit|':>14}{'mean |dlogit|':>15}{'top-1 same':>12}")
    for name, r in rows:
        print(
            f"{name:<14}{r['kl_mean']:>10.2e}{r['kl_max']:>10.2e}{r['dlogit_max']:>14.2e}"
            f"{r['dlogit_mean']:>15.2e}{r['top1']:>12.1%}"
        )
    attn, errs = part_b(model, args.steps, args.seed)
    print(
        f"\n(b) {attn.prefix}: wgpu_mha.load(..).kv_cache(1, {args.steps}, kv_dtype), N(0,1) hidden states, "
        f"prefill 16 then {args.steps - 16} single steps, against the f32 cache"
    )
    print(f"{'cache':<14}{'max|err|/max|ref|':>19}{'mean per step':>15}{'max |err|':>12}")
    for dtype, rel, mean_rel, abs_err in errs:
        print(f"{dtype:<14}{rel:>19.2e}{mean_rel:>15.2e}{abs_err:>12.2e}")

    q8, q4 = dict(rows)["q8_0 vs f32"], dict(rows)["q4_0 vs f32"]
    rel8 = errs[0][1]
    values = [v for _, r in rows for v in r.values()] + [e for row in errs for e in row[1:]]
    bad = []
    if any(math.isnan(v) for v in values):
        bad.append("a NaN")
    if q8["kl_mean"] > 1e-2:
        bad.append(f"q8_0 mean KL {q8['kl_mean']:.3g} > 1e-2")
    if q4["kl_mean"] > 1:
        bad.append(f"q4_0 mean KL {q4['kl_mean']:.3g} > 1")
    if rel8 > 5e-2:
        bad.append(f"q8_0 attention error {rel8:.3g} > 5e-2 of max|ref|")
    if cached != PROMPT + args.tokens - 1:
        bad.append(f"the q8_0 cache holds {cached} tokens, expected {PROMPT + args.tokens - 1}")
    if bad:
        print("\nwildly off: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
