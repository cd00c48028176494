"""Which promoted models a resumed promotion keeps instead of evaluating again.

Promotion writes each model's raw lm-eval result per task (RUN/promotion/lm_eval/<model>/<task>.json)
as soon as that model is done, with `fingerprint(...)` under config.layerswap_promotion: what was
evaluated (the model's content id, recomputed now: an expert changed on disk is another model), how
it decoded (the digest of the generation settings its primary checkpoint gives it, which content
ids do not hash: trainables/merge/generation.py; a result written without one is evaluated again), on
which task and task content (`tasks_digest`: the world's manifest and every file of the task
folders, so a rebuilt world or an edited task YAML evaluates again), with which few-shot count,
item limit, token budget, device and lm-eval version. A later promotion of the same run (`search --resume`, `demo --resume`)
reads a model back only when every task's file holds the fingerprint it would write now, so an
interrupted promotion of 8B models loses at most the model it was evaluating, and a changed
`promote` block (more items, another few-shot count) evaluates again. Run its tests:
.venv/bin/python -m pytest -q tests/search/test_promote_kept.py
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import lm_eval  # its package only (4 ms): the task modules load when a run needs them

from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.trainables.atomic import is_writer_sibling
from layerswap.trainables.merge.assembly import primary_ref
from layerswap.trainables.merge.generation import decoding_digest
from layerswap.trainables.model_ids import content_recipe_id, model_content_id
from layerswap.world.manifest import MANIFEST

KEY = "layerswap_promotion"  # the fingerprint's key in a raw result's `config`


def _lm_eval_version() -> str | None:
    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return None


def tasks_digest(exp: SearchExperiment, include_paths: list[str]) -> str:
    """sha256 of what the promotion's tasks read locally: the world's manifest (the sha256 of its
    every data file) and every file under the task folders (`include_paths`), by relative name.
    A Hub dataset is known by its name only (its revision can move under it).

    Args:
        exp: the search experiment (its `world`).
        include_paths: the task folders lm-eval reads (search.pool.include_paths).
    """
    h = hashlib.sha256()
    # Where the world and lm-eval are installed is not what a task computes: the task YAMLs name
    # both by absolute path, and a run resumed after a move (scratch to project storage, another
    # node's venv) must not evaluate every model again. The world's content is its manifest.
    places = {}
    if exp.world is not None:
        places[str(Path(exp.world).resolve())] = b"<world>"
        if (manifest := Path(exp.world) / MANIFEST).is_file():
            h.update(manifest.read_bytes())
    places[str(Path(lm_eval.__file__).resolve().parent)] = b"<lm_eval>"
    for root in map(Path, include_paths):
        # A killed writer's temporary (`.world_x.yaml.tmp-PID-TAG`) is no task lm-eval reads.
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and not is_writer_sibling(p.name))  # fmt: skip
        for f in files:
            data = f.read_bytes()
            for where, name in sorted(places.items(), key=lambda kv: -len(kv[0])):
                data = data.replace(where.encode(), name)
            h.update(f"\0{f.relative_to(root) if f != root else f.name}\0".encode())
            h.update(hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def model_id(what: object) -> str:
    """The content id of a promoted model, taken now (a model whose expert changed on disk since
    the search is another model): a checkpoint reference's, or a recipe's."""
    return model_content_id(what) if isinstance(what, str) else content_recipe_id(what)


def model_decoding(what: object, base: str | None) -> str:
    """The digest of the generation settings a promoted model decodes with, taken now: a
    checkpoint reference's, or a recipe's primary checkpoint's (what a disk merge copies)."""
    return decoding_digest(what if isinstance(what, str) else primary_ref(what), base)


def fingerprint(
    exp: SearchExperiment,
    model: str,
    task: str,
    shots: int | None,
    device: str,
    tasks: str,
    decoding: str | None = None,
) -> dict:
    """What decides one model's result on one task, as JSON data.

    Args:
        exp: the search experiment (its `promote` block: limit and max_gen_toks).
        model: the model's `model_id`.
        task: the lm-eval task.
        shots: the few-shot count it is run at (None: the task's default).
        device: where it is evaluated ("cpu", "cuda"): kernels differ, and a leaderboard whose
            models were scored on different devices could differ by more than the models do.
        tasks: `tasks_digest` of this promotion.
        decoding: `model_decoding` of the model (lm-eval's generate reads its generation config).
    """
    return {
        "model_id": model,
        "decoding": decoding,
        "task": task,
        "task_files": tasks,
        "num_fewshot": shots,
        "limit": exp.promote.limit,
        "max_gen_toks": exp.promote.max_gen_toks,
        "device": device,
        "lm_eval": _lm_eval_version(),
    }


def fingerprints(
    exp: SearchExperiment, what: object, groups: list[tuple[int | None, list[str]]], device: str, tasks: str, base: str | None = None
) -> dict[str, dict]:  # fmt: skip
    """Task -> `fingerprint` of one model over the promotion's (shots, tasks) groups; its content
    id and decoding are taken once, not per task (`base`: the pool's, a LoRA adapter's decoding)."""
    model, decoding = model_id(what), model_decoding(what, base)
    return {t: fingerprint(exp, model, t, shots, device, tasks, decoding) for shots, ts in groups for t in ts}  # fmt: skip


def raw_path(pdir: Path, name: str, task: str) -> Path:
    """RUN/promotion/lm_eval/<model>/<task>.json: one model's raw lm-eval result on one task."""
    return pdir / "lm_eval" / name / f"{task}.json"


def kept_raws(pdir: Path, name: str, prints: dict[str, dict]) -> dict[str, dict] | None:
    """The raw results an earlier promotion wrote for model `name`, when every task's file holds
    the fingerprint it would be written with now; else None (the model is evaluated).

    Args:
        pdir: RUN/promotion.
        name: the model's name (its folder under lm_eval/).
        prints: task -> `fingerprint(...)` of this promotion.
    Returns:
        task -> raw result restricted to that task, as written; None when any is missing,
        unreadable, another evaluation's, or holds no score for its task.
    """
    raws = {}
    for task, want in prints.items():
        try:
            raw = json.loads(raw_path(pdir, name, task).read_text(encoding="utf-8"))
            if raw["config"][KEY] != want or task not in raw["results"]:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            # Missing, half-copied, hand-edited or written before fingerprints: evaluated again,
            # as the cost of a wrong score kept would be a wrong leaderboard.
            return None
        raws[task] = raw
    return raws
