"""The evaluation task families as one table: how a task name is recognised, how it is answered,
its dev/test split naming, and what one item costs.

A family is MGSM-like generation (`mgsm`: the task skill, math) or Belebele-like multiple choice
(`belebele`, `global_mmlu`: the language). Every reader asks here instead of matching names
itself: the world (its data files), the evaluator (the world's lm-eval task YAMLs), the search
preflight and config (dev/test twins), the study planner (task shapes, world item counts) and
the analysis (the target tasks). `family_of(task)` raises for a task of no family; a task the
table does not know is never counted as another family. Pure data: importable by every room.

Run: .venv/bin/python -c "from layerswap.spaces.task_families import family_of as f; print(f('world_mgsm_direct_xa_dev'))"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from layerswap.spaces.base import StrictModel

Split = Literal["dev", "test"]
# A world task is `{stem}_{language code}` for its test split and that + DEV_SUFFIX for dev.
DEV_SUFFIX = "_dev"
WORLD_PREFIX = "world_"
# The expert registry's indicator columns are `ind__<task>` (experts/registry.py writes them).
INDICATOR_PREFIX = "ind__"
# ...and each has an item-count column `n_items__<task>` beside it.
N_ITEMS_PREFIX = "n_items__"


def task_split(task: str) -> Split:
    """The split a task name evaluates: "dev" for a name ending in `_dev`, else "test"."""
    return "dev" if task.endswith(DEV_SUFFIX) else "test"


def heldout_task(task: str) -> str:
    """The test-split twin of a task name (`..._dev` -> `...`); a test name is unchanged."""
    return task.removesuffix(DEV_SUFFIX)


def dev_task(task: str) -> str:
    """The dev-split twin of a task name (`...` -> `..._dev`); a dev name is unchanged."""
    return task if task.endswith(DEV_SUFFIX) else task + DEV_SUFFIX


def split_task(task: str, split: Split) -> str:
    """The twin of `task` that evaluates `split`."""
    return dev_task(task) if split == "dev" else heldout_task(task)


def task_language(task: str) -> str:
    """The language code a task name ends with (`world_mgsm_direct_xa_dev` -> `xa`)."""
    return heldout_task(task).rsplit("_", 1)[-1]


def is_world_task(task: str) -> bool:
    """Whether a name is an embedded-world task (written by the evaluator over a world folder)."""
    return task.startswith(WORLD_PREFIX)


def indicator_task(name: str) -> str:
    """The task an expert-registry indicator names: a column `ind__<task>` or the task itself."""
    return name.removeprefix(INDICATOR_PREFIX)


def held_out_reason(task: str, target: str | None = None) -> str | None:
    """Why `task` may not guide a search or an expert sweep, or None when it may.

    The one dev-only rule (DESIGN.md §1: the target test set never guides the search): a world
    test split (a `world_` name without `_dev`) and the search's own target task are held out.
    A real lm-eval task has no split in its name (`mgsm_direct_en`, `belebele_swh_Latn`), so
    only the target itself is refused among those by name; a search also refuses a proxy that
    reads the target's test data under another name (trainables/evaluate/task_data.py, from the
    resolved lm-eval configs, which this pure-data module cannot read).

    Args:
        task: a task name, or an indicator column (`ind__<task>`).
        target: the search's target task (None: no search, e.g. an expert sweep).
    Returns:
        a short reason ("the search's target task", "a world test split"), or None.
    """
    task = indicator_task(task)
    if target is not None and task == indicator_task(target):
        return "the search's target task (held out for promotion's final evaluation)"
    if is_world_task(task) and task_split(task) == "test":
        return "a world test split (held out for the final evaluation)"
    return None


def require_dev_task(task: str, where: str, target: str | None = None) -> None:
    """Refuse a task that may not guide a search (`held_out_reason`).

    Args:
        task: the value given (a task name or an `ind__<task>` column).
        where: the field it was given in, e.g. "sweep.metric" or "proxies[0].task".
        target: the search's target task, when there is one.
    Raises:
        ValueError naming the field and the value and what to use instead.
    """
    reason = held_out_reason(task, target)
    if reason is None:
        return
    name = indicator_task(task)
    instead = (
        f"use its validation split {dev_task(name)!r}"
        if is_world_task(name)
        else "use a validation (dev) split of another task"
    )
    raise ValueError(
        f"{where} {task!r}: {reason}; searches and expert sweeps are guided by validation (dev) "
        f"splits only, {instead}"
    )


class TaskShape(StrictModel):
    """What one evaluation task costs per item, for tasks the plan has no built-in shape for
    (spaces/task_families.py FAMILIES) or to replace one."""

    items: int | None = Field(None, ge=1)
    """Items in the split evaluated (None: from the built-in table or the world)."""
    prompt_tokens: float = Field(gt=0)
    """Mean tokens of one item's own prompt (no few-shot examples)."""
    shot_tokens: float = Field(0.0, ge=0)
    """Mean tokens of one few-shot example."""
    choices: int = Field(0, ge=0)
    """Answer options of a multiple-choice task; 0 for a generation task."""
    continuation_tokens: float = Field(0.0, ge=0)
    """Mean tokens of one answer option (multiple choice)."""
    answer_tokens: float | None = Field(None, gt=0)
    """Generation with few-shot examples: decoding steps until every row of a batch has
    reached the task's stop strings (the batch's longest answer, stop string included); the
    plan decodes max_gen_toks when None or without few-shot examples (an upper bound)."""
    note: str = "given in the study"
    """Where the numbers come from (printed with the plan)."""


