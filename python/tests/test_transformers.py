"""transformers as the client: seeded random-init tiny models built from configs (nothing
downloaded) run with ``attn_implementation="wgpu_mha"`` (wgpu_mha.transformers.register) against
the same model with ``"eager"``: greedy generate() gives the same tokens, logits and hidden
states agree within 1e-4."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

import wgpu_mha.transformers as wt  # noqa: E402
from tiny_models import decoder_sizes  # noqa: E402

NEW_TOKENS = 32
TOL = 1e-4
VOCAB = 96


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert wt.register() == "wgpu_mha"


@pytest.fixture
def calls(monkeypatch):
    """Counts the engine's attention calls, to know that wgpu_mha computed them."""
    n = [0]
    sdpa = wt._native.sdpa

    def counted(*a, **kw):
        n[0] += 1
        return sdpa(*a, **kw)

    monkeypatch.setattr(wt._native, "sdpa", counted)
    return n


def _small(**kw):
    return decoder_sizes(vocab=VOCAB, max_positions=128, **kw)


DECODERS = {
    "llama": lambda: transformers.LlamaConfig(**_small()),  # GQA + RoPE
    "qwen2": lambda: transformers.Qwen2Config(**_small()),  # q/k/v biases
    # A window of 5 over prompts of 7 and 32 more tokens: the window binds from the prompt on.
    "mistral": lambda: transformers.MistralConfig(**_small(sliding_window=5)),
    "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, vocab_size=VOCAB),
}


def _model(family, attn):
    torch.manual_seed(0)
    cfg = DECODERS[family]()
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def _prompt(batch=1, length=7, left_pad=0):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if left_pad:
        mask[-1, :left_pad] = 0
        ids[-1, :left_pad] = 0
    return ids, mask


def _generate(model, ids, mask):
    with torch.no_grad():
        return model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


@pytest.mark.parametrize("family", sorted(DECODERS))
def test_generate_matches_eager(family, calls):
    ids, mask = _prompt()
    eager = _model(family, "eager")
    ours = _model(family, "wgpu_mha")
    assert ours.config._attn_implementation == "wgpu_mha"
    err = (_logits(ours, ids, mask) - _logits(eager, ids, mask)).abs().max().item()
    assert err <= TOL, err
    want = _generate(eager, ids, mask)
    assert want.shape[1] == ids.shape[1] + NEW_TOKENS
    assert torch.equal(_generate(ours, ids, mask), want)
    # The logits' forward and every generate() step, in each of the 2 layers.
    assert calls[0] == 2 * (1 + NEW_TOKENS)


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt2"])
def test_left_padded_batch_and_set_attn_implementation(family):
    ids, mask = _prompt(batch=2, length=7, left_pad=3)
    model = _model(family, "eager")
    want_logits, want = _logits(model, ids, mask), _generate(model, ids, mask)
    model.set_attn_implementation("wgpu_mha")
    assert model.config._attn_implementation == "wgpu_mha"
    got = _logits(model, ids, mask)
    real = mask.bool()
    assert (got - want_logits)[real].abs().max().item() <= TOL
    assert torch.equal(_generate(model, ids, mask), want)


def _pair(make, *args):
    """The same seeded model with eager and with wgpu_mha attention."""
    out = []
    for attn in ("eager", "wgpu_mha"):
        torch.manual_seed(0)
        out.append(make(attn, *args).eval())
    return out


def _close(a, b):
    err = (a - b).abs().max().item()
    assert err <= TOL, err


def test_encoder_bert_forward():
    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB
    )
    eager, ours = _pair(lambda attn: transformers.AutoModel.from_config(cfg, attn_implementation=attn))
    ids, mask = _prompt(batch=2, length=7, left_pad=0)
    mask[1, 5:] = 0  # right padding
    with torch.no_grad():
        _close(ours(ids, attention_mask=mask).last_hidden_state, eager(ids, attention_mask=mask).last_hidden_state)


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_encoder_decoder_forward(kind):
    if kind == "bart":
        cfg = transformers.BartConfig(
            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
        )
    else:  # relative position bias, no scaling
        cfg = transformers.T5Config(
            d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=VOCAB,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
        )
    eager, ours = _pair(lambda attn: transformers.AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation=attn))
    ids, mask = _prompt(batch=2, length=7)
    mask[1, 5:] = 0
    dec, _ = _prompt(batch=2, length=5)
    with torch.no_grad():
        want = eager(ids, attention_mask=mask, decoder_input_ids=dec)
        got = ours(ids, attention_mask=mask, decoder_input_ids=dec)
    _close(got.encoder_last_hidden_state, want.encoder_last_hidden_state)
    _close(got.logits, want.logits)


