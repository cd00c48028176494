"""The search preflight's checks of the pool's folders: every expert and base folder the search
will read (existence, safetensors weights, config.json), and what they must agree on
(architecture, depth, tokenizer, expert kinds). No torch: the engine's rules are mirrored here.

`check_folders(exp, out)` appends to a Preflight (search/preflight_report.py); search/preflight.py
runs it. Tests: .venv/bin/python -m pytest -q tests/search/test_preflight.py
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerswap.search.pool import pool_base, registry_picks, registry_problems
from layerswap.search.preflight_report import Preflight
from layerswap.spaces.base import is_hub_id
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.trainables.merge.adapter_kind import expert_kind, is_lora_adapter
from layerswap.trainables.merge.arch import SUPPORTED_MODEL_TYPES, arch_differences
from layerswap.trainables.merge.generation import generation_file_problem
from layerswap.trainables.merge.tokenizer_match import TokenizerMismatch, check_same_tokenizer
from layerswap.trainables.storage import exists, is_uri

# Mirrors of trainables.merge.checkpoint.{WEIGHT_FILES,PICKLE_SUFFIXES}: that
# module imports torch, and the preflight must not (tests/search/test_preflight.py pins them).
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# AutoTokenizer needs one of these where the search loads it: the first task expert (search/trial.py).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


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


def check_folders(exp: SearchExperiment, out: Preflight) -> None:
    """Inspect every folder the search will read, then run FOLDER_CHECKS over them.

    Args:
        exp: the validated search experiment.
        out: the report the problems and unchecked notes are appended to.
    """
    experts, base = _pool_folders(exp, out)
    for f in [*experts, *([base] if base is not None else [])]:
        _inspect(f, out)
    for check in FOLDER_CHECKS:
        check(exp, experts, base, out)


def _pool_folders(exp: SearchExperiment, out: Preflight) -> tuple[list[_Folder], _Folder | None]:
    """The folders search.pool.resolve_pool would hand the search, with the fields naming them."""
    if exp.experts is None:
        # search.pool.explicit_pool types each explicit expert by its folder, as below
        experts = [
            _Folder(f"{name}[{i}]", p, side, expert_kind(p))
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
            expert_kind(r["path"], r["mode"]),
        )
        for side in ("task", "language")
        for r in picks.get(side, [])
    ]
    base = pool_base(exp, rows)
    label = "base" if exp.base else f"base (from experts.registry {reg})"
    return experts, _Folder(label, base, "base", "full") if base else None


def _weights_problem(root: Path) -> str | None:
    """What trainables.merge.checkpoint.find_weights would refuse in `root` (None: it finds shards)."""
    for stem in WEIGHT_FILES:
        index = root / f"{stem}.index.json"
        if index.exists() and (root / stem).exists():
            return f"holds both {stem} and {index.name}, two sets of weights; remove the stale one"
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
    f.exists, f.adapter = True, is_lora_adapter(p)
    if f.adapter and f.side == "base":
        out.problems.append(f"{where}: a LoRA adapter, expected a full checkpoint")
    bad = _weights_problem(p)
    if bad:
        out.problems.append(f"{where}: {bad}")
    if f.adapter:
        return  # an adapter's architecture is its base's; adapter_config.json has no ARCH_FIELDS
    if (bad := generation_file_problem(p)) is not None:  # its trials would each fail on it
        out.problems.append(f"{f.label}: {bad}")
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
    """Every full checkpoint's config agrees with the base's (else the first expert's) on
    what the layers compute (trainables.merge.arch.arch_differences)."""
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
        # the merge engine's own comparison (torch-free), so the preflight refuses what it would
        diffs = [f"{k} {a!r} vs {b!r}" for k, a, b in arch_differences(f.config, ref.config)]
        if diffs:
            out.problems.append(
                f"experts disagree with {name} {ref.path}: {', '.join(diffs)} ({f.label} {f.path})"
            )


def _check_depth_source(
    exp: SearchExperiment, experts: list[_Folder], base: _Folder | None, out: Preflight
) -> None:
    """layerswap.search.pool.model_depth reads num_hidden_layers of the first full task expert,
    else of the base (a pool of LoRA task experts: their base, which _check_base_needed asks for)."""
    if exp.experts is not None and not any(f.side == "task" for f in experts):
        # The registry gave no task expert (missing, unreadable, none of this base: its problem
        # is said): the depth source is unknown, a full task expert of it would be one.
        return
    like = next((f for f in experts if f.side == "task" and f.kind == "full"), base)
    if like is None:
        return  # no base and LoRA task experts only: _check_base_needed says so
    where = f"{like.label} {like.path}"
    if not like.exists and is_hub_id(like.path):
        out.problems.append(
            f"{where}: the search reads the depth from config.json in a local folder "
            f"(search.pool.model_depth); a Hub id is not one"
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


def _check_same_tokenizer(
    exp: SearchExperiment, experts: list[_Folder], base: _Folder | None, out: Preflight
) -> None:
    """The disk merge's tokenizer rule (trainables/merge/tokenizer_match.py) over the local
    folders: the live trials do not check it, so a pool of mixed vocabularies was refused only
    when the best recipe was written, after the whole search."""
    folders = [Path(f.path).expanduser() for f in [*experts, base] if f is not None and f.exists]
    try:
        check_same_tokenizer(folders)
    except TokenizerMismatch as e:
        out.problems.append(str(e))


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
    _check_same_tokenizer,
    _check_expert_kinds,
)
