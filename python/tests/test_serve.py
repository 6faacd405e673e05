"""The serving API (BatchAttention, PagedKVCache, append_paged_kv_cache, merge_state) against a
float64 numpy reference that gathers each sequence's keys and values from its pages and runs
plain attention: pages shuffled and shared between sequences, NHD and HND, page sizes 1 and 16,
GQA, causal (bottom-right), window_left, softcap, sm_scale, lse; appends; torch in and out;
float16 and q8_0 / q4_0 pools; and every bad index refused by name."""

import numpy as np
import pytest

import wgpu_mha

TOL = 2e-5


def gather(pool, layout, pages, tokens, which):
    """A sequence's keys (which 0) or values as [tokens, H_kv, D] float64."""
    x = np.asarray(pool, dtype=np.float64)[np.asarray(pages, dtype=np.int64), which]
    if layout == "HND":
        x = x.transpose(0, 2, 1, 3)
    return x.reshape(-1, *x.shape[2:])[:tokens]


def reference(q, pool, layout, t, page_size, causal=True, window_left=-1, logits_soft_cap=None, sm_scale=None):
    """(out [total_q, H, D], lse [total_q, H]) in float64, one sequence at a time."""
    q = np.asarray(q, dtype=np.float64)
    h, d = q.shape[1:]
    scale = 1 / np.sqrt(d) if sm_scale is None else sm_scale
    out, lse = np.zeros_like(q), np.zeros(q.shape[:2])
    for s in range(len(t["last"])):
        q0, q1 = t["qo_indptr"][s], t["qo_indptr"][s + 1]
        pages = t["kv_indices"][t["kv_indptr"][s] : t["kv_indptr"][s + 1]]
        kv_len = (len(pages) - 1) * page_size + t["last"][s] if len(pages) else 0
        k, v = (gather(pool, layout, pages, kv_len, w) for w in (0, 1))
        group = h // k.shape[1]
        k, v = k[:, np.arange(h) // group], v[:, np.arange(h) // group]
        pos = kv_len - (q1 - q0) + np.arange(q1 - q0)
        j = np.arange(kv_len)
        seen = np.ones((q1 - q0, kv_len), dtype=bool)
        if causal:
            seen &= j[None] <= pos[:, None]
        if window_left >= 0:
            seen &= j[None] >= pos[:, None] - window_left
        sc = np.einsum("qhd,khd->hqk", q[q0:q1], k) * scale
        if logits_soft_cap:
            sc = logits_soft_cap * np.tanh(sc / logits_soft_cap)
        sc = np.where(seen[None], sc, -np.inf)
        m = sc.max(-1, keepdims=True)
        p = np.exp(sc - m)
        out[q0:q1] = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), v)
        lse[q0:q1] = (m[..., 0] + np.log(p.sum(-1))).T
    return out, lse