def test_softcap_and_sinks():
    """gemma2 passes softcap (and a sliding window on every other layer), gpt-oss its sinks as
    s_aux: prompt logits and greedy tokens as eager's, through register() and accelerate()."""
    configs = [
        transformers.Gemma2Config(
            **_small(head_dim=8, sliding_window=4, attn_logit_softcapping=2.0, final_logit_softcapping=None)
        ),
        transformers.GptOssConfig(
            **_small(head_dim=8, sliding_window=4, num_local_experts=2, num_experts_per_tok=1)
        ),
    ]
    for cfg in configs:
        eager, ours = _pair(lambda attn: transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn))
        if hasattr(ours.model.layers[0].self_attn, "sinks"):
            for m in (eager, ours):  # zeros-initialised: make the sinks count
                torch.manual_seed(2)
                for layer in m.model.layers:
                    layer.self_attn.sinks.data.normal_()
        ids, mask = _prompt()
        want_logits, want = _logits(eager, ids, mask), _generate(eager, ids, mask)
        _close(_logits(ours, ids, mask), want_logits)
        assert torch.equal(_generate(ours, ids, mask), want)
        assert len(wt.accelerate(eager)) == 2  # and the same through accelerate()
        _close(_logits(eager, ids, mask), want_logits)
        assert torch.equal(_generate(eager, ids, mask), want)


def test_refusals():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**_small(attention_dropout=0.1))
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="wgpu_mha")
    ids, mask = _prompt()
    model.train()
    with pytest.raises(ValueError, match="dropout=0.1.*model.eval"):
        model(ids, attention_mask=mask)
    model.eval()
    attn = model.model.layers[0].self_attn
    q = torch.zeros(1, 4, 3, 8)
    k = torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match="wgpu_mha attention .*LlamaAttention.*unknown_knob"):
        wt.attention_forward(attn, q, k, k, None, unknown_knob=3)
    with pytest.raises(ValueError, match="LlamaAttention"):  # 4 query heads over 3 key/value heads
        wt.attention_forward(attn, q, torch.zeros(1, 3, 3, 8), torch.zeros(1, 3, 3, 8), None)
    # Still works.
    assert model(ids, attention_mask=mask).logits.shape == (1, 7, VOCAB)


def test_output_attentions_gives_the_weights():
    eager, ours = _pair(lambda attn: transformers.AutoModelForCausalLM.from_config(DECODERS["llama"](), attn_implementation=attn))
    ids, mask = _prompt(batch=2, length=7, left_pad=3)
    with torch.no_grad():
        want = eager(ids, attention_mask=mask, output_attentions=True).attentions
        got = ours(ids, attention_mask=mask, output_attentions=True).attentions
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape == (2, 4, 7, 7)
        _close(g, w)


# accelerate(model): whole attention modules on the device, keys and values in a device KvCache.


@pytest.mark.parametrize("family", sorted(DECODERS))
def test_accelerate_generate_matches_eager(family, calls):
    ids, mask = _prompt()
    model = _model(family, "eager")
    want_logits, want = _logits(model, ids, mask), _generate(model, ids, mask)
    names = wt.accelerate(model)
    assert len(names) == 2 and all(type(model.get_submodule(n)).__name__ == "WgpuAttention" for n in names)
    _close(_logits(model, ids, mask), want_logits)
    assert torch.equal(_generate(model, ids, mask), want)
    assert calls[0] == 0  # module-level path: no per-call attention through the core op


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt2"])
def test_accelerate_left_padded_batch_past_the_first_capacity(family):
    """60 new tokens after 7: the device cache (64 first) grows on the way, refilled exactly."""
    ids, mask = _prompt(batch=2, length=7, left_pad=3)
    model = _model(family, "eager")
    with torch.no_grad():
        kw = dict(attention_mask=mask, max_new_tokens=60, min_new_tokens=60, do_sample=False, pad_token_id=0)
        want_logits, want = _logits(model, ids, mask), model.generate(ids, **kw)
        wt.accelerate(model)
        got = model.generate(ids, **kw)
    assert (_logits(model, ids, mask) - want_logits)[mask.bool()].abs().max().item() <= TOL
    assert torch.equal(got, want)
    # A second generate() starts over on the same device caches.
    assert torch.equal(_generate(model, ids, mask), _generate(_model(family, "eager"), ids, mask))


