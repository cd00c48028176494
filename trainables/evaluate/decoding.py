"""The decoding rules lm-eval's HFLM gets from `model.generate`, resolved for the proxy evaluator.

HFLM calls `model.generate(..., do_sample=False, **task generation_kwargs)`, so the checkpoint's
generation_config.json and the task's kwargs both shape greedy outputs. `decoding_rules(model,
kwargs, max_gen_toks, where)` merges them as generate does and returns what the proxy's greedy
loop (trainables/evaluate/proxy_lm.greedy_generate) applies; a setting it cannot apply exactly is
refused, naming it, so the proxy never scores under other rules than lm-eval.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

# What the greedy loop does with each setting generate() reads. Every other setting must keep
# its neutral value (None or transformers' global default) or the rules are refused.
APPLIED = {"repetition_penalty", "no_repeat_ngram_size", "max_new_tokens", "eos_token_id", "do_sample"}  # fmt: skip
# Read by sampling (logits warpers) or beam search only: greedy argmax never sees them.
# renormalize_logits is a log_softmax after the processors, which keeps the argmax.
GREEDY_IGNORES = {
    "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
    "top_h", "length_penalty", "early_stopping", "renormalize_logits",
}  # fmt: skip
# Bookkeeping, caching and output format; max_length is the one lm-eval passes itself.
NO_EFFECT = {
    "_from_model_config", "transformers_version", "bos_token_id", "pad_token_id",
    "decoder_start_token_id", "use_cache", "cache_implementation", "cache_config", "max_cache_len",
    "compile_config", "disable_compile", "prefill_chunk_size", "continuous_batching_config",
    "output_attentions", "output_hidden_states", "output_scores", "output_logits",
    "return_dict_in_generate", "max_length",
}  # fmt: skip


@dataclass(frozen=True)
class DecodingRules:
    """Greedy decoding as model.generate runs it for one task on one model.

    max_new_tokens: the new-token budget (generation_config's max_new_tokens wins over the
        max_length lm-eval passes, as in generate).
    eos_ids: token ids that end a row (None: the caller's fallback).
    """

    max_new_tokens: int
    eos_ids: frozenset[int] | None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int = 0

    def processors(self, pad_lengths: torch.Tensor) -> LogitsProcessorList | None:
        """The logits processors generate builds, in its order (None when there are none).

        Args:
            pad_lengths: [rows] left-padding per row (generate's prompt_ignore_length).
        """
        out = LogitsProcessorList()
        if self.repetition_penalty is not None:
            out.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty, pad_lengths))
        if self.no_repeat_ngram_size > 0:
            out.append(NoRepeatNGramLogitsProcessor(self.no_repeat_ngram_size))
        return out or None


def hflm_generate_kwargs(kwargs: dict) -> dict:
    """What HFLM._model_generate passes to generate from normalized task kwargs.

    Args:
        kwargs: lm_eval normalize_gen_kwargs output, `until` and `max_gen_toks` removed.
    """
    kw = dict(kwargs)
    kw["temperature"] = kw.get("temperature", 0.0)
    if kw["temperature"] == 0.0 and kw.get("do_sample") is None:
        kw["do_sample"] = False
    if kw.get("do_sample") is False and kw["temperature"] == 0.0:
        kw.pop("temperature")
    return kw


def _effective(model, kw: dict) -> tuple[GenerationConfig, dict]:
    """generate()'s own merge: model.generation_config under the call's kwargs (no model: the
    global defaults, to check a task's kwargs before any model exists)."""
    # Private transformers API (5.24; pyproject allows <6), used so the merge is generate's
    # own: tests/trainables/evaluate/test_decoding.py compares with HFLM and fails if it moves.
    if model is not None:
        return model._prepare_generation_config(None, **kw)
    g = GenerationConfig()
    g.update(**g._get_default_generation_params(), defaults_only=True)
    return g, g.update(**kw)


def decoding_rules(model, kwargs: dict, max_gen_toks: int, where: str) -> DecodingRules:
    """The greedy rules generate() would use for this task on this model, or a refusal.

    Args:
        model: the causal LM (its generation_config), or None to check the task's kwargs alone.
        kwargs: the task's normalized generation kwargs without `until`/`max_gen_toks`.
        max_gen_toks: lm-eval's budget (used unless generation_config sets max_new_tokens).
        where: "task T" or "task T on model M", for the error.
    Returns:
        DecodingRules.
    Raises:
        ValueError naming the setting when it would change outputs and is not applied here.
    """
    if "max_length" in kwargs:  # HFLM takes it as the absolute length: another budget rule
        raise ValueError(f"{where}: generation setting max_length is not supported (use max_gen_toks)")  # fmt: skip
    g, extra = _effective(model, hflm_generate_kwargs(kwargs))
    if extra:  # generate passes unknown kwargs on to the model's forward
        raise ValueError(f"{where}: generation settings {sorted(extra)} are not generation options")  # fmt: skip
    if g.do_sample:
        raise ValueError(f"{where}: generation setting do_sample=True (sampling) is not supported; the proxy decodes greedily")  # fmt: skip
    defaults = g._get_default_generation_params()
    for key, value in sorted(g.to_dict().items()):
        if key in APPLIED | GREEDY_IGNORES | NO_EFFECT or value is None:
            continue
        if key not in defaults or value != defaults[key]:
            raise ValueError(
                f"{where}: generation setting {key}={value!r} would change lm-eval's outputs and "
                "is not applied by the proxy evaluator (use the lm_eval backend)"
            )
    eos = g.eos_token_id
    rp = g.repetition_penalty
    return DecodingRules(
        max_new_tokens=int(g.max_new_tokens) if g.max_new_tokens is not None else max_gen_toks,
        eos_ids=None if eos is None else frozenset(eos if isinstance(eos, list) else [eos]),
        repetition_penalty=float(rp) if rp is not None and rp != 1.0 else None,
        no_repeat_ngram_size=int(g.no_repeat_ngram_size or 0),
    )
