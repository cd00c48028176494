"""The search preflight's task discovery: each proxy, its held-out variant and the target must
resolve from the world's task YAMLs, an include_path folder or lm-eval's built-in configs.

`find_tasks(...)` is the same check for `layerswap plan`; `check_tasks(exp, out)` appends to a
Preflight (search/preflight_report.py) for search/preflight.py. Imports no torch, ray or lm-eval.
Tests: .venv/bin/python -m pytest -q tests/search/test_preflight.py
"""

from __future__ import annotations

import difflib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from layerswap.search.preflight_report import Preflight
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.task_families import heldout_task
from layerswap.trainables.evaluate.tasks import lm_eval_tasks_dir, write_world_tasks
from layerswap.world.build import verify_world

# Task configs are small YAMLs or suffix-less templates (lm-eval's `direct_yaml`); bigger files
# under an include path are data, not configs.
CONFIG_MAX_BYTES = 1 << 20
LIST_AT_MOST = 16  # known task names shown in one message


@dataclass
class _Tasks:
    """Where task names can come from: the world's task YAMLs, include_path folders, lm-eval."""

    world: list[str] | None = None  # the world's task names (None: no readable world)
    # A named world or include_path folder is unreadable, or none is named: a name not found may
    # be there, and the missing source is a problem of its own already.
    incomplete: bool = False
    include: list[Path] = field(default_factory=list)
    texts: dict[Path, str] = field(default_factory=dict)  # config text per root, read once


def _task_sources(exp: SearchExperiment, out: Preflight) -> _Tasks:
    """The world's task names (as pool.include_paths would write them) and include_path folders."""
    src = _Tasks()
    if exp.world is not None:
        w = Path(exp.world)
        if not w.is_dir():
            out.problems.append(
                f"world {exp.world}: {'a file' if w.exists() else 'no such folder'}"
            )
            src.incomplete = True
        else:
            # sha256 of everything but the test splits, which the search must never open
            damage = verify_world(w, only=lambda rel: not rel.endswith("/test.jsonl"), hand_made_ok=True)  # fmt: skip
            out.problems += [f"world {exp.world}: {p}" for p in damage]
            src.incomplete = src.incomplete or bool(damage)
            try:  # the YAMLs are a few small files: writing them to a scratch folder is exact
                with tempfile.TemporaryDirectory(prefix="preflight-tasks-") as tmp:
                    src.world = write_world_tasks(w, Path(tmp))
            except (ValueError, OSError) as e:
                out.problems.append(f"world {exp.world}: {e}")
                src.incomplete = True
    for i, p in enumerate(exp.include_path):
        if Path(p).is_dir():
            src.include.append(Path(p))
        else:
            out.problems.append(f"include_path[{i}] {p}: no such folder")
            src.incomplete = True
    return src


def _config_text(root: Path, src: _Tasks) -> str:
    if root not in src.texts:
        files = sorted(
            p
            for p in root.rglob("*")
            if p.is_file()
            and (p.suffix in ("", ".yml") or "yaml" in p.name)
            and p.stat().st_size <= CONFIG_MAX_BYTES
        )
        src.texts[root] = "\n".join(p.read_text(errors="replace") for p in files)
    return src.texts[root]


def _mentioned(name: str, root: Path, src: _Tasks) -> bool:
    # lm-eval registers task, group and tag names only from values spelled out in its configs, so
    # a name that appears nowhere as a whole token is unknown (checked on lm-eval 0.4.13: all
    # 14,683 indexed names appear). Appearing is not proof: lm-eval parses the config at run time.
    pattern = r"(?<![\w+-])" + re.escape(name) + r"(?![\w+-])"
    return re.search(pattern, _config_text(root, src)) is not None


def _builtin_root() -> Path | None:

    try:
        return lm_eval_tasks_dir()
    except ValueError:
        return None


