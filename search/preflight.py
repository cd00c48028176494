"""Preflight for `layerswap search`: every problem an experiment has that shows before Ray starts or
a model loads (expert folders, the registry, configs, the world, task names), reported at once.

`problems = check_search(exp)` ([] means go); `preflight(exp)` also lists what it could not check
offline. Imports no torch, ray or lm-eval. Tests: .venv/bin/python -m pytest -q tests/search/test_preflight.py
"""

from __future__ import annotations

import difflib
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerswap.search.pool import pool_base, registry_picks, registry_problems
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.task_families import heldout_task
from layerswap.trainables.evaluate.tasks import lm_eval_tasks_dir, write_world_tasks
from layerswap.trainables.merge.arch import ARCH_FIELDS, SUPPORTED_MODEL_TYPES
from layerswap.trainables.storage import exists, is_uri
from layerswap.world.build import verify_world

# Mirrors of trainables.merge.checkpoint.{WEIGHT_FILES,PICKLE_SUFFIXES} and lora.CONFIG: those
# modules import torch, and the preflight must not (tests/search/test_preflight.py pins them).
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
ADAPTER_CONFIG = "adapter_config.json"
# AutoTokenizer needs one of these where the search loads it: the first task expert (search/trial.py).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
# Task configs are small YAMLs or suffix-less templates (lm-eval's `direct_yaml`); bigger files
# under an include path are data, not configs.
CONFIG_MAX_BYTES = 1 << 20
LIST_AT_MOST = 16  # known task names shown in one message


@dataclass
class Preflight:
    """What the preflight found: problems that stop the search, and what it could not check."""

    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


@dataclass
class _Folder:
    """A checkpoint folder the search will read, and what the preflight found in it."""

    label: str  # the field that names it, e.g. "task_experts[1]"
    path: str
    side: str  # "task", "language" or "base"
    kind: str  # "full" or "lora": what the pool will record
    exists: bool = False
    adapter: bool = False
    config: dict[str, Any] | None = None


def check_search(exp: SearchExperiment) -> list[str]:
    """Every problem that would stop `layerswap search` on `exp`, found without Ray or a model.

    Args:
        exp: the validated search experiment.
    Returns:
        one human-readable line per problem, each naming its field, file or value; [] means go.
    """
    return preflight(exp).problems


def preflight(exp: SearchExperiment) -> Preflight:
    """`check_search`, plus notes on what cannot be checked offline (Hub ids, task text search).

    Args:
        exp: the validated search experiment.
    Returns:
        Preflight(problems, unchecked).
    """
    out = Preflight()
    experts, base = _pool_folders(exp, out)
    for f in [*experts, *([base] if base is not None else [])]:
        _inspect(f, out)
    for check in FOLDER_CHECKS:
        check(exp, experts, base, out)
    _check_tasks(exp, out)
    return out


# ---------------------------------------------------------------------------- expert folders


def _pool_folders(exp: SearchExperiment, out: Preflight) -> tuple[list[_Folder], _Folder | None]:
    """The folders search.pool.resolve_pool would hand the search, with the fields naming them."""
    if exp.experts is None:
        # ExpertPool.from_paths records every explicit expert as a full checkpoint.
        experts = [
            _Folder(f"{name}[{i}]", p, side, "full")
            for side, name in (("task", "task_experts"), ("language", "language_experts"))
            for i, p in enumerate(getattr(exp, name))
        ]
        return experts, _Folder("base", exp.base, "base", "full") if exp.base else None
    reg = exp.experts.registry
    rows, problems = registry_problems(reg)
    picks: dict[str, list[dict[str, Any]]] = {}
    if not problems:
        picks, problems = registry_picks(exp, rows)
    out.problems += problems
    experts = [
        _Folder(
            f"experts.registry {reg}: {side} expert {r['expert_id']}",
            r["path"],
            side,
            "lora" if r["mode"] == "lora" or _is_lora_adapter(Path(r["path"])) else "full",
        )
        for side in ("task", "language")
        for r in picks.get(side, [])
    ]
    base = pool_base(exp, rows)
    label = "base" if exp.base else f"base (from experts.registry {reg})"
    return experts, _Folder(label, base, "base", "full") if base else None


def is_hub_id(ref: str) -> bool:
    """A model reference that names a Hub repo, not a local folder."""
    # The rule of trainables.merge.engine.resolve_ref: `org/name`, not a relative or home path.
    return ref.count("/") == 1 and not ref.startswith((".", "/", "~"))


def _is_lora_adapter(path: Path) -> bool:
    """layerswap.trainables.merge.lora.is_lora_adapter, without importing torch."""
    try:
        return json.loads((path / ADAPTER_CONFIG).read_text()).get("peft_type") == "LORA"
    except (OSError, ValueError, AttributeError):
        return False


