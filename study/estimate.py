"""The cost model behind `layerswap plan`: FLOPs per token from a model's shape, evaluation
seconds from a task's shape, and device seconds from a profile (training runs: study/training.py).

Rules (each estimate prints the profile figures it rests on, spaces/throughput.yaml):

- Forward FLOPs per token (Kaplan et al. 2020, "Scaling laws", Table 1):
  `2·N_mm + 2·L·ctx·d_attn`, where N_mm counts the weights of every Linear module (lm_head
  included, LoRA adapters included, the embedding lookup and norms not), L the layers, d_attn
  heads × head_dim, and ctx the tokens of a row.
- Training FLOPs per token: the forward, the decoder layers' forward once more with gradient
  checkpointing (Hugging Face recomputes the layers, not the lm_head), the backward to the
  activations (as much as a forward, attention's twice), and the weight gradients of the
  trained matrices only: `2·fwd + ckpt·(fwd − 2·N_head_mm) + 2·L·ctx·d_attn + 2·N_trained_mm`,
  N_head_mm the Linear weights outside the layers (the lm_head).
  Full training: 6·N_mm (+ attention), as usual; LoRA and partial training still run the whole
  forward and the whole backward to the activations (the gradient must reach the lowest
  trained parameter), so they save only the frozen weights' gradients: ≈ 4·N_mm.
- Evaluation seconds of one task: prefill (every prompt with its few-shot examples, at
  prefill_flops_per_s; a multiple-choice item is one row in the cached evaluator, one row per
  option in lm-eval) plus, for generation tasks, ceil(items / batch) × decoding steps of
  (weight bytes / decode_bytes_per_s + decode_step_overhead_s). A batch decodes until every
  row has reached a stop string (lm-eval's `until`, and the cached evaluator's), or to
  max_gen_toks: the plan counts the task shape's `answer_tokens` a batch when the prompt has
  few-shot examples that show the answer's form, max_gen_toks otherwise, and max_gen_toks
  for every batch as the upper bound (`evals_cost(..., to_stop=False)`).
Tests: .venv/bin/pytest -q tests/study/
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from layerswap.spaces.study import Profile
from layerswap.spaces.task_families import (
    TaskShape,
    family_of,
    find_family,
    task_language,
    task_split,
)
from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.spaces.world import world_config


def task_shape(name: str, given: dict[str, TaskShape]) -> TaskShape | None:
    """The shape of task `name`: the study's own entry, else its task family's
    (spaces.task_families: world tasks take their item counts from the world, `world_items`),
    else None (a task of no family: the plan lists it as unknown)."""
    if name in given:
        return given[name]
    fam = find_family(name)
    return None if fam is None else fam.shape_of(name)


@dataclass(frozen=True)
class ModelCost:
    """The sizes an estimate needs, read off a model's config (and an experiment's mode)."""

    params: int  # every parameter (LoRA adapters included)
    n_mm: int  # weights of Linear modules (adapters included)
    n_trained_mm: int  # of those, the ones that train
    layers: int
    d_attn: int
    weight_bytes: int  # what one copy of the weights takes in the config's dtype
    trained: int  # trainable parameters
    n_head_mm: int = 0  # weights of Linear modules outside the decoder layers (the lm_head)


def model_cost(shape, exp: TrainExperiment | None = None) -> ModelCost:
    """ModelCost of a model, trained as `exp` says (None: inference).

    Args:
        shape: its trainables.train.model_shape.ModelShape (model_shape(config)).
        exp: the experiment whose mode decides what trains (LoRA adds its adapters).
    """
    # lazy: torch (~3 s); `layerswap plan` loads it only for a question only the trainer answers
    from layerswap.trainables.train.modes import trainable_split

    n_mm = sum(i * o for i, o in shape.linears.values())
    head = sum(i * o for n, (i, o) in shape.linears.items() if ".layers." not in f".{n}")
    elt = shape.dtype.itemsize
    if exp is None:
        params = sum(shape.params.values())
        return ModelCost(params, n_mm, 0, shape.layers, shape.heads * shape.head_dim, params * elt, 0, head)  # fmt: skip
    split = trainable_split(exp, shape)
    adapters = sum(n for k, n in split.params.items() if ".lora_" in k)
    trained_mm = sum(split.params[k] for k in split.trainable if k in split.linear)
    trained = sum(split.params[k] for k in split.trainable)
    params = sum(split.params.values())
    return ModelCost(params, n_mm + adapters, trained_mm, shape.layers, shape.heads * shape.head_dim, params * elt, trained, head)  # fmt: skip


def forward_flops(c: ModelCost, ctx: float) -> float:
    """Forward FLOPs of one token in a sequence of `ctx` tokens."""
    return 2 * c.n_mm + 2 * c.layers * ctx * c.d_attn


def train_flops(c: ModelCost, ctx: float, checkpointing: bool) -> float:
    """Training FLOPs of one token (forward, recompute, backward; see the module docstring)."""
    fwd = forward_flops(c, ctx)
    recompute = fwd - 2 * c.n_head_mm if checkpointing else 0.0  # the layers only, no lm_head
    return 2 * fwd + recompute + 2 * c.layers * ctx * c.d_attn + 2 * c.n_trained_mm


# ---------------------------------------------------------------------------- evaluation


def eval_cost(
    c: ModelCost,
    shape: TaskShape,
    items: int,
    shots: int,
    gen_toks: float,
    batch: int,
    prof: Profile,
    *,
    row_per_option: bool,
) -> tuple[float, tuple[str, ...]]:
    """Seconds of one model on one task, and the profile figures they rest on.

    Args:
        c: the evaluated model's cost (model_cost(config)).
        shape: the task's shape; items: items scored; shots: few-shot examples per prompt.
        gen_toks: decoding steps a batch of a generation task takes; batch: rows per pass.
        prof: the device profile.
        row_per_option: lm-eval's one request per answer option (True), or the cached
            evaluator's one row per multiple-choice item (False).
    """
    ctx = shape.prompt_tokens + shots * shape.shot_tokens
    if shape.choices:
        rows = shape.choices if row_per_option else 1
        per_row = ctx + shape.continuation_tokens * (1 if row_per_option else shape.choices)
        tokens = items * rows * per_row
        s = tokens * forward_flops(c, per_row) / prof.prefill_flops_per_s.value
        return s, ("prefill_flops_per_s",)
    tokens = items * ctx
    steps = math.ceil(items / batch) * gen_toks
    step_s = c.weight_bytes / prof.decode_bytes_per_s.value + prof.decode_step_overhead_s.value
    s = tokens * forward_flops(c, ctx) / prof.prefill_flops_per_s.value + steps * step_s
    return s, ("prefill_flops_per_s", "decode_bytes_per_s", "decode_step_overhead_s")


def auto_batch(device: str) -> int:
    """Rows per pass that `batch_size: auto` starts at on `device` (the proxy evaluator's rule)."""
    # lazy: torch + lm-eval, as above
    from layerswap.trainables.evaluate.proxy_lm import AUTO_START

    return AUTO_START["cpu" if device == "cpu" else "cuda"]


def world_items(task: str, world: str | None) -> int | None:
    """Items of a world task: the lines of its split in the world folder, or, before the world
    is built, the full preset's count (spaces.world.world_config).

    Raises:
        ValueError for a task of no task family (spaces.task_families).
    """
    fam, split = family_of(task), task_split(task)  # a task of no family raises, naming it
    if world is not None:
        f = Path(world) / fam.data_file(task_language(task), split)
        if f.is_file():
            with open(f, "rb") as fh:
                return sum(1 for line in fh if line.strip())
    return getattr(world_config("full"), fam.count_field(split))


# ---------------------------------------------------------------------------- per-stage sums


def decode_steps(shape: TaskShape, shots: int, gen_toks: int) -> float:
    """Decoding steps of one batch of a generation task: the shape's answer_tokens (to the
    stop strings) when few-shot examples show the answer's form, else max_gen_toks; never
    more than max_gen_toks."""
    if shape.answer_tokens is None or shots == 0:
        return gen_toks
    return min(shape.answer_tokens, gen_toks)


def evals_cost(
    c: ModelCost,
    tasks: list[tuple[TaskShape, int]],
    limit: int | None,
    gen_toks: int,
    batch: int,
    prof: Profile,
    *,
    row_per_option: bool,
    to_stop: bool = True,
) -> tuple[float, int, set[str]]:
    """(seconds, items, figures used) of one model on several tasks.

    Args:
        tasks: (shape with items, few-shot examples) per task.
        limit: first N items per task (None: all).
        gen_toks: max_gen_toks; batch, prof, row_per_option: as for `eval_cost`.
        to_stop: decode a batch to its stop strings (`decode_steps`), else to gen_toks.
    """
    secs, items, figs = 0.0, 0, set()
    for shape, shots in tasks:
        n = min(limit or shape.items, shape.items)
        steps = decode_steps(shape, shots, gen_toks) if to_stop else gen_toks
        t, used = eval_cost(c, shape, n, shots, steps, batch, prof, row_per_option=row_per_option)
        secs, items, figs = secs + t, items + n, figs | set(used)
    return secs, items, figs


def trial_device_hours(seconds: float, gpus: float, threads: int, prof: Profile) -> float:
    """Device-hours of one search trial worth `seconds` on one device.

    A trial holding g >= 1 GPUs computes on one and holds g; g < 1 shares a GPU (1/g times as
    long, g of it). A CPU trial (g = 0) on the cpu profile uses `threads` devices (threads).
    """
    if gpus > 0:
        return seconds * max(gpus, 1) / 3600
    n = threads if prof.kind == "cpu" else 1
    eff = prof.parallel_efficiency.value if n > 1 else 1.0
    return seconds / (n * eff) * n / 3600
