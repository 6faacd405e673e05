"""Calls from several Python threads at once (the GIL is released while the GPU works) agree
with the same calls made one by one; devices and adapters."""

import threading

import numpy as np
import pytest

import wgpu_mha
from conftest import HF_FIXTURES, read_safetensors


def test_threads_share_the_device_and_modules():
    rng = np.random.default_rng(0)
    jobs = []
    for i in range(8):
        q = rng.standard_normal((2, 4, 5, 8), dtype=np.float32)
        k = rng.standard_normal((2, 2, 9, 8), dtype=np.float32)
        v = rng.standard_normal((2, 2, 9, 8), dtype=np.float32)
        jobs.append((q, k, v, rng.random((5, 9)) > 0.3))
    path = HF_FIXTURES / "llama_self_layer1_causal_padding_gqa_llama3.safetensors"
    t, meta = read_safetensors(path)
    module = wgpu_mha.load(path, prefix=meta["prefix"])
    hf_args = dict(attention_mask=t["attention_mask"], position_ids=t["position_ids"])

    def run(job):
        q, k, v, m = job
        return wgpu_mha.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    want = [run(j) for j in jobs]
    want_hf = module(t["hidden_states"], **hf_args)
    results, errors = {}, []

    def worker(w):
        try:
            for rep in range(3):
                i = (w + rep) % len(jobs)
                results[(w, rep)] = (i, run(jobs[i]), module(t["hidden_states"], **hf_args))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(results) == 18
    for i, out, hf in results.values():
        np.testing.assert_array_equal(out, want[i])
        np.testing.assert_array_equal(hf, want_hf)


def test_devices_and_adapters():
    found = wgpu_mha.adapters()
    assert found and {"name", "backend", "device_type", "driver", "shader_f16"} <= set(found[0])
    d = wgpu_mha.Device()
    assert d.backend in {"vulkan", "metal", "dx12", "gl"} and d.name
    assert "Device(" in repr(d)
    q = np.ones((1, 1, 2, 4), np.float32)
    out = wgpu_mha.scaled_dot_product_attention(q, q, q, device=d)
    np.testing.assert_allclose(out, q)
    with pytest.raises(RuntimeError):
        wgpu_mha.Device(adapter="no adapter is called this")
    with pytest.raises(TypeError):
        wgpu_mha.scaled_dot_product_attention(q, q, q, device="cpu")
