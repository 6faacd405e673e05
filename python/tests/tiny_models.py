"""Sizes of the tiny seeded random-init decoders the tests (and tools/kv_quant_accuracy.py)
build from configs; nothing downloaded. Plain Python: importable without pytest or torch."""


def decoder_sizes(hidden=32, heads=4, kv_heads=2, vocab=64, max_positions=64, **extra):
    """Config keywords of a two-layer decoder: hidden size `hidden` (its MLP twice that), `heads`
    query heads over `kv_heads` key/value heads (GQA); `extra`: the family's own keywords."""
    return dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                max_position_embeddings=max_positions, **extra)
