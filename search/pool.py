"""The experts a search draws from, their depth and ids, and the task YAMLs it evaluates with.

`resolve_pool(exp)` reads the expert registry's top-k (or the experiment's explicit lists);
promotion and the search driver share these so both see the same pool. `registry_problems` and
`registry_picks` are the same reading, problem by problem, for search/preflight.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path, PurePosixPath
from typing import Any

from layerswap.experts.registry import COLUMNS
from layerswap.spaces.base import same_model
from layerswap.spaces.languages import same_language
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool, ExpertRef
from layerswap.spaces.task_families import INDICATOR_PREFIX, family, held_out_reason
from layerswap.trainables.atomic import read_parquet
from layerswap.trainables.evaluate.tasks import write_world_tasks
from layerswap.trainables.merge.adapter_kind import expert_kind
from layerswap.trainables.storage import join, read_text

# The registry columns the pool reads (their types: experts/registry.py COLUMNS, which writes them).
POOL_COLUMNS = ("expert_id", "kind", "language", "mode", "path")
IND = INDICATOR_PREFIX
WRITTEN_BY = "expected an expert registry written by `layerswap train` sweeps or the demo"


def resolve_pool(exp: SearchExperiment) -> ExpertPool:
    """The experts: explicit paths, or the top_k of each kind from the expert registry.

    Raises:
        ValueError naming the registry file and every problem found in it.
    """
    if exp.experts is None:
        return explicit_pool(exp.task_experts, exp.language_experts, exp.base)
    rows, problems = registry_problems(exp.experts.registry)
    picks: dict[str, list[dict[str, Any]]] = {}
    if not problems:
        picks, problems = registry_picks(exp, rows)
    if problems:
        raise ValueError("; ".join(problems))

    def refs(side: str) -> list[ExpertRef]:
        return [
            ExpertRef(
                path=r["path"],
                expert_id=r["expert_id"],
                kind=expert_kind(r["path"], r["mode"]),
            )
            for r in picks[side]
        ]

    return ExpertPool(task=refs("task"), language=refs("language"), base=pool_base(exp, rows))


def explicit_pool(task: list[str], language: list[str], base: str | None = None) -> ExpertPool:
    """The pool of an experiment's explicit `task_experts` / `language_experts`.

    Each expert is typed by its folder (expert_kind: the registry route's rule) and given an id
    that is unique in the pool (explicit_ids), so trials.parquet tells its experts apart.
    """
    ids = explicit_ids([*task, *language])

    def refs(paths: list[str]) -> list[ExpertRef]:
        return [ExpertRef(path=p, expert_id=ids[p], kind=expert_kind(p)) for p in paths]

    return ExpertPool(task=refs(task), language=refs(language), base=base)


def explicit_ids(paths: list[str]) -> dict[str, str]:
    """path -> id: the folder's name, or, where two different paths share it (every layerswap
    checkpoint is checkpoints/samples_<n>), the shortest tail of folders that tells it apart
    (math_lora/checkpoints/samples_000000096). The id depends on the path and on which other
    paths share its name, nothing else; a path that is the tail of another is kept whole."""
    distinct = list(dict.fromkeys(paths))
    parts = {p: PurePosixPath(str(p).rstrip("/")).parts for p in distinct}
    out: dict[str, str] = {}
    for p in distinct:
        out[p] = str(p)  # the path itself when no shorter tail is unique
        for n in range(1, len(parts[p])):
            tail = parts[p][-n:]
            if all(q == p or parts[q][-n:] != tail for q in distinct):
                out[p] = "/".join(tail)
                break
    return out


def pool_base(exp: SearchExperiment, rows: list[dict[str, Any]]) -> str | None:
    """The pool's base: the experiment's, else the one the registry's first row was trained from."""
    return exp.base or (rows[0].get("base") if rows else None)