def batch(rng, page_size, kv_lens, q_lens, max_pages, share=True):
    """A page table over shuffled pages; sequence 1 shares sequence 0's first full pages."""
    free = list(rng.permutation(max_pages))
    pages = []
    for s, n in enumerate(kv_lens):
        count = -(-n // page_size)
        shared = pages[0][: min(count, kv_lens[0] // page_size) - 1] if (share and s == 1 and pages) else []
        shared = shared[: max(count - 1, 0)]
        own = [free.pop() for _ in range(count - len(shared))]
        pages.append(list(shared) + own)
    return {
        "qo_indptr": np.cumsum([0] + list(q_lens)).astype(np.int32),
        "kv_indptr": np.cumsum([0] + [len(p) for p in pages]).astype(np.int32),
        "kv_indices": np.array([x for p in pages for x in p], dtype=np.int32),
        "last": np.array([(n - 1) % page_size + 1 for n in kv_lens], dtype=np.int32),
    }


def pool_shape(layout, max_pages, page_size, hkv, d):
    return (max_pages, 2, page_size, hkv, d) if layout == "NHD" else (max_pages, 2, hkv, page_size, d)


def random_pool(rng, t, layout, max_pages, page_size, hkv, d):
    """Random pages; pages no sequence lists are NaN (a read of one would show)."""
    pool = rng.standard_normal(pool_shape(layout, max_pages, page_size, hkv, d)).astype(np.float32)
    unused = np.setdiff1d(np.arange(max_pages), t["kv_indices"])
    pool[unused] = np.nan
    return pool


def plan(w, t, h, hkv, d, page_size, **options):
    w.plan(t["qo_indptr"], t["kv_indptr"], t["kv_indices"], t["last"], h, hkv, d, page_size, **options)


CASES = [
    ("NHD", 16, dict()),
    ("HND", 16, dict(window_left=7, logits_soft_cap=2.5)),
    ("NHD", 1, dict(causal=False, sm_scale=0.3)),
    ("HND", 1, dict(window_left=0, sm_scale=0.5, logits_soft_cap=4.0)),
]


@pytest.mark.parametrize("layout,page_size,options", CASES)
def test_batch_matches_the_gathered_reference(layout, page_size, options):
    rng = np.random.default_rng(page_size + len(options))
    h, hkv, d = 4, 2, 16
    # Decode rows, a prefill chunk, a whole prompt, a sequence with no query rows, and one long
    # enough that the plan splits its keys (the merge pass, and its lse).
    kv_lens, q_lens = [37, 40, 5, 20, 300], [1, 12, 5, 0, 3]
    max_pages = sum(-(-n // page_size) for n in kv_lens) + 3
    t = batch(rng, page_size, kv_lens, q_lens, max_pages)
    pool = random_pool(rng, t, layout, max_pages, page_size, hkv, d)
    q = rng.standard_normal((sum(q_lens), h, d)).astype(np.float32)
    want, want_lse = reference(q, pool, layout, t, page_size, **options)

    w = wgpu_mha.BatchAttention(kv_layout=layout)
    plan(w, t, h, hkv, d, page_size, **options)
    assert w._plan.chunk_keys < 300 - 2  # the long sequence's rows see keys of several chunks
    out, lse = w.run(q, pool, return_lse=True)  # a host array, copied for this call
    assert out.dtype == np.float32 and out.shape == q.shape and lse.shape == q.shape[:2]
    np.testing.assert_allclose(out, want, atol=TOL)
    np.testing.assert_allclose(lse, want_lse, atol=TOL, rtol=1e-6)

    cache = wgpu_mha.PagedKVCache.from_array(pool, kv_layout=layout)
    again = w.run(q, cache)  # the device cache; no lse asked
    assert isinstance(again, np.ndarray)
    np.testing.assert_array_equal(again, out)
    np.testing.assert_array_equal(cache.to_numpy(), pool)


def test_torch_in_torch_out(torch):
    rng = np.random.default_rng(3)
    h, hkv, d, ps = 6, 2, 8, 16
    t = batch(rng, ps, [30, 17], [3, 17], 6)
    pool = random_pool(rng, t, "NHD", 6, ps, hkv, d)
    q = rng.standard_normal((20, h, d)).astype(np.float32)
    want, want_lse = reference(q, pool, "NHD", t, ps)
    w = wgpu_mha.BatchAttention()
    w.plan(*(torch.from_numpy(t[k]) for k in ("qo_indptr", "kv_indptr", "kv_indices", "last")), h, hkv, d, ps)
    out, lse = w.run(torch.from_numpy(q), torch.from_numpy(pool), return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), want, atol=TOL)
    np.testing.assert_allclose(lse.numpy(), want_lse, atol=TOL, rtol=1e-6)
    # float16 q is computed in float32 and comes back as float16.
    half = w.run(torch.from_numpy(q).half(), torch.from_numpy(pool))
    assert half.dtype == torch.float16
    np.testing.assert_allclose(half.float().numpy(), reference(q.astype(np.float16), pool, "NHD", t, ps)[0], atol=1e-3)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_then_run(layout, torch):
    rng = np.random.default_rng(5)
    h, hkv, d, ps, max_pages = 4, 1, 8, 16, 12
    cache = wgpu_mha.PagedKVCache(max_pages, ps, hkv, d, kv_layout=layout)
    host = np.zeros(cache.shape, np.float32)
    host_t = torch.zeros(cache.shape)
    # A 21-token prompt and a 33-token prompt, then one decode token each.
    t = batch(rng, ps, [21, 33], [21, 33], max_pages, share=False)
    keys = {s: rng.standard_normal((n + 1, hkv, d)).astype(np.float32) for s, n in ((0, 21), (1, 33))}
    vals = {s: rng.standard_normal((n + 1, hkv, d)).astype(np.float32) for s, n in ((0, 21), (1, 33))}

    def append(seqs, positions, table):
        k = np.concatenate([keys[s][p][None] for s, p in zip(seqs, positions)])
        v = np.concatenate([vals[s][p][None] for s, p in zip(seqs, positions)])
        args = (np.array(seqs), np.array(positions), None, table["kv_indices"], table["kv_indptr"], table["last"])
        for target in (cache, host, host_t):
            a = list(args)
            a[2] = target
            wgpu_mha.append_paged_kv_cache(k, v, *a, kv_layout=layout)

    prompt = [(0, p) for p in range(21)] + [(1, p) for p in range(33)]
    order = rng.permutation(len(prompt))  # ragged tokens in any order
    append([prompt[i][0] for i in order], [prompt[i][1] for i in order], t)
    # The decode step: each sequence one token longer (sequence 1 opens a new page).
    grown = dict(t)
    grown["last"] = t["last"] + 1
    if grown["last"][1] > ps:
        grown["last"] = np.array([t["last"][0] + 1, 1], np.int32)
        page = np.setdiff1d(np.arange(max_pages), t["kv_indices"])[0]
        grown["kv_indices"] = np.append(t["kv_indices"], page).astype(np.int32)
        grown["kv_indptr"] = t["kv_indptr"] + np.array([0, 0, 1], np.int32)
    append([0, 1], [21, 33], grown)

    on_device = cache.to_numpy()
    np.testing.assert_array_equal(on_device, host)
    np.testing.assert_array_equal(host_t.numpy(), host)
    for s, n in ((0, 22), (1, 34)):
        pages = grown["kv_indices"][grown["kv_indptr"][s] : grown["kv_indptr"][s + 1]]
        np.testing.assert_array_equal(gather(host, layout, pages, n, 0), keys[s])
        np.testing.assert_array_equal(gather(host, layout, pages, n, 1), vals[s])

    grown["qo_indptr"] = np.array([0, 1, 2], np.int32)
    q = rng.standard_normal((2, h, d)).astype(np.float32)
    w = wgpu_mha.BatchAttention(kv_layout=layout)
    plan(w, grown, h, hkv, d, ps)
    np.testing.assert_allclose(w.run(q, cache), reference(q, host, layout, grown, ps)[0], atol=TOL)


def test_float16_pool():
    rng = np.random.default_rng(7)
    h, hkv, d, ps = 4, 2, 16, 16
    t = batch(rng, ps, [40, 9], [4, 9], 6)
    pool = random_pool(rng, t, "NHD", 6, ps, hkv, d).astype(np.float16)
    q = rng.standard_normal((13, h, d)).astype(np.float32)
    w = wgpu_mha.BatchAttention()
    if not wgpu_mha.default_device().shader_f16:  # GL
        with pytest.raises(RuntimeError, match="SHADER_F16"):
            plan(w, t, h, hkv, d, ps, kv_data_type="float16")
        with pytest.raises(RuntimeError, match="SHADER_F16"):
            wgpu_mha.PagedKVCache(6, ps, hkv, d, dtype="float16")
        return
    plan(w, t, h, hkv, d, ps, kv_data_type=np.float16)
    cache = wgpu_mha.PagedKVCache.from_array(pool)
    assert cache.dtype == np.float16
    np.testing.assert_array_equal(cache.to_numpy(), pool)
    want = reference(q, pool, "NHD", t, ps)[0]
    np.testing.assert_allclose(w.run(q, cache), want, atol=TOL)
    np.testing.assert_allclose(w.run(q, pool), want, atol=TOL)
    with pytest.raises(ValueError, match="kv_data_type is float16"):
        w.run(q, wgpu_mha.PagedKVCache.from_array(pool.astype(np.float32)))


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_quantized_pool(kv):
    rng = np.random.default_rng(21)
    h, hkv, d, ps = 4, 2, 32, 16
    t = batch(rng, ps, [40, 9], [4, 1], 6)
    pool = rng.standard_normal(pool_shape("NHD", 6, ps, hkv, d)).astype(np.float32)
    cache = wgpu_mha.PagedKVCache.from_array(pool, dtype=kv)
    assert cache.kv_dtype == kv and cache.dtype == np.float32
    assert cache.bytes_per_token == 2 * hkv * d // 32 * (34 if kv == "q8_0" else 18)
    # Read back dequantized: each value within half its block's step (q4_0 at the clamp: a step).
    stored = cache.to_numpy()
    step = np.abs(pool).reshape(-1, 32).max(-1, keepdims=True) / (127 if kv == "q8_0" else 8)
    err = np.abs(stored - pool).reshape(-1, 32)
    assert (err <= step * (0.5 if kv == "q8_0" else 1.0) * 1.01).all()
    # The attention is exact over what the cache holds.
    q = rng.standard_normal((5, h, d)).astype(np.float32)
    w = wgpu_mha.BatchAttention()
    plan(w, t, h, hkv, d, ps, kv_data_type=kv)
    np.testing.assert_allclose(w.run(q, cache), reference(q, stored, "NHD", t, ps)[0], atol=TOL)
    with pytest.raises(ValueError, match="kv_data_type is float32"):
        plan(w, t, h, hkv, d, ps)
        w.run(q, cache)
    with pytest.raises(ValueError, match="head_dim 16"):
        wgpu_mha.PagedKVCache(6, ps, hkv, 16, dtype=kv)


def test_merge_state_is_the_math():
    rng = np.random.default_rng(11)
    n, h, d = 5, 3, 4
    v_a, v_b = rng.standard_normal((2, n, h, d))
    s_a, s_b = rng.standard_normal((2, n, h)) * 5
    s_a[0, 0] = -np.inf  # a state that saw no keys
    s_a[1, 1] = s_b[1, 1] = -np.inf
    v, s = wgpu_mha.merge_state(v_a, s_a, v_b, s_b)
    assert v.dtype == np.float64 and s.dtype == np.float32
    for i in range(n):
        for j in range(h):
            if s_a[i, j] == s_b[i, j] == -np.inf:
                assert s[i, j] == -np.inf and not v[i, j].any()
                continue
            total = np.exp(s_a[i, j]) + np.exp(s_b[i, j])
            want = (np.exp(s_a[i, j]) * v_a[i, j] + np.exp(s_b[i, j]) * v_b[i, j]) / total
            np.testing.assert_allclose(v[i, j], want, rtol=1e-12)
            np.testing.assert_allclose(s[i, j], np.log(total), rtol=1e-6)


def test_merge_state_joins_a_shared_prefix_and_its_suffixes():
    """Cascade: a shared prompt attended once, each suffix apart, merged = one whole run."""
    rng = np.random.default_rng(13)
    h, hkv, d, ps = 4, 2, 8, 16
    pool = rng.standard_normal((8, 2, ps, hkv, d)).astype(np.float32)
    prefix, suffixes = [3, 0], [[5], [1, 6]]  # 32 shared tokens; suffixes of 10 and 20
    lasts = [10, 4]
    q = rng.standard_normal((2, h, d)).astype(np.float32)  # one decode row each
    qo = np.array([0, 1, 2], np.int32)
    w = wgpu_mha.BatchAttention()
    w.plan(qo, np.array([0, 2, 4]), np.array(prefix * 2), np.array([ps, ps]), h, hkv, d, ps, causal=False)
    v_p, s_p = w.run(q, pool, return_lse=True)
    w.plan(qo, np.array([0, 1, 3]), np.array(suffixes[0] + suffixes[1]), np.array(lasts), h, hkv, d, ps, causal=False)
    v_s, s_s = w.run(q, pool, return_lse=True)
    v, s = wgpu_mha.merge_state(v_p, s_p, v_s, s_s)
    whole = {"qo_indptr": qo, "kv_indptr": np.array([0, 3, 7]), "kv_indices": np.array(prefix + suffixes[0] + prefix + suffixes[1]), "last": np.array(lasts)}
    want, want_lse = reference(q, pool, "NHD", whole, ps)
    assert v.dtype == np.float32
    np.testing.assert_allclose(v, want, atol=TOL)
    np.testing.assert_allclose(s, want_lse, atol=TOL, rtol=1e-6)


def test_bad_inputs_are_named():
    h, hkv, d, ps = 2, 1, 4, 16
    pool = np.zeros((4, 2, ps, hkv, d), np.float32)
    good = dict(qo_indptr=np.array([0, 1]), kv_indptr=np.array([0, 2]), kv_indices=np.array([0, 1]), last=np.array([5]))
    q = np.zeros((1, h, d), np.float32)
    w = wgpu_mha.BatchAttention()

    def planned(**changes):
        t = {**good, **changes}
        w.plan(t["qo_indptr"], t["kv_indptr"], t["kv_indices"], t["last"], h, hkv, d, ps)

    for changes, message in [
        (dict(kv_indices=np.array([0, -1])), r"kv_indices\[1\] is -1"),
        (dict(kv_indices=np.array([0, 2**32])), r"kv_indices\[1\] is 4294967296"),
        (dict(kv_indptr=np.array([0, 3])), "kv_indptr ends at 3"),
        (dict(kv_indptr=np.array([1, 2])), r"kv_indptr\[0\] is 1"),
        (dict(last=np.array([0])), r"kv_last_page_len\[0\] is 0"),
        (dict(last=np.array([17])), r"kv_last_page_len\[0\] is 17"),
        (dict(qo_indptr=np.array([0, 22])), "sequence 0 has 22 query rows but holds only 21"),
    ]:
        with pytest.raises(ValueError, match=message):
            planned(**changes)
    with pytest.raises(TypeError, match="kv_indices must be an array of integers"):
        planned(kv_indices=np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="logits_soft_cap must be finite and > 0"):
        w.plan(good["qo_indptr"], good["kv_indptr"], good["kv_indices"], good["last"], h, hkv, d, ps, logits_soft_cap=-1.0)
    with pytest.raises(ValueError, match="window_left must be -1"):
        w.plan(good["qo_indptr"], good["kv_indptr"], good["kv_indices"], good["last"], h, hkv, d, ps, window_left=-2)
    with pytest.raises(ValueError, match="kv_layout"):
        wgpu_mha.BatchAttention(kv_layout="NDH")
    with pytest.raises(RuntimeError, match="before plan"):
        wgpu_mha.BatchAttention().run(q, pool)

    planned(kv_indices=np.array([0, 9]))
    with pytest.raises(ValueError, match="page 9, past the pool's 4 pages"):
        w.run(q, pool)
    planned()
    with pytest.raises(ValueError, match=r"q must be \[total_q 1"):
        w.run(np.zeros((2, h, d), np.float32), pool)
    with pytest.raises(ValueError, match="not the planned NHD pool"):
        w.run(q, np.zeros((4, 2, 8, hkv, d), np.float32))
    with pytest.raises(ValueError, match="the cache is HND"):
        w.run(q, wgpu_mha.PagedKVCache(4, ps, hkv, d, kv_layout="HND"))
    with pytest.raises(ValueError, match="page_size 3 must be a power of two"):
        wgpu_mha.PagedKVCache(4, 3, hkv, d)
    with pytest.raises(TypeError, match="dtype must be float32 or float16"):
        wgpu_mha.PagedKVCache(4, ps, hkv, d, dtype="int8")

    cache = wgpu_mha.PagedKVCache(4, ps, hkv, d)
    kv = np.ones((2, hkv, d), np.float32)
    table = (good["kv_indices"], good["kv_indptr"], good["last"])
    for b, p, message in [
        ([0, 1], [0, 1], r"batch_indices\[1\] is 1, but the page table has 1 sequences"),
        ([0, 0], [3, 21], r"positions\[1\] is 21, past sequence 0's 21 tokens"),
        ([0, 0], [-1, 2], r"positions\[0\] is -1"),
        ([0, 0], [4, 4], "tokens 0 and 1 are both appended to sequence 0's position 4"),
    ]:
        with pytest.raises(ValueError, match=message):
            wgpu_mha.append_paged_kv_cache(kv, kv, np.array(b), np.array(p), cache, *table)
    with pytest.raises(ValueError, match=r"kv_indices\[1\] is page 7, past the pool's 4 pages"):
        wgpu_mha.append_paged_kv_cache(kv, kv, np.array([0, 0]), np.array([0, 1]), cache, np.array([0, 7]), *table[1:])
    with pytest.raises(ValueError, match=r"append_key must be \[n, H_kv 1, D 4\]"):
        wgpu_mha.append_paged_kv_cache(np.ones((2, 2, d), np.float32), kv, np.array([0, 0]), np.array([0, 1]), cache, *table)
    with pytest.raises(TypeError, match="a float numpy array or torch tensor"):
        wgpu_mha.append_paged_kv_cache(kv, kv, np.array([0, 0]), np.array([0, 1]), np.zeros((4, 2, ps, hkv, d), np.int32), *table)
    assert not cache.to_numpy().any()  # nothing was written by a refused append


def test_the_preferred_layout_follows_the_adapter_kind():
    """A software adapter (lavapipe's device_type Cpu) runs the CPU kernel shapes, whose paged
    decode reads HND pages fastest; a GPU keeps FlashInfer's NHD. WGPU_MHA_KERNELS forces the
    kernel class, and the layout follows it."""
    import os

    dev = wgpu_mha.Device()
    listed = [a for a in wgpu_mha.adapters(dev.backend) if a["name"] == dev.name]
    assert listed, f"{dev.name} among the adapters"
    forced = os.environ.get("WGPU_MHA_KERNELS")
    want_class = forced or ("cpu" if listed[0]["device_type"] == "Cpu" else "gpu")
    assert dev.kernel_class == want_class
    assert dev.preferred_kv_layout == {"cpu": "HND", "gpu": "NHD"}[want_class]
    # A cache in that layout serves a plan in it.
    w = wgpu_mha.BatchAttention(kv_layout=dev.preferred_kv_layout, device=dev)
    cache = wgpu_mha.PagedKVCache(2, 4, 1, 8, kv_layout=dev.preferred_kv_layout, device=dev)
    w.plan([0, 1], [0, 1], [1], [3], 2, 1, 8, 4)
    out = w.run(np.zeros((1, 2, 8), np.float32), cache)
    assert np.array_equal(out, np.zeros((1, 2, 8), np.float32))


def test_after_warm_up_no_plan_compiles(tmp_path, monkeypatch):
    """BatchAttention.warm_up compiles every pass a plan of its heads can pick: on a device of
    this test's own, plans of 1, 3, 17 and 300 query rows per sequence, decode rows and keys
    split across work items then compile nothing (the engine logs each pass it compiles to
    WGPU_MHA_PIPELINE_LOG)."""
    log = tmp_path / "compiled.log"
    monkeypatch.setenv("WGPU_MHA_PIPELINE_LOG", str(log))
    dev = wgpu_mha.Device()
    h, hkv, d, ps = 4, 2, 16, 16
    w = wgpu_mha.BatchAttention(kv_layout="HND", device=dev)
    assert w.warm_up(h, hkv, d) > 0
    warmed = log.read_text().count("\n")
    assert warmed > 0, "the warm-up compiled"
    cache = wgpu_mha.PagedKVCache(300, ps, hkv, d, kv_layout="HND", device=dev)
    rng = np.random.default_rng(3)
    for rows in ([1], [3, 1], [17, 1, 1], [300], [1] * 5):
        # The first sequence long enough to be split, the others up to 400 tokens.
        tokens = [r + (1900 if i == 0 else int(rng.integers(0, 400))) for i, r in enumerate(rows)]
        pages = [-(-t // ps) for t in tokens]
        kv_indptr = np.concatenate([[0], np.cumsum(pages)])
        kv_indices = rng.permutation(300)[: kv_indptr[-1]]
        last = [t - (p - 1) * ps for t, p in zip(tokens, pages)]
        qo_indptr = np.concatenate([[0], np.cumsum(rows)])
        w.plan(qo_indptr, kv_indptr, kv_indices, last, h, hkv, d, ps)
        out = w.run(np.ones((qo_indptr[-1], h, d), np.float32), cache)
        assert np.all(np.isfinite(out))
        assert log.read_text().count("\n") == warmed, f"rows {rows} compiled a pass the warm-up did not"
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.warm_up(3, 2, 16)
