"""Evaluation batches that fit: a memory estimate per lm-eval request kind, and a back-off that
halves the batch on out-of-memory instead of losing the model's evaluation.

Why: lm-eval's HFLM takes log-softmax over every position x the whole vocabulary. Belebele
5-shot (~2,100 tokens) at batch 32 on a 128,256-token vocabulary is 32 x 2,100 x 128,256 bf16
logits plus as many log-probabilities, ~47 GiB with the model's 16 GB, ~63 GiB from the second
batch on (the previous batch's log-softmax is still held): over an L40S and most of an H100,
and Telugu prompts are 2-3x longer. A fixed `promote.batch_size` therefore failed
every model; this module picks the largest batch the device holds, and backs off if it was wrong.
Tests: tests/trainables/evaluate/test_fit.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from layerswap.trainables.devices import free_cuda_bytes, is_out_of_memory

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


def kv_bytes_per_token(shape, b: int) -> int:
    """One token's keys and values over every layer (b: the cache dtype's bytes)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * b


def loglikelihood_memory(shape, rows: int, tokens: int, *, batches: int = 1, b: int = 2, softmax_b: int | None = None) -> dict[str, int]:  # fmt: skip
    """Peak device bytes of lm-eval HFLM's loglikelihood over batches of `rows` x `tokens`.

    HFLM._loglikelihood_tokens calls the model on the right-padded batch (HF builds the KV cache
    of every layer, use_cache being on, the last layer's MLP holds 3 x intermediate a token, and
    the lm_head returns [rows, tokens, vocab] logits in the model's dtype), drops the cache with
    the output, then takes log_softmax in `softmax_dtype` (None:
    the logits' dtype) beside the logits. Its loop variable keeps the previous batch's
    log-softmax alive while the next batch runs, so from the second batch on (equal lengths)
    one more [rows, tokens, vocab] tensor is held.

    Args:
        shape: a ModelShape (params, layers, kv_heads, head_dim, hidden, vocab).
        rows: rows a batch (promote.batch_size); tokens: the batch's padded input length.
        batches: how many such batches run in a row (1 or more).
        b: the weights' and logits' dtype bytes; softmax_b: log_softmax's (None: b).
    Returns:
        {"weights", "logits", "log_softmax", "previous_batch", "kv_cache", "hidden", "peak"}.
    """
    n = rows * tokens
    parts = {
        "weights": sum(shape.params.values()) * b,
        "logits": n * shape.vocab * b,
        "log_softmax": n * shape.vocab * (softmax_b or b),
        "kv_cache": n * kv_bytes_per_token(shape, b),
        "hidden": 2 * n * shape.hidden * b,  # the last layer's residual and the final norm's output
    }
    parts["previous_batch"] = parts["log_softmax"] if batches > 1 else 0
    mlp = 3 * n * shape.intermediate * b  # the last layer's act(gate), up and their product
    forward = parts["kv_cache"] + parts["hidden"] + max(parts["logits"], mlp)
    softmax = parts["logits"] + parts["log_softmax"]  # after the cache is dropped
    parts["peak"] = parts["weights"] + parts["previous_batch"] + max(forward, softmax)
    return parts


def generate_memory(shape, rows: int, context: int, new_tokens: int, *, b: int = 2) -> dict[str, int]:  # fmt: skip
    """Peak device bytes of lm-eval HFLM's generate_until on a batch of `rows` left-padded
    `context`-token prompts generating `new_tokens` (HF generate, KV cache in the model dtype).

    Prefill: the cache of the whole context, plus the last layer's transient MLP tensors
    (act(gate), up and their product: 3 x intermediate) and two hidden-state copies per token;
    generate keeps only the last position's logits. Decoding: the cache grows to
    context + new_tokens, and each layer's update copies that layer's cache once (torch.cat).

    Returns:
        {"weights", "kv_cache" (at the end), "prefill_transient", "peak"}.
    """
    kvt = kv_bytes_per_token(shape, b)
    weights = sum(shape.params.values()) * b
    transient = rows * context * (3 * shape.intermediate + 2 * shape.hidden) * b
    prefill = rows * context * kvt + transient
    kv_end = rows * (context + new_tokens) * kvt
    decode = kv_end + kv_end // shape.layers
    return {
        "weights": weights,
        "kv_cache": kv_end,
        "prefill_transient": transient,
        "peak": weights + max(prefill, decode),
    }


def row_bytes(row: RowShape, shape, dtype_bytes: int = 2) -> int:
    """Device bytes one batch row of `row` adds beyond the weights, in lm-eval's steady state
    (loglikelihood: the previous batch's log-softmax still held; see loglikelihood_memory).

    Args:
        row: the longest request.
        shape: the model's trainables.train.model_shape.ModelShape.
        dtype_bytes: bytes per element of the model's dtype (2 for bf16).
    """
    if row.kind == "loglikelihood":
        m = loglikelihood_memory(shape, 1, row.tokens, batches=2, b=dtype_bytes)
    elif row.kind == "generate":
        m = generate_memory(shape, 1, row.tokens, row.new_tokens, b=dtype_bytes)
    else:
        raise ValueError(f"request kind {row.kind!r}: expected loglikelihood or generate")
    return m["peak"] - m["weights"]


