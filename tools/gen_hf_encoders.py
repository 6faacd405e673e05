"""Case files of issue 38's encoder long tail, written by `gen_hf_cases.py --only encoders`
(transformers 5.25). Kept apart from gen_hf_cases.py, which is past its size; `g` is that
module (its FAMILIES, build, saved, replay_case, …)."""

import copy

import torch

import transformers as tf

# Wav2Vec2-like audio encoders: two conv layers (200 samples -> 39 frames), a small positional
# convolution.
AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, initializer_range=0.2)

VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              image_size=8, patch_size=4, num_channels=3, initializer_range=0.2)

BERT_LIKE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=16, initializer_range=0.2)

FAMILIES = {
    "megatron-bert": (tf.MegatronBertModel, tf.MegatronBertConfig, BERT_LIKE),
    "data2vec-text": (tf.Data2VecTextModel, tf.Data2VecTextConfig, dict(BERT_LIKE, pad_token_id=1)),
    "layoutlm": (tf.LayoutLMModel, tf.LayoutLMConfig, BERT_LIKE),
    "esm": (tf.EsmModel, tf.EsmConfig, dict(BERT_LIKE, position_embedding_type="rotary",
                                            pad_token_id=1, mask_token_id=2, rope_theta=1000.0)),
    "sew": (tf.SEWModel, tf.SEWConfig, dict(AUDIO, squeeze_factor=2)),
    "unispeech": (tf.UniSpeechModel, tf.UniSpeechConfig, AUDIO),
    # MusicgenModel: the decoder alone (model_type musicgen_decoder), 2 codebooks.
    "musicgen_decoder": (tf.MusicgenModel, tf.MusicgenDecoderConfig, dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
        num_codebooks=2, max_position_embeddings=16, initializer_factor=0.2, pad_token_id=0,
        bos_token_id=1)),
    "nllb-moe": (tf.NllbMoeModel, tf.NllbMoeConfig, dict(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=2,
        expert_capacity=8, max_position_embeddings=16, init_std=0.2, pad_token_id=1,
        decoder_start_token_id=2)),
    # t5's sizes (d_kv 6 ≠ d_model / num_heads; 8 buckets up to distance 20).
    "umt5": (tf.UMT5Model, tf.UMT5Config, dict(
        vocab_size=64, d_model=32, d_kv=6, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20,
        initializer_factor=1.0)),
    "wavlm": (tf.WavLMModel, tf.WavLMConfig, dict(AUDIO, num_buckets=16, max_bucket_distance=24,
                                                  feat_extract_norm="layer")),
    # local attention, blocks of 3 (local_radius 2); t5's bias sizes.
    "longt5": (tf.LongT5Model, tf.LongT5Config, dict(
        vocab_size=64, d_model=32, d_kv=6, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, local_radius=2,
        encoder_attention_type="local")),
    "beit": (tf.BeitModel, tf.BeitConfig, dict(VISION, use_relative_position_bias=True)),
    "data2vec-vision": (tf.Data2VecVisionModel, tf.Data2VecVisionConfig, dict(
        VISION, use_shared_relative_position_bias=True)),
}


def dense_after(att):
    """The module's answer ends at `output.dense` (before residual and LayerNorm): run it in
    the replay's dtype (a float64 copy for float64)."""
    def run(y, dtype):
        dense = att.output.dense
        return (dense if dtype == torch.float32 else copy.deepcopy(dense).double())(y)
    return run


def bert_like_case(g, out_dir, family, name, pre_norm=False):
    """Self-attention of layer 1, padded. `pre_norm`: the attention module LayerNorms its input
    first (megatron-bert's `ln`): as for llama's input_layernorm, the case's hidden_states are
    what enters the projections (the norm's output), captured at `attention.self`."""
    model = g.build(family)
    config_text, state = g.saved(model)
    g.seeded(name)
    length = 6
    input_ids, pad = g.ids(length), g.lengths_mask([6, 4], length)
    att = model.encoder.layer[1].attention
    dense = dense_after(att)
    module = att.self if pre_norm else att

    def replay(mod, x, kv, mask, dtype):
        self_att = mod if pre_norm else mod.self
        return dense(self_att(x, attention_mask=mask)[0], dtype)

    g.replay_case(out_dir, name, family, model, config_text, state, module=module,
                  prefix="encoder.layer.1.attention.",
                  run=lambda: model(input_ids, attention_mask=pad),
                  replay=replay, pad=pad, hooked_out=att.output.dense)


