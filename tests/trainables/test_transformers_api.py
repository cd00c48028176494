"""layerswap calls no transformers API that the installed version announces for removal: the
KV-cache argument of a forward (`past_key_values` -> `cache`) and activation checkpointing
(`gradient_checkpointing_enable` -> `activation_checkpointing_enable`) go through small adapters
that take whichever name the installed version has. Fails loudly when a new release deprecates
another call on these paths.

Run: .venv/bin/python -m pytest -q tests/trainables/test_transformers_api.py
"""

from __future__ import annotations

import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from layerswap.trainables.evaluate.proxy_lm import cache_argument, greedy_generate
from layerswap.trainables.train.run_setup import enable_checkpointing
from layerswap.world.tiny import tiny_tokenizer


def _tiny(tok):
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=128)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def _deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning)) and "deprecated" in str(w.message)]  # fmt: skip


def test_generation_passes_the_cache_by_its_current_name():
    tok = tiny_tokenizer()
    model = _tiny(tok)
    assert cache_argument(model) in ("cache", "past_key_values")
    ctxs = [tok("the river city", add_special_tokens=False).input_ids, tok("a", add_special_tokens=False).input_ids]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = greedy_generate(model, tok, ctxs, ["\n\n"], 6, {tok.eos_token_id})
    assert len(out) == 2
    assert not _deprecations(caught), _deprecations(caught)


def test_generation_runs_no_forward_past_the_budget():
    """max_gen_toks tokens need the prefill and max_gen_toks - 1 decoding forwards, no more."""
    tok = tiny_tokenizer()
    model = _tiny(tok)
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    greedy_generate(model, tok, [tok("the river", add_special_tokens=False).input_ids], ["@@never@@"], 5, set())  # fmt: skip
    assert len(calls) == 5  # 1 prefill + 4 steps: the 5th token comes from the 4th step's logits


def test_activation_checkpointing_by_its_current_name():
    model = _tiny(tiny_tokenizer())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enable_checkpointing(model)
    assert model.is_activation_checkpointing if hasattr(model, "is_activation_checkpointing") else True  # fmt: skip
    assert not _deprecations(caught), _deprecations(caught)