def test_accelerate_refusals_and_what_it_leaves(caplog):
    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB
    )
    torch.manual_seed(0)
    t5 = transformers.AutoModelForSeq2SeqLM.from_config(
        transformers.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
                              vocab_size=VOCAB, decoder_start_token_id=0),
        attn_implementation="eager",
    ).eval()
    with caplog.at_level("INFO", logger="wgpu_mha.transformers"):
        assert wt.accelerate(t5) == []
    assert "left encoder.block.0.layer.0.SelfAttention (T5Attention) alone" in caplog.text

    model = _model("llama", "eager")
    model.train()
    with pytest.raises(ValueError, match="training mode"):
        wt.accelerate(model)
    model.eval()
    wt.accelerate(model)
    ids, mask = _prompt(batch=2)
    with torch.no_grad(), pytest.raises(ValueError, match="beam search|cropped, reordered"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=0)
    with torch.no_grad(), pytest.raises(ValueError, match="DynamicCache"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                       cache_implementation="static")
    with torch.no_grad(), pytest.raises(ValueError, match="4-D attention_mask"):
        model(ids, attention_mask=mask[:, None, None, :].bool())
    assert wt.accelerate(model) == []  # already on the device
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
        assert torch.equal(model.lm_head(model.model(ids, attention_mask=mask).last_hidden_state), want)
        with pytest.raises(ValueError, match="outside the forward of its model's stack"):
            model.model.layers[0].self_attn(torch.zeros(2, 7, 32))  # no 2-D mask to read
    # Still works after the refusals.
    assert _generate(model, ids, mask).shape == (2, 7 + NEW_TOKENS)


def test_accelerate_encoder_bert():
    """BERT's attention is q/k/v under `attention.self` and the output projection under
    `attention.output` beside its add & norm: the device module takes both projections, the
    add & norm stays in torch."""
    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB
    )
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg, attn_implementation="eager").eval()
    ids, mask = _prompt(batch=2, length=7, left_pad=0)
    mask[1, 5:] = 0  # right padding
    with torch.no_grad():
        want = model(ids, attention_mask=mask).last_hidden_state
        assert wt.accelerate(model) == ["encoder.layer.0.attention", "encoder.layer.1.attention"]
        got = model(ids, attention_mask=mask).last_hidden_state
    _close(got, want)


def _bart(attn="eager"):
    torch.manual_seed(0)
    cfg = transformers.BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
    )
    return transformers.AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation=attn).eval()


def test_accelerate_encoder_decoder_bart():
    """Encoder self-attention, the decoder's cached self-attention and its cross-attention, each
    with its own 2-D mask: forward and greedy generate() as eager's."""
    model = _bart()
    ids, mask = _prompt(batch=2, length=7)
    mask[1, 5:] = 0
    dec, _ = _prompt(batch=2, length=5)
    kw = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.no_grad():
        want = model(ids, attention_mask=mask, decoder_input_ids=dec)
        want_ids = model.generate(ids, **kw)
        names = wt.accelerate(model)
        assert len(names) == 6 and "model.decoder.layers.1.encoder_attn" in names
        got = model(ids, attention_mask=mask, decoder_input_ids=dec)
        got_ids = model.generate(ids, **kw)
    _close(got.encoder_last_hidden_state, want.encoder_last_hidden_state)
    _close(got.logits, want.logits)
    assert torch.equal(got_ids, want_ids)
