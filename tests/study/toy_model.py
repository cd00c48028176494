"""The study tests' toy model: a 2-layer Llama config, hidden 8, MLP 16, 2 heads of 4, vocab 32,
small enough that every plan figure is checked by hand (imported by the tests of tests/study/).

Per layer: q, k, v, o 4 x 8*8 = 256 matmul weights, MLP 3 x 8*16 = 384 -> 640, plus 2 norms of 8;
x 2 layers + lm_head 8*32 = 256 -> 1536 matmul weights. Every parameter: + embedding 256 +
norms 2*2*8 + final norm 8 = 1832; d_attn 8.
"""

from __future__ import annotations


def toy_config(dtype: str) -> dict:
    """The toy model's config.json, in `dtype` ("float32", "bfloat16")."""
    return {
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 4,
        "vocab_size": 32,
        "tie_word_embeddings": False,
        "dtype": dtype,
    }
