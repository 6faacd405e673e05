"""Every ```python block of README.md and docs/*.md runs, as written, after a setup that makes
the names it leaves to the reader (q, k, v, a saved model, a transformers config, ...), and its
results are checked against torch where it computes one. A block without an entry in SETUPS
fails: a new block needs its setup here."""

import os
import pathlib
import re
import subprocess

import numpy as np
import pytest

import wgpu_mha
from conftest import ROOT, tiny_llama_config

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks():
    """(page, index, code) of every Python block of the README and the guide."""
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    for page in pages:
        for i, m in enumerate(BLOCK.finditer(page.read_text())):
            yield page.relative_to(ROOT).as_posix(), i, m.group(1)


def _tiny_llama(path):
    """A two-layer llama (GQA, RoPE) saved by transformers into `path`."""
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.LlamaModel(tiny_llama_config(transformers)).save_pretrained(path)


def _prompt():
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(3, 64, (1, 7), generator=g), torch.ones(1, 7, dtype=torch.long)


def setup_front_python(tmp):
    _tiny_llama(tmp / "model_dir")
    return {}


def check_front_python(ns):
    import torch

    want = torch.nn.functional.scaled_dot_product_attention(ns["q"], ns["k"], ns["v"], is_causal=True)
    assert (ns["out"] - want).abs().max().item() < 1e-5
    assert ns["mha"].num_heads == 4


def setup_transformers(tmp):
    ids, mask = _prompt()
    import transformers

    return {"cfg": tiny_llama_config(transformers, max_position_embeddings=128), "ids": ids, "mask": mask}


def check_transformers(ns):
    assert ns["names"] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert (ns["out"][:, : ns["ids"].shape[1]] == ns["ids"]).all()


def setup_python_api(tmp):
    import torch

    _tiny_llama(tmp / "path" / "to" / "saved_model")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    x = torch.randn(2, 5, 32, generator=g)
    return {
        "q": q, "k": k, "v": v,
        "torch_mha": torch.nn.MultiheadAttention(32, 4, batch_first=True),
        "query": x, "key": x, "value": x,
        "hidden_states": torch.randn(2, 6, 32, generator=g),
        "hidden_states_next": torch.randn(2, 1, 32, generator=g),
        "mask_so_far": torch.ones(2, 1, dtype=torch.long),
        "pos_next": torch.zeros(2, 1, dtype=torch.long),
    }


def check_python_api(ns):
    import torch

    # `out` and `weights` are the block's last: nn.MultiheadAttention's.
    with torch.no_grad():
        want_out, want_w = ns["torch_mha"](ns["query"], ns["key"], ns["value"])
    assert (ns["out"] - want_out).abs().max().item() < 1e-5
    assert (ns["weights"] - want_w).abs().max().item() < 1e-5
    assert ns["y"].shape == (2, 6, 32) and ns["y_step"].shape == (2, 1, 32)


def setup_serving(tmp):
    rng = np.random.default_rng(3)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    # The table after the append: sequence 0 has 20 tokens in pages 3, 7; sequence 1 has 4 in page 5.
    batch_indices = np.array([0] * 20 + [1] * 4, dtype=np.int32)
    positions = np.array(list(range(20)) + list(range(4)), dtype=np.int32)
    n_layers = 2
    ns = {
        "k_new": f(24, 2, 64), "v_new": f(24, 2, 64),
        "batch_indices": batch_indices, "positions": positions, "n_layers": n_layers,
        "q": [f(5, 8, 64) for _ in range(n_layers)],
        "v_prefix": f(5, 8, 64), "s_prefix": f(5, 8), "v_suffix": f(5, 8, 64), "s_suffix": f(5, 8),
    }
    ns["caches"] = _EveryLayer(ns)
    return ns


class _EveryLayer:
    """`caches[layer]`: the block's one pool (`cache`, made by the block) for every layer."""

    def __init__(self, ns):
        self.ns = ns

    def __getitem__(self, layer):
        return self.ns["cache"]


def check_serving(ns):
    from conftest import reference_sdpa

    # The last layer's rows against a float64 reference over the pages the table lists.
    k_all, v_all = ns["k_new"], ns["v_new"]
    rows = [(0, 19, slice(0, 20))] + [(1, 0 + r, slice(20, 24)) for r in range(4)]
    q = ns["q"][-1]
    for row, (seq, pos, keys) in enumerate(rows):
        k = np.repeat(k_all[keys].transpose(1, 0, 2), 4, axis=0)[:, : pos + 1]
        v = np.repeat(v_all[keys].transpose(1, 0, 2), 4, axis=0)[:, : pos + 1]
        want = reference_sdpa(q[row][:, None], k, v)[:, 0]
        assert np.abs(np.asarray(ns["out"])[row] - want).max() < 1e-5, (row, seq)
    # merge_state of two states: weights by the exp of their log-sum-exps.
    a, b = np.exp(ns["s_prefix"]), np.exp(ns["s_suffix"])
    want_v = (a[..., None] * ns["v_prefix"] + b[..., None] * ns["v_suffix"]) / (a + b)[..., None]
    assert np.abs(np.asarray(ns["v"]) - want_v).max() < 1e-5
    assert np.abs(np.asarray(ns["s"]) - np.log(a + b)).max() < 1e-5


def setup_check_pytorch_module(tmp):
    return {}


def check_pytorch_module(ns, tmp, code_after):
    """The page runs `wgpu-mha run` between its two blocks, then compares in Python."""
    cli = ROOT / "target" / "release" / "wgpu-mha"
    if not cli.exists():
        pytest.fail(f"{cli} is missing: the guide's `wgpu-mha run` needs it (cargo build --release)")
    subprocess.run(
        [str(cli), "run", "--weights", "mha.safetensors", "--inputs", "inputs.safetensors", "--out", "out.safetensors"],
        check=True, cwd=tmp,
    )
    import io
    import contextlib

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code_after, ns)
    assert float(printed.getvalue().split("(")[1].split(")")[0]) < 1e-4


SETUPS = {
    ("README.md", 0): (setup_front_python, check_front_python),
    ("README.md", 1): (setup_transformers, check_transformers),
    ("docs/python.md", 0): (setup_python_api, check_python_api),
    ("docs/python.md", 1): (setup_serving, check_serving),
    ("docs/python.md", 2): (setup_transformers, check_transformers),
    ("docs/getting-started.md", 0): (setup_check_pytorch_module, "then-next-block"),
    ("docs/getting-started.md", 1): (None, "run-with-previous-block"),
}

ALL = list(blocks())


@pytest.mark.parametrize("page,index,code", ALL, ids=[f"{p}#{i}" for p, i, _ in ALL])
def test_guide_block_runs(page, index, code, tmp_path, monkeypatch):
    assert (page, index) in SETUPS, f"{page} Python block {index} has no setup in test_docs.py"
    setup, check = SETUPS[(page, index)]
    if check == "run-with-previous-block":
        return  # run by the previous block's test, after the command between them
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    ns = setup(tmp_path)
    exec(code, ns)
    if check == "then-next-block":
        after = next(c for p, i, c in ALL if p == page and i == index + 1)
        check_pytorch_module(ns, tmp_path, after)
    else:
        check(ns)


def test_every_block_is_found():
    pages = {p for p, _, _ in ALL}
    assert {"README.md", "docs/python.md", "docs/getting-started.md"} <= pages
    assert len(ALL) == len(SETUPS), "SETUPS names a block that no longer exists"