# lm-eval metric list of a Brier-scored twin: reported by brier_score (the first metric) over
# the options' renormalised probabilities (lower is better), accuracy beside it.
BRIER_METRICS = [
    {"metric": "brier_score", "aggregation": "brier_score", "higher_is_better": False},
    {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
]


@dataclass(frozen=True)
class TaskFamily:
    """One family of evaluation tasks.

    name: the family's key; also its world data folder (W/data/{name}/{code}/{split}.jsonl) and
        the prefix of the world config's item counts ({name}_dev, {name}_test).
    answer: "generate" (generate_until, exact match) or "choice" (multiple choice).
    skill: what it measures: "task" (the target task, math: the analysis's target family) or
        "language".
    shape: an item's cost in lm-eval's built-in tasks; lm_eval_prefixes: their names' starts.
    world_stems: world task stem -> lm-eval metric list (None: the built-in config's metrics);
        a world task is `{stem}_{code}` (test) or `{stem}_{code}_dev` (dev).
    world_shape: an item's cost in the world's tasks (their items come from the world).
    lm_eval_base: the built-in config (under lm_eval/tasks) the world's tasks `include:`.
    fewshot: where a world task's few-shot examples come from: "train" (the family's train file,
        as the real MGSM's 8 problems) or "split" (the split evaluated: a dev score never sees
        the test set).
    """

    name: str
    answer: Literal["generate", "choice"]
    skill: Literal["task", "language"]
    shape: TaskShape
    lm_eval_prefixes: tuple[str, ...]
    world_stems: dict[str, list[dict] | None] = field(default_factory=dict)
    world_shape: TaskShape | None = None
    lm_eval_base: str | None = None
    fewshot: Literal["train", "split"] = "split"

    def world_task(self, code: str, split: Split = "test", stem: str | None = None) -> str:
        """The world task of this family for language `code` and `split` (stem: the first)."""
        stem = stem if stem is not None else next(iter(self.world_stems), None)
        if stem not in self.world_stems:
            raise ValueError(f"task family {self.name}: no world task stem {stem!r} (stems: {list(self.world_stems)})")  # fmt: skip
        return split_task(f"{stem}_{code}", split)

    @property
    def data_folder(self) -> str:
        """The world folder's folder of this family's data, one folder per language, relative."""
        return f"data/{self.name}"

    def data_file(self, code: str, split: str) -> str:
        """The world folder's file of language `code`'s `split` (train, dev, test), relative."""
        return f"{self.data_folder}/{code}/{split}.jsonl"

    def count_field(self, split: Split) -> str:
        """The world config field (spaces.world.WorldConfig) that counts `split`'s items."""
        return f"{self.name}_{split}"

    def shape_of(self, task: str) -> TaskShape:
        """The built-in shape of one of this family's tasks (world or lm-eval)."""
        if is_world_task(task):
            if self.world_shape is None:
                raise ValueError(f"task {task}: task family {self.name} has no world tasks")
            return self.world_shape
        return self.shape


_MGSM = "assumed: a GSM8K question is ~60 Llama-3 tokens in English, 2-5x that in Bengali, Telugu or Swahili; 150 as a middle; MGSM has 250 problems per language (Shi et al. 2023); answers: lm-eval's mgsm_direct_* stop at the next item's 'Question:' in the task's language ('Swali:', 'প্রশ্ন:', 'ప్రశ్న:'), so a few-shot answer is the number, a blank line and that word, ~5-12 tokens; 24 decoding steps a batch, for the batch's longest row"  # fmt: skip
_BELE = "assumed: a FLORES passage (~90 English words) + question ≈ 150 tokens in English, 2-3x in the target scripts; 350 as a middle; 900 questions per language (Bandarkar et al. 2024)"  # fmt: skip
_GMMLU = "assumed: MMLU question + 4 options ≈ 100 English tokens, 150 for other languages; 14,042 test items per language (MMLU's test set)"  # fmt: skip
_WORLD = "assumed: the world's prompts are short (its SFT samples average 38-43 tokens in the v4 world); items from the world"  # fmt: skip

# Items are the splits' published sizes; tokens are assumptions (Llama-3 tokenizer), printed
# with a study plan; a study's `tasks:` replaces them.
FAMILIES: dict[str, TaskFamily] = {
    "mgsm": TaskFamily(
        name="mgsm",
        answer="generate",
        skill="task",
        shape=TaskShape(
            items=250, prompt_tokens=150, shot_tokens=150, answer_tokens=24, note=_MGSM
        ),
        lm_eval_prefixes=("mgsm_",),
        world_stems={"world_mgsm_direct": None},
        world_shape=TaskShape(prompt_tokens=40, shot_tokens=40, note=_WORLD),
        lm_eval_base="mgsm/direct/mgsm_direct_en.yaml",
        fewshot="train",
    ),
    "belebele": TaskFamily(
        name="belebele",
        answer="choice",
        skill="language",
        shape=TaskShape(
            items=900,
            prompt_tokens=350,
            shot_tokens=350,
            choices=4,
            continuation_tokens=15,
            note=_BELE,
        ),
        lm_eval_prefixes=("belebele_",),
        # The same items twice: accuracy, and lm-eval's Brier score, a continuous reading that
        # still ranks models where accuracy saturates.
        world_stems={"world_belebele": None, "world_belebele_brier": BRIER_METRICS},
        world_shape=TaskShape(
            prompt_tokens=80, shot_tokens=80, choices=4, continuation_tokens=4, note=_WORLD
        ),
        lm_eval_base="belebele/belebele_eng_Latn.yaml",
        fewshot="split",
    ),
    "global_mmlu": TaskFamily(
        name="global_mmlu",
        answer="choice",
        skill="language",
        shape=TaskShape(
            items=14042,
            prompt_tokens=150,
            shot_tokens=150,
            choices=4,
            continuation_tokens=1,
            note=_GMMLU,
        ),
        lm_eval_prefixes=("global_mmlu_full_",),
    ),
}


def world_families() -> list[TaskFamily]:
    """The families the embedded world writes data and tasks for, in table order."""
    return [f for f in FAMILIES.values() if f.world_stems]


def _match(task: str) -> tuple[TaskFamily, str] | None:
    """(family, the world stem or lm-eval prefix it matched), the longest match first."""
    keys = []
    for fam in FAMILIES.values():
        keys += [(f"{stem}_", fam) for stem in fam.world_stems]
        keys += [(prefix, fam) for prefix in fam.lm_eval_prefixes]
    for key, fam in sorted(keys, key=lambda k: len(k[0]), reverse=True):
        if task.startswith(key):
            return fam, key
    return None


def find_family(task: str) -> TaskFamily | None:
    """The family a task name belongs to, or None for a task of no family (any lm-eval task).

    A world task matches `{stem}_...`, an lm-eval one its family's prefix, the longest first.
    """
    hit = _match(task)
    return hit[0] if hit else None


def family_of(task: str) -> TaskFamily:
    """The family of a task name.

    Raises:
        ValueError naming the task and the known families with their name patterns.
    """
    fam = find_family(task)
    if fam is None:
        raise ValueError(_unknown(task))
    return fam


def family(name: str) -> TaskFamily:
    """The family named `name` (a key of FAMILIES).

    Raises:
        ValueError naming it and the known families.
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown task family {name!r}; known task families: {', '.join(FAMILIES)}")  # fmt: skip
    return FAMILIES[name]


def _unknown(task: str) -> str:
    patterns = "; ".join(
        f"{f.name}: "
        + ", ".join(
            [f"{s}_CODE[{DEV_SUFFIX}]" for s in f.world_stems]
            + [f"{p}*" for p in f.lm_eval_prefixes]
        )
        for f in FAMILIES.values()
    )
    return f"task {task!r} belongs to no known task family ({patterns})"
