"""Case files of issue 38's encoder long tail, written by `gen_hf_cases.py --only encoders`
(transformers 5.25). Kept apart from gen_hf_cases.py, which is past its size; `g` is that
module (its FAMILIES, build, saved, replay_case, …)."""

import copy

import torch

import transformers as tf

BERT_LIKE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=16, initializer_range=0.2)

FAMILIES = {
    "megatron-bert": (tf.MegatronBertModel, tf.MegatronBertConfig, BERT_LIKE),
    "data2vec-text": (tf.Data2VecTextModel, tf.Data2VecTextConfig, dict(BERT_LIKE, pad_token_id=1)),
    "layoutlm": (tf.LayoutLMModel, tf.LayoutLMConfig, BERT_LIKE),
}


def dense_after(att):
    """The module's answer ends at `output.dense` (before residual and LayerNorm): run it in
    the replay's dtype (a float64 copy for float64)."""
    def run(y, dtype):
        dense = att.output.dense if dtype == torch.float32 else copy.deepcopy(att.output.dense).double()
        return dense(y)
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