def _in_builtin(name: str, src: _Tasks) -> bool | None:
    """Whether lm-eval's built-in configs name `name` (None: lm-eval is not installed)."""
    root = _builtin_root()
    return None if root is None else _mentioned(name, root, src)


def _find(name: str, src: _Tasks, builtin: bool, out: Preflight) -> str | None:
    """Where `name` resolves: "world", an include_path folder, "lm-eval", or None (unknown)."""
    if src.world is not None and name in src.world:
        return "world"
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return name  # lm-eval takes a YAML file's path as a task spec too
    for root in src.include:
        if _mentioned(name, root, src):
            out.unchecked.append(f"task {name}: found in include_path {root} by a text search only")
            return str(root)
    if builtin:
        found = _in_builtin(name, src)
        if found is None:
            out.unchecked.append(f"task {name}: lm-eval is not installed, built-ins not checked")
            return "lm-eval"
        if found:
            out.unchecked.append(f"task {name}: found in lm-eval's built-in configs by a text search only")  # fmt: skip
            return "lm-eval"
    return None


def _known(name: str, src: _Tasks) -> str:
    """The hint after 'unknown task': the world's task names and a close match."""
    parts = []
    if src.world is not None:
        shown = ", ".join(src.world[:LIST_AT_MOST])
        more = f", ... ({len(src.world)} in all)" if len(src.world) > LIST_AT_MOST else ""
        parts.append(f"known world tasks: {shown}{more}")
    if src.include:
        parts.append(f"not named in include_path {', '.join(map(str, src.include))}")
    close = difflib.get_close_matches(name, src.world or [], n=1)
    if close:
        parts.append(f"did you mean {close[0]}?")
    return f" ({'; '.join(parts)})" if parts else " (no world or include_path to find it in)"


def check_tasks(exp: SearchExperiment, out: Preflight) -> None:
    """Proxies, their test variants and the target resolve from the world, include_path or
    lm-eval's built-in tasks (the proxy evaluator and promotion index built-ins when needed)."""
    src = _task_sources(exp, out)

    def unknown(where: str, name: str, builtin: bool) -> None:
        if src.incomplete:
            out.unchecked.append(f"{where} {name}: not checked, a task source is missing")
        else:
            out.problems.append(f"{where} {name}: unknown task{_known(name, src)}")

    default = "" if exp.proxies is not None else " (default)"
    for i, p in enumerate(exp.proxy_list):
        where = f"proxies[{i}].task{default}"
        if _find(p.task, src, True, out) is None:
            unknown(where, p.task, builtin=True)
        elif heldout_task(p.task) != p.task and _find(heldout_task(p.task), src, True, out) is None:
            test = heldout_task(p.task)
            unknown(f"{where} {p.task}: promotion also evaluates its test variant", test, True)
    where = "target" if exp.target is not None else "target (default)"
    if _find(exp.target_task, src, True, out) is None:
        unknown(where, exp.target_task, builtin=True)


def find_tasks(names: list[tuple[str, str]], world: str | None, texts: dict, include_path: list[str] | None = None) -> tuple[list[str], list[str]]:  # fmt: skip
    """Check lm-eval task names as the search preflight does: the world's tasks, an
    include_path folder's, then lm-eval's built-ins (`_find`). Used by `layerswap plan`.

    Args:
        names: (where, task name) pairs; `where` starts each problem line.
        world: an embedded world folder whose tasks count, or None.
        texts: a cache of lm-eval's config text shared between calls (read once: seconds).
        include_path: folders of extra task YAMLs (a search experiment's).
    Returns:
        (problems, where each found name resolves).
    """
    out = Preflight()
    src = _task_sources(SimpleNamespace(world=world, include_path=include_path or []), out)  # fmt: skip
    src.texts = texts
    found = []
    for where, name in names:
        at = _find(name, src, True, out)
        if at is None:
            out.problems.append(f"{where}: unknown task {name}{_known(name, src)}")
        elif at == "world":
            found.append(f"task {name}: the world's task YAMLs ({world})")
    return out.problems, found + out.unchecked