def _weights_problem(root: Path) -> str | None:
    """What trainables.merge.checkpoint.find_weights would refuse in `root` (None: it finds shards)."""
    for stem in WEIGHT_FILES:
        index = root / f"{stem}.index.json"
        if index.exists():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                return f"{index.name} is not a valid safetensors index ({e})"
            missing = [s for s in shards if not (root / s).exists()]
            return f"{index.name} names missing shard(s) {missing}" if missing else None
        if (root / stem).exists():
            return None
    pickles = sorted(p.name for p in root.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
    if pickles:
        return f"only pickled weights ({', '.join(pickles)}); convert to safetensors first"
    return f"no {', '.join(WEIGHT_FILES)} or index: not a checkpoint folder"


def _inspect(f: _Folder, out: Preflight) -> None:
    """Existence, weights and config.json of one folder (fills f.exists / f.adapter / f.config)."""
    p = Path(f.path).expanduser()
    where = f"{f.label} {f.path}"
    if is_uri(f.path):  # cloud storage: only existence here; the files are read once copied
        try:
            there = exists(f.path)
        except (OSError, ValueError) as e:
            out.problems.append(f"{f.label}: {e}")
            return
        if not there:
            out.problems.append(f"{where}: no such folder in storage")
        else:
            out.unchecked.append(f"{where}: in cloud storage; its files are checked when copied")
        return
    if not p.exists():
        if is_hub_id(f.path):
            out.unchecked.append(f"{where}: not a local folder; taken as a Hub id, not checked")
        else:
            out.problems.append(f"{where}: no such folder")
        return
    if not p.is_dir():
        out.problems.append(f"{where}: a file, expected a checkpoint folder")
        return
    f.exists, f.adapter = True, _is_lora_adapter(p)
    if f.adapter and f.side == "base":
        out.problems.append(f"{where}: a LoRA adapter, expected a full checkpoint")
    bad = _weights_problem(p)
    if bad:
        out.problems.append(f"{where}: {bad}")
    if f.adapter:
        return  # an adapter's architecture is its base's; adapter_config.json has no ARCH_FIELDS
    try:
        cfg = json.loads((p / "config.json").read_text())
    except FileNotFoundError:
        out.problems.append(f"{where}: no config.json")
        return
    except (OSError, ValueError) as e:
        out.problems.append(f"{where}: config.json is not readable JSON ({e})")
        return
    if not isinstance(cfg, dict):
        out.problems.append(f"{where}: config.json is not a JSON object")
        return
    f.config = cfg


def _check_base_needed(
    exp: SearchExperiment, experts: list[_Folder], base: _Folder | None, out: Preflight
) -> None:
    if base is not None:
        return
    lora = [f"{f.label} {f.path}" for f in experts if f.adapter or f.kind == "lora"]
    if lora:
        out.problems.append(
            f"base: not given, but LoRA adapters are folded into the base ({'; '.join(lora)})"
        )


def _check_agreement(
    exp: SearchExperiment, experts: list[_Folder], base: _Folder | None, out: Preflight
) -> None:
    """Every full checkpoint's ARCH_FIELDS agree with the base's (else the first expert's)."""
    full = [f for f in experts if f.config is not None]
    ref = base if base is not None and base.config is not None else (full[0] if full else None)
    if ref is None:
        return
    mtype = ref.config.get("model_type")
    if mtype not in SUPPORTED_MODEL_TYPES:
        out.problems.append(
            f"{ref.label} {ref.path}: config.json model_type {mtype!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    name = "base" if ref is base else ref.label
    for f in full:
        if f is ref:
            continue
        diffs = [
            f"{k} {f.config.get(k)!r} vs {ref.config.get(k)!r}"
            for k in ARCH_FIELDS
            if f.config.get(k) != ref.config.get(k)
        ]
        if diffs:
            out.problems.append(
                f"experts disagree with {name} {ref.path}: {', '.join(diffs)} ({f.label} {f.path})"
            )


def _check_depth_source(
    exp: SearchExperiment, experts: list[_Folder], base: _Folder | None, out: Preflight
) -> None:
    """layerswap.search.pool.model_depth reads num_hidden_layers of the first full task expert, else base."""
    like = next((f for f in experts if f.side == "task" and f.kind == "full"), base)
    if like is None:
        return  # no base and LoRA task experts only: _check_base_needed says so
    where = f"{like.label} {like.path}"
    if not like.exists and is_hub_id(like.path):
        out.problems.append(
            f"{where}: the search reads the depth from config.json in a local folder "
            f"(search.pool.model_depth); a Hub id is not one"
        )
    elif like.adapter:
        out.problems.append(
            f"{where}: a LoRA adapter, but explicit experts are taken as full checkpoints and the "
            f"search reads the depth from its config.json: list a full task expert first, or "
            f"give the experts through experts.registry"
        )
    elif like.config is not None:
        n = like.config.get("num_hidden_layers")
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            out.problems.append(f"{where}: config.json has no valid num_hidden_layers ({n!r})")


def _check_tokenizer(
    exp: SearchExperiment, experts: list[_Folder], base: _Folder | None, out: Preflight
) -> None:
    first = next((f for f in experts if f.side == "task"), None)
    if first is None or not first.exists:
        return
    if not any((Path(first.path) / n).exists() for n in TOKENIZER_FILES):
        out.problems.append(
            f"{first.label} {first.path}: no tokenizer ({', '.join(TOKENIZER_FILES)}); the "
            f"search loads the tokenizer from the first task expert"
        )


def _check_expert_kinds(
    exp: SearchExperiment, experts: list[_Folder], base: _Folder | None, out: Preflight
) -> None:
    """layerswap.spaces.search_space._choices: each side needs an expert of a kind the space allows."""
    allowed = exp.space.expert_kinds
    for side in ("task", "language"):
        kinds = sorted({f.kind for f in experts if f.side == side})
        if kinds and not set(kinds) & set(allowed):
            out.problems.append(
                f"space.expert_kinds {allowed}: no {side} expert of that kind ({side} experts: {kinds})"
            )


# Checks over the folders, in report order; each appends to out.problems.
FOLDER_CHECKS: tuple[Callable[..., None], ...] = (
    _check_base_needed,
    _check_agreement,
    _check_depth_source,
    _check_tokenizer,
    _check_expert_kinds,
)


# ---------------------------------------------------------------------------- task names


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


def _check_tasks(exp: SearchExperiment, out: Preflight) -> None:
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
    from types import SimpleNamespace

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