def encoder_cases(g, out_dir):
    g.FAMILIES.update(FAMILIES)
    bert_like_case(g, out_dir, "megatron-bert", "megatron_bert_self_layer1_padding_pre_norm",
                   pre_norm=True)
    bert_like_case(g, out_dir, "data2vec-text", "data2vec_text_self_layer1_padding")
    bert_like_case(g, out_dir, "layoutlm", "layoutlm_self_layer1_padding")
    esm_case(g, out_dir)
    audio_cases(g, out_dir)
    musicgen_case(g, out_dir)
    nllb_moe_cases(g, out_dir)
    umt5_cases(g, out_dir)
    beit_cases(g, out_dir)
    wavlm_case(g, out_dir)
    longt5_case(g, out_dir)


def esm_case(g, out_dir):
    """ESM-2's layout: rotary (half-split, θ rope_theta) on bert's names, q scaled before the
    rotation, and the attention module's own input LayerNorm (`attention.LayerNorm`), which
    the case starts after, as megatron-bert's. Positions 0..L, as EsmModel's default."""
    name = "esm_self_layer1_padding_pre_norm_rotary"
    model = g.build("esm")
    config_text, state = g.saved(model)
    g.seeded(name)
    length = 6
    input_ids, pad = g.ids(length, low=4), g.lengths_mask([6, 4], length)
    position_ids = torch.arange(length)[None, :].expand(g.B, length)
    att = model.encoder.layer[1].attention
    dense = dense_after(att)
    with torch.no_grad():
        tables32 = model.rotary_embeddings(torch.zeros(1), position_ids)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    inv64 = 1.0 / (model.config.rope_theta
                   ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    assert torch.allclose(inv64.float(), model.rotary_embeddings.inv_freq, rtol=1e-6, atol=0)
    freqs = position_ids[..., None].double() * inv64
    emb = torch.cat((freqs, freqs), dim=-1)
    tables64 = (emb.cos(), emb.sin())

    def replay(mod, x, kv, mask, dtype):
        if dtype == torch.float32:
            y = mod(x, attention_mask=mask, position_embeddings=tables32)[0]
        else:
            with g.dot_float_keeps_float64():  # apply_rotary_pos_emb's q.float()
                y = mod(x, attention_mask=mask, position_embeddings=tables64)[0]
        return dense(y, dtype)

    g.replay_case(out_dir, name, "esm", model, config_text, state, module=att.self,
                  prefix="encoder.layer.1.attention.",
                  run=lambda: model(input_ids, attention_mask=pad),
                  replay=replay, pad=pad, hooked_out=att.output.dense, position_ids=position_ids)


def plain(mod, x, kv, mask, dtype):
    return mod(x, attention_mask=mask)[0]


def audio_cases(g, out_dir):
    """SEW's and UniSpeech's encoder self-attention (bart's names under `attention.`, never
    causal), layer 1 of a forward on raw samples, unpadded."""
    for family, name in [("sew", "sew_self_layer1"), ("unispeech", "unispeech_self_layer1")]:
        model = g.build(family)
        config_text, state = g.saved(model)
        g.seeded(name)
        samples = torch.randn(g.B, 200)
        g.replay_case(out_dir, name, family, model, config_text, state,
                      module=model.encoder.layers[1].attention,
                      prefix="encoder.layers.1.attention.",
                      run=lambda: model(samples), replay=plain)


def musicgen_case(g, out_dir):
    """MusicGen's decoder self-attention (bart's names, no biases, causal), layer 1, padded:
    input_ids are [batch · codebooks, L]."""
    model = g.build("musicgen_decoder")
    config_text, state = g.saved(model)
    name = "musicgen_decoder_self_layer1_causal_padding"
    g.seeded(name)
    length = 6
    input_ids = g.ids(length).repeat(2, 1)
    pad = g.lengths_mask([6, 4], length)
    g.replay_case(out_dir, name, "musicgen_decoder", model, config_text, state,
                  module=model.decoder.layers[1].self_attn,
                  prefix="decoder.layers.1.self_attn.",
                  run=lambda: model(input_ids, attention_mask=pad, use_cache=False),
                  replay=plain, causal=True, pad=pad)


def nllb_moe_cases(g, out_dir):
    """NLLB-MoE: bart's attention in each stack (the experts are outside it); its decoder's
    cross-attention is named `cross_attention`."""
    model = g.build("nllb-moe")
    config_text, state = g.saved(model)
    name = "nllb_moe_encoder_self_layer0_padding"
    g.seeded(name)
    input_ids, pad, dec_ids = g.ids(7), g.lengths_mask([7, 5], 7), g.ids(5)
    run = lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,  # noqa: E731
                        use_cache=False)
    g.replay_case(out_dir, name, "nllb-moe", model, config_text, state,
                  module=model.encoder.layers[0].self_attn, prefix="encoder.layers.0.self_attn.",
                  run=run, replay=plain, pad=pad)

    name = "nllb_moe_decoder_self_layer1_causal"
    g.seeded(name)
    input_ids, pad, dec_ids = g.ids(7), g.lengths_mask([7, 6], 7), g.ids(6)
    g.replay_case(out_dir, name, "nllb-moe", model, config_text, state,
                  module=model.decoder.layers[1].self_attn, prefix="decoder.layers.1.self_attn.",
                  run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                    use_cache=False),
                  replay=plain, causal=True)

    name = "nllb_moe_decoder_cross_layer0_padding"
    g.seeded(name)
    input_ids, pad, dec_ids = g.ids(7), g.lengths_mask([5, 7], 7), g.ids(5)
    run = lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,  # noqa: E731
                        use_cache=False)
    with torch.no_grad():
        enc = model.encoder(input_ids, attention_mask=pad).last_hidden_state
    g.replay_case(out_dir, name, "nllb-moe", model, config_text, state,
                  module=model.decoder.layers[0].cross_attention,
                  prefix="decoder.layers.0.cross_attention.", run=run,
                  replay=lambda mod, x, kv, mask, dt: mod(x, key_value_states=kv,
                                                          attention_mask=mask)[0],
                  attention="cross", pad=pad, kv_from="key_value_states")
    g.check_kv(out_dir, name, enc)