def fitting_batch(rows: list[RowShape], shape, free_bytes: int, want: int, dtype_bytes: int = 2) -> int:  # fmt: skip
    """The largest batch <= `want` whose costliest row times the batch fits USABLE x free_bytes.

    Args:
        rows: the longest request of each task one lm-eval run evaluates.
        shape: the model's ModelShape.
        free_bytes: device memory free with the model loaded.
        want: the configured batch size (the most it may be).
    Returns:
        at least 1 (a batch of one that does not fit is left to the back-off to report).
    """
    if not rows:
        return want
    per_row = max(row_bytes(r, shape, dtype_bytes) for r in rows)
    return max(1, min(want, int(USABLE * free_bytes // per_row)))


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


def task_rows(evaluator, model=None) -> list[RowShape]:
    """The longest request of each task a ProxyEvaluator prompted and tokenized.

    Args:
        evaluator: a trainables.evaluate.proxy.ProxyEvaluator (its prompts, as HFLM builds them).
        model: the model that will generate, whose generation_config may set a larger budget
            than the task's max_gen_toks (`max_new_tokens`, which generate() obeys over the
            max_length lm-eval passes: 2048 for some bases); None: max_gen_toks.
    """
    # lazy: decoding imports transformers' generation processors, needed only with a model
    from layerswap.trainables.evaluate.decoding import decoding_rules

    rows = []
    for c in evaluator.tasks.values():
        if not c.items:
            continue
        if c.kind == "multiple_choice":
            longest = max(len(it.ctx_ids) + max(map(len, it.cont_ids)) for it in c.items)
            rows.append(RowShape("loglikelihood", longest))
        else:
            longest = max(len(it.ctx_ids) for it in c.items)
            new = c.max_gen_toks
            if model is not None:
                new = decoding_rules(model, c.gen_kwargs, new, f"task {c.name}").max_new_tokens
            rows.append(RowShape("generate", longest, new))
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
    `want`). On any device, "auto" is lm-eval's own search with max_length bounded to the
    longest prompt plus max_gen_toks, capped at the window HFLM resolves for the model (so
    prompts are truncated as in a run without the bound): its probe otherwise runs at that
    (131,072 for Llama 3.1; on a GPU it settles on 1, on a CPU it never runs out of memory and
    spends most of a small evaluation on 64 rows of that length). On a CPU, an int as it is.

    Args:
        model: the in-memory model (on its device).
        tokenizer: its tokenizer.
        tasks, include_path, limit, num_fewshot, max_gen_toks: as the lm-eval run will get them
            (num_fewshot None: each task's own).
        want: the configured batch size, an int or "auto".
    """
    # lazy: the evaluator imports lm-eval; the estimate above is plain arithmetic
    from layerswap.trainables.evaluate.proxy import ProxyEvaluator
    from layerswap.trainables.evaluate.proxy_lm import hflm_max_length, model_device
    from layerswap.trainables.train.model_shape import model_shape

    device = model_device(model)
    if device.type != "cuda" and want != "auto":
        return EvalBatch(want, None, f"{want} as configured (on {device.type})")
    ev = ProxyEvaluator(
        tasks, tokenizer, include_path=include_path, limit=limit, num_fewshot=num_fewshot,
        gen_kwargs={"max_gen_toks": max_gen_toks},
    )  # fmt: skip
    rows = task_rows(ev, model)
    # Never past lm-eval's own window: a longer bound reads past the model's positions where
    # lm-eval's default left-truncates, so scores would depend on the batch setting.
    longest = max((r.tokens + r.new_tokens for r in rows), default=0)
    bound = min(longest, hflm_max_length(model, tokenizer)) or None
    if want == "auto":
        return EvalBatch("auto", bound, f"lm-eval's auto, max_length bounded to {bound}")
    free = free_cuda_bytes(device)  # cached-but-unused bytes count: the model was rebuilt
    dtype_bytes = next(model.parameters()).element_size()
    shape = model_shape(model.config)
    batch = fitting_batch(rows, shape, free, int(want), dtype_bytes)
    longest = max(rows, key=lambda r: row_bytes(r, shape, dtype_bytes))
    why = (
        f"{batch} of {want}: the longest {longest.kind} row ({longest.tokens} tokens) takes "
        f"{row_bytes(longest, shape, dtype_bytes) / 2**30:.2f} GiB, {free / 2**30:.1f} GiB free"
    )
    return EvalBatch(batch, bound, why)
