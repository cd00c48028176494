"""Evaluation batches that fit: a memory estimate per lm-eval request kind, and a back-off that
halves the batch on out-of-memory instead of losing the model's evaluation.

Why: lm-eval's HFLM takes log-softmax over every position x the whole vocabulary. Belebele
5-shot (~2,100 tokens) at batch 32 on a 128,256-token vocabulary is 32 x 2,100 x 128,256 bf16
logits plus as many log-probabilities, ~32 GiB before the model's 16 GB: over an L40S and most
of an H100, and Telugu prompts are 2-3x longer. A fixed `promote.batch_size` therefore failed
every model; this module picks the largest batch the device holds, and backs off if it was wrong.
Tests: tests/trainables/evaluate/test_fit.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
# Share of the free device memory an estimate may plan for: the allocator's fragmentation and
# the activations the estimate leaves out (attention, MLP intermediates) take the rest.
USABLE = 0.8


@dataclass(frozen=True)
class RowShape:
    """The longest request of one task, in tokens: what one row of a batch costs at most.

    Args:
        kind: "loglikelihood" (multiple choice: every position's log-softmax) or "generate".
        tokens: the longest context + continuation (loglikelihood) or prompt (generate).
        new_tokens: generate only: max_gen_toks.
    """

    kind: str
    tokens: int
    new_tokens: int = 0


def row_bytes(row: RowShape, config, dtype_bytes: int = 2) -> int:
    """Device bytes one batch row of `row` takes beyond the weights.

    loglikelihood: the logits and their log-softmax, [tokens, vocab] each in the model's dtype
    (HFLM's F.log_softmax keeps the dtype), plus the hidden states of every layer's input
    kept during the forward pass of a no-grad model (one [tokens, hidden] at a time, x 4 for the
    MLP's intermediate). generate: the KV cache of prompt + new tokens (2 x layers x kv heads x
    head dim), the prompt's MLP intermediate, and one position's logits (transformers' generate
    keeps only the last position's).

    Args:
        row: the longest request.
        config: the model's transformers config.
        dtype_bytes: bytes per element of the model's dtype (2 for bf16).
    """
    hidden, vocab = config.hidden_size, config.vocab_size
    inter = getattr(config, "intermediate_size", 4 * hidden)
    if row.kind == "loglikelihood":
        return row.tokens * (2 * vocab + 2 * hidden + inter) * dtype_bytes
    if row.kind != "generate":
        raise ValueError(f"request kind {row.kind!r}: expected loglikelihood or generate")
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    n = row.tokens + row.new_tokens
    cache = 2 * config.num_hidden_layers * kv * head_dim * n
    return (cache + row.tokens * (2 * hidden + inter) + 2 * vocab) * dtype_bytes


def fitting_batch(rows: list[RowShape], config, free_bytes: int, want: int, dtype_bytes: int = 2) -> int:  # fmt: skip
    """The largest batch <= `want` whose costliest row times the batch fits USABLE x free_bytes.

    Args:
        rows: the longest request of each task one lm-eval run evaluates.
        config: the model's config.
        free_bytes: device memory free with the model loaded.
        want: the configured batch size (the most it may be).
    Returns:
        at least 1 (a batch of one that does not fit is left to the back-off to report).
    """
    if not rows:
        return want
    per_row = max(row_bytes(r, config, dtype_bytes) for r in rows)
    return max(1, min(want, int(USABLE * free_bytes // per_row)))


def is_out_of_memory(e: BaseException) -> bool:
    """True for a device out-of-memory error (CUDA's, or an allocator's RuntimeError saying so)."""
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e).lower()
    )


def backing_off(run: Callable[[int], T], batch: int, on_backoff: Callable[[int, int], None] | None = None) -> tuple[T, int]:  # fmt: skip
    """`run(batch)`, halving the batch on out-of-memory down to 1.

    Args:
        run: the evaluation at a batch size.
        batch: the first batch size to try.
        on_backoff: called with (failed batch, next batch) before each retry.
    Returns:
        (run's result, the batch size that worked).
    Raises:
        the out-of-memory error of batch 1, or any other error at once.
    """
    import gc

    import torch

    while True:
        try:
            return run(batch), batch
        except Exception as e:
            if not is_out_of_memory(e) or batch == 1:
                raise
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        nxt = max(1, batch // 2)
        if on_backoff is not None:
            on_backoff(batch, nxt)
        batch = nxt


def task_rows(evaluator) -> list[RowShape]:
    """The longest request of each task a ProxyEvaluator prompted and tokenized.

    Args:
        evaluator: a trainables.evaluate.proxy.ProxyEvaluator (its prompts, as HFLM builds them).
    """
    rows = []
    for c in evaluator.tasks.values():
        if not c.items:
            continue
        if c.kind == "multiple_choice":
            longest = max(len(it.ctx_ids) + max(map(len, it.cont_ids)) for it in c.items)
            rows.append(RowShape("loglikelihood", longest))
        else:
            longest = max(len(it.ctx_ids) for it in c.items)
            rows.append(RowShape("generate", longest, c.max_gen_toks))
    return rows


@dataclass(frozen=True)
class EvalBatch:
    """What one lm-eval run should be given: a batch size and a max_length bound."""

    batch_size: int | str
    max_length: int | None
    why: str


def eval_batch(model, tokenizer, tasks: list[str], *, include_path, limit, num_fewshot, max_gen_toks: int, want: int | str) -> EvalBatch:  # fmt: skip
    """The batch lm-eval should run `tasks` at on `model`'s device, from a memory estimate.

    On a GPU: the largest batch <= `want` whose longest prompt fits the free memory (an int
    `want`), or lm-eval's own "auto" with max_length bounded to the longest prompt plus
    max_gen_toks (its probe otherwise runs at the model's max_length, 131,072 for Llama 3.1, and
    settles on 1). On a CPU: `want` as it is.

    Args:
        model: the in-memory model (on its device).
        tokenizer: its tokenizer.
        tasks, include_path, limit, num_fewshot, max_gen_toks: as the lm-eval run will get them
            (num_fewshot None: each task's own).
        want: the configured batch size, an int or "auto".
    """
    import torch

    # lazy: the evaluator imports lm-eval; the estimate above is plain arithmetic
    from layerswap.trainables.evaluate.proxy import ProxyEvaluator
    from layerswap.trainables.evaluate.proxy_lm import model_device

    device = model_device(model)
    if device.type != "cuda":
        return EvalBatch(want, None, f"{want} as configured (on {device.type})")
    ev = ProxyEvaluator(
        tasks, tokenizer, include_path=include_path, limit=limit, num_fewshot=num_fewshot,
        gen_kwargs={"max_gen_toks": max_gen_toks},
    )  # fmt: skip
    rows = task_rows(ev)
    bound = max((r.tokens + r.new_tokens for r in rows), default=0) or None
    if want == "auto":
        return EvalBatch("auto", bound, f"lm-eval's auto, max_length bounded to {bound}")
    free, _ = torch.cuda.mem_get_info(device)
    dtype_bytes = next(model.parameters()).element_size()
    batch = fitting_batch(rows, model.config, free, int(want), dtype_bytes)
    longest = max(rows, key=lambda r: row_bytes(r, model.config, dtype_bytes))
    why = (
        f"{batch} of {want}: the longest {longest.kind} row ({longest.tokens} tokens) takes "
        f"{row_bytes(longest, model.config, dtype_bytes) / 2**30:.2f} GiB, {free / 2**30:.1f} GiB free"
    )
    return EvalBatch(batch, bound, why)