def umt5_cases(g, out_dir):
    """UMT5: T5's attention with a relative bias table in every block's self-attention (not
    block 0's shared), computed by the module itself; block 1 of each stack, padded."""
    model = g.build("umt5")
    config_text, state = g.saved(model)
    name = "umt5_encoder_self_block1_padding"
    g.seeded(name)
    input_ids, pad, dec_ids = g.ids(7), g.lengths_mask([7, 4], 7), g.ids(5)
    g.replay_case(out_dir, name, "umt5", model, config_text, state,
                  module=model.encoder.block[1].layer[0].SelfAttention,
                  prefix="encoder.block.1.layer.0.SelfAttention.",
                  run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                    use_cache=False),
                  replay=plain, pad=pad)

    name = "umt5_decoder_self_block1_causal_padding"
    g.seeded(name)
    input_ids, pad = g.ids(6), g.lengths_mask([6, 5], 6)
    dec_ids, dec_pad = g.ids(7), g.lengths_mask([7, 5], 7)
    g.replay_case(out_dir, name, "umt5", model, config_text, state,
                  module=model.decoder.block[1].layer[0].SelfAttention,
                  prefix="decoder.block.1.layer.0.SelfAttention.",
                  run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                    decoder_attention_mask=dec_pad, use_cache=False),
                  replay=plain, causal=True, pad=dec_pad)


def beit_cases(g, out_dir):
    """BEiT (a table per layer) and data2vec-vision (one shared table, carried beside the
    module): layer 1 of a forward on an 8×8 image (2×2 patches + [CLS]). The tables, zeros at
    init, get seeded values so that the bias changes the answer; the replay builds the bias
    with the model's own module in its dtype and passes it as the attention mask, as the layer
    does."""
    for family, name, shared in [
            ("beit", "beit_self_layer1_relative_bias", False),
            ("data2vec-vision", "data2vec_vision_self_layer1_shared_relative_bias", True)]:
        model = g.build(family)
        with torch.no_grad():
            for n, p in sorted(model.named_parameters()):
                if n.endswith("relative_position_bias_table"):
                    p.normal_()
        config_text, state = g.saved(model)
        g.seeded(name)
        pixels = torch.randn(g.B, 3, 8, 8)
        # BEiT's modules are `layers`, `shared_position_bias` in memory (saved under the legacy
        # names); data2vec-vision keeps `encoder.layer`, `encoder.relative_position_bias`.
        stack = model if family == "beit" else model.encoder
        layer = (stack.layers if family == "beit" else stack.layer)[1]
        shared_table = getattr(stack, "shared_position_bias", None) or getattr(
            stack, "relative_position_bias", None)
        table = shared_table if shared else layer.relative_position_bias

        def replay(mod, x, kv, mask, dtype, table=table, family=family):
            t = table if dtype == torch.float32 else copy.deepcopy(table).double()
            bias = t((2, 2), False, dim_size=x.shape[1])
            assert bias.dtype == dtype
            if family == "beit":  # the layer passes the bias as the attention mask
                return mod(x, attention_mask=bias)[0]
            return mod(x, relative_position_bias=bias, resolution=(8, 8))[0]

        extra = ("encoder.relative_position_bias.relative_position_bias_table",) if shared else ()
        g.replay_case(out_dir, name, family, model, config_text, state, module=layer.attention,
                      prefix="encoder.layer.1.attention.", run=lambda: model(pixels),
                      replay=replay, extra=extra)