def registry_problems(path: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Read an expert registry and check what the pool reads from it (columns, types, nulls).

    Args:
        path: the registry.parquet file (`experts.registry`).
    Returns:
        (rows, problems): rows are [] unless problems is empty; every problem names the file.
    """
    import pyarrow as pa

    where = f"experts.registry {path}"
    p = Path(path)
    if not p.is_file():
        what = "a folder, not a file" if p.is_dir() else "no such file"
        return [], [f"{where}: {what} ({WRITTEN_BY})"]
    try:
        table = read_parquet(p)
    except (pa.ArrowInvalid, OSError) as e:
        return [], [f"{where}: not a readable Parquet file ({e}; {WRITTEN_BY})"]
    names = table.column_names
    problems = []
    missing = [c for c in POOL_COLUMNS if c not in names]
    if missing:
        problems.append(f"{where}: missing columns {missing} ({WRITTEN_BY})")
    for col in names:
        typ = table.schema.field(col).type
        if col in POOL_COLUMNS and not (typ.equals(COLUMNS[col]) or pa.types.is_null(typ)):
            problems.append(f"{where}: column {col!r} has type {typ}, expected {COLUMNS[col]}")
        elif col.startswith(IND) and not (
            pa.types.is_floating(typ) or pa.types.is_integer(typ) or pa.types.is_null(typ)
        ):
            problems.append(f"{where}: indicator column {col!r} has type {typ}, expected float64")
    for col in (c for c in POOL_COLUMNS if c in names):
        if table[col].null_count:
            problems.append(f"{where}: column {col!r} has {table[col].null_count} null value(s)")
    if not problems and table.num_rows == 0:
        problems.append(f"{where}: no experts")
    return ([] if problems else table.to_pylist()), problems


def registry_picks(
    exp: SearchExperiment, rows: list[dict[str, Any]]
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The registry rows the pool takes: the top_k of each side by its indicator, best first.

    Args:
        exp: the experiment (its `experts` block and target language).
        rows: the registry's rows, as `registry_problems` returns them.
    Returns:
        ({"task": rows, "language": rows}, problems); a side with a problem has no entry.
    """
    src = exp.experts
    if src is None:
        raise ValueError("registry_picks: the experiment has no experts.registry")
    where = f"experts.registry {src.registry}"
    target = exp.target_task
    inds = [k for k in (rows[0] if rows else {}) if k.startswith(IND)]
    # File order, as written: the fallback is the first column the dev-only rule allows
    # (spaces/task_families.py), never a world test split or the target.
    dev_inds = [k for k in inds if held_out_reason(k, target) is None]
    lang = src.language or exp.language
    sides = (
        ("task", "math", src.task_indicator, family("mgsm").world_task("en", "dev"), None),
        (
            "language",
            "language",
            src.language_indicator,
            family("belebele").world_task(lang, "dev"),
            lang,
        ),
    )
    picks, problems = {}, []
    if exp.base is None and len(bases := _bases(rows)) > 1:
        # Layer swapping recombines experts of one base: a registry shared by several models
        # (one run folder per study) must be narrowed, or the pool would mix them.
        problems.append(
            f"{where}: its experts come from {len(bases)} bases ({', '.join(bases)}); set `base` "
            "to the one whose experts this search merges"
        )
        return {}, problems
    for side, kind, given, default, language in sides:
        if given is not None:
            ind = given if given.startswith(IND) else IND + given
            if reason := held_out_reason(ind, target):
                # SearchExperiment refuses this already; an experiment changed since is not ranked.
                problems.append(f"{where}: experts.{side}_indicator {given!r} is {reason}")
                continue
            if ind not in inds:
                problems.append(
                    f"{where}: experts.{side}_indicator {given!r} is not a column "
                    f"(indicator columns: {inds or 'none'})"
                )
                continue
        elif inds and not dev_inds:
            problems.append(
                f"{where}: no indicator column may rank {kind} experts, each is a test split or "
                f"the target {target!r} (indicator columns: {inds}); score the experts on a dev "
                f"split and name it in experts.{side}_indicator"
            )
            continue
        else:
            ind = (
                IND + default if IND + default in dev_inds else (dev_inds[0] if dev_inds else None)
            )
        cand = [
            r
            for r in rows
            if r["kind"] == kind and (language is None or same_language(r["language"], language))
        ]
        others = _bases(cand)
        # A row without a base (a registry written by hand) is not known to differ: kept.
        cand = [r for r in cand if exp.base is None or not r.get("base") or same_model(r["base"], exp.base)]  # fmt: skip
        if not cand:
            of_base = f" of base {exp.base} (theirs: {', '.join(others)})" if others else ""
            problems.append(f"{where}: no {kind} experts ({language=}){of_base}")
            continue
        # Unscored rows go last: -inf, not None, keeps the sort total.
        cand.sort(key=lambda r: -(r.get(ind) if ind and r.get(ind) is not None else -math.inf))
        picks[side] = cand[: src.top_k]
    return picks, problems


def _bases(rows: list[dict[str, Any]]) -> list[str]:
    """The distinct bases the rows were trained from, in file order (one per model: two spellings
    of one folder count once); rows without one are not counted."""
    out: list[str] = []
    for b in (r.get("base") for r in rows):
        if b and not any(same_model(b, o) for o in out):
            out.append(b)
    return out


def model_depth(pool: ExpertPool) -> int:
    """num_hidden_layers of the first full task expert, else of the base (LoRA experts only)."""
    like = next((r.path for r in pool.task if r.kind == "full"), pool.base)
    if like is None:
        raise ValueError("cannot tell the depth: LoRA experts need `base`")

    cfg = json.loads(read_text(join(like, "config.json")))
    return int(cfg["num_hidden_layers"])


def model_ids_file(run_dir: Path) -> Path:
    """RUN/search/model_ids.json: the digests of the experts' files, which the search, its
    --resume and its promotion share (trainables.model_ids.saved_digests) so none hashes twice."""
    return Path(run_dir) / "search" / "model_ids.json"


def include_paths(exp: SearchExperiment, run_dir: Path) -> list[str]:
    paths = list(exp.include_path)
    if exp.world is not None:
        tasks = run_dir / "tasks"
        write_world_tasks(Path(exp.world), tasks)
        paths.insert(0, str(tasks))
    return paths  # empty: every task is one of lm-eval's built-ins