def wavlm_case(g, out_dir):
    """WavLM's layer 1: the position bias of layer 0's table (`rel_attn_embed`, carried beside
    the module), gated by the module from its input; padded samples give the feature-level
    [B, L] mask the encoder passes to each layer (1 = real frame), as the case's
    attention_mask. Small buckets (16 up to distance 24) put distances ≥ 4 in the far ones."""
    model = g.build("wavlm")
    config_text, state = g.saved(model)
    name = "wavlm_self_layer1_padding_gated_bias"
    g.seeded(name)
    samples = torch.randn(g.B, 200)
    sample_mask = g.lengths_mask([200, 150], 200)
    layers = model.encoder.layers
    args, kwargs, _ = g.capture(layers[1].attention,
                                lambda: model(samples, attention_mask=sample_mask))
    frames = kwargs["attention_mask"].detach()
    assert frames.shape == (g.B, args[0].shape[1] if args else kwargs["hidden_states"].shape[1])
    assert not frames.all(), "the padded row has padded frames"

    def replay(mod, x, kv, mask, dtype):
        table = layers[0].attention
        table = table if dtype == torch.float32 else copy.deepcopy(table).double()
        length = x.shape[1]
        bias = table.compute_bias(length, length)
        bias = bias.unsqueeze(0).repeat(g.B, 1, 1, 1).view(g.B * bias.shape[0], length, length)
        assert bias.dtype == dtype
        return mod(x, attention_mask=frames, position_bias=bias)[0]

    g.replay_case(out_dir, name, "wavlm", model, config_text, state, module=layers[1].attention,
                  prefix="encoder.layers.1.attention.",
                  run=lambda: model(samples, attention_mask=sample_mask), replay=replay,
                  pad=frames, extra=("encoder.layers.0.attention.rel_attn_embed.weight",))


TABLE = "LocalSelfAttention.relative_attention_bias.weight"


def longt5_case(g, out_dir):
    """LongT5's local attention (encoder_attention_type "local"), block 1 of the encoder: keys
    within local_radius of the query (blocks of local_radius + 1; 8 tokens make 3 blocks, the
    last padded) and t5's bidirectional bias of block 0's table, which a later block receives
    with the local mask folded in (-1e10) as position_bias. Its softmax(scores.float()) keeps
    float64 in the float64 replay."""
    model = g.build("longt5")
    config_text, state = g.saved(model)
    name = "longt5_encoder_self_block1_local"
    g.seeded(name)
    # No padding: LongT5 masks padded queries too, whose rows are then uniform over their
    # window in transformers (the loader refuses a padded attention_mask).
    input_ids, pad, dec_ids = g.ids(8), g.lengths_mask([8, 8], 8), g.ids(5)
    block_len = model.config.local_radius + 1
    local = tf.models.longt5.modeling_longt5._get_local_attention_mask(pad, block_len, "cpu")
    table = model.encoder.block[0].layer[0].LocalSelfAttention

    def replay(mod, x, kv, mask, dtype):
        t = table if dtype == torch.float32 else copy.deepcopy(table).double()
        bias = t.compute_bias(block_len)
        bias = bias + torch.where(local > 0, 0.0, -1e10).transpose(1, 2).to(dtype)
        with g.dot_float_keeps_float64():
            return mod(x, position_bias=bias)[0]

    g.replay_case(out_dir, name, "longt5", model, config_text, state,
                  module=model.encoder.block[1].layer[0].LocalSelfAttention,
                  prefix="encoder.block.1.layer.0.LocalSelfAttention.",
                  run=lambda: model(input_ids, attention_mask=pad, decoder_input_ids=dec_ids,
                                    use_cache=False),
                  replay=replay,
                  extra=(f"encoder.block.0.layer.0.{TABLE}",))

    # The decoder's self-attention is t5's (block 0 holds its table), causal and padded.
    name = "longt5_decoder_self_block0_causal_padding"
    g.seeded(name)
    input_ids, dec_ids, dec_pad = g.ids(6), g.ids(7), g.lengths_mask([7, 5], 7)
    g.replay_case(out_dir, name, "longt5", model, config_text, state,
                  module=model.decoder.block[0].layer[0].SelfAttention,
                  prefix="decoder.block.0.layer.0.SelfAttention.",
                  run=lambda: model(input_ids, decoder_input_ids=dec_ids,
                                    decoder_attention_mask=dec_pad, use_cache=False),
                  replay=lambda mod, x, kv, mask, dt: mod(x, mask=mask)[0], causal=True,
                  pad=dec_pad)
