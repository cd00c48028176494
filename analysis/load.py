"""Read a run directory's result files into pandas, tolerating absences (schemas: search/
results.py trials, experts/registry.py experts, search/promote.py promotion).

`load_run(RUN)` returns a `RunData`; every file is optional, but a file that exists and cannot be
read (or lacks a required column) raises ValueError naming the file.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from layerswap.spaces.base import is_hub_id, is_uri
from layerswap.spaces.search_experiment import Proxy
from layerswap.spaces.task_families import INDICATOR_PREFIX as IND
from layerswap.spaces.task_families import (
    WORLD_PREFIX,
    find_family,
    heldout_task,
    task_language,
    task_split,
)
from layerswap.trainables.atomic import read_parquet
from layerswap.trainables.merge.generation import cached_hub_folder
from layerswap.trainables.storage import local_copy

REGISTRY = Path("experts/registry.parquet")
TRIALS = Path("search/trials.parquet")
STUDY = Path("search/study.db")
PROMOTION = Path("promotion/results.parquet")
EXPERIMENT = Path("search/experiment.json")  # the search's validated experiment

# Columns without which a file's rows mean nothing; everything else is optional.
REQUIRED = {
    REGISTRY: ("expert_id", "kind"),
    TRIALS: ("trial_id",),
    PROMOTION: ("model", "task", "value"),
}


@dataclass
class RunData:
    """Everything analysis reads from one run directory (None: the file is not in this run)."""

    root: Path
    registry: pd.DataFrame | None = None
    trials: pd.DataFrame | None = None
    promotion: pd.DataFrame | None = None
    study_db: Path | None = None
    recipe_yaml: Path | None = None  # a demo-style run: one recipe naming base and experts
    # proxy tasks whose metric is lower-is-better (a Brier score), from the search's experiment
    lower_is_better: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def resolve(self, path: str | None) -> Path | None:
        """A path from a result file (a checkpoint, a raw lm-eval JSON): absolute, or relative to
        the run directory. Result files record absolute paths; a run copied elsewhere (from the
        cluster to a laptop) finds them under its new root: the longest tail of the recorded
        path, of two parts at least, that exists below `root` (the path as recorded when none
        does, for the caller to name as missing)."""
        if path is None or (isinstance(path, float) and pd.isna(path)) or path == "":
            return None
        p = Path(path)
        if not p.is_absolute():
            return self.root / p
        if p.exists():
            return p
        parts = p.parts[1:]
        for i in range(len(parts) - 1):  # longest tail first
            moved = self.root.joinpath(*parts[i:])
            if moved.exists():
                return moved
        return p

    def model_folder(self, ref: str | None) -> tuple[Path | None, str]:
        """A local folder holding the weights of model `ref` as a result file records it: a
        folder (`resolve`), a Hub id's snapshot in the local Hugging Face cache (never the
        network), or a URI's copy in layerswap's download cache (trainables/storage.py; fetched
        when not there yet). Returns (folder, "") or (None, why not, naming `ref`)."""
        if ref is None or (isinstance(ref, float) and pd.isna(ref)) or ref == "":
            return None, "no model recorded"
        ref = str(ref)
        here = self.resolve(ref)
        if here is not None and here.is_dir():
            return here, ""
        if is_hub_id(ref):
            snapshot = cached_hub_folder(ref, "config.json")
            if snapshot is not None and _has_weights(Path(snapshot)):
                return Path(snapshot), ""
            return None, f"{ref}: not found here, nor as a Hub model in the local cache (`layerswap prefetch` of the run's configs downloads Hub models)"  # fmt: skip
        if is_uri(ref):
            print(f"analyze: reading {ref} (cached under layerswap's download cache)", file=sys.stderr)  # fmt: skip
            try:
                return local_copy(ref), ""
            except (OSError, ValueError) as e:
                return None, f"{ref}: cannot be read ({e})"
        return None, f"{ref}: not found"


def _has_weights(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("*.safetensors"))


def read_table(path: Path, required: tuple[str, ...] = ()) -> pd.DataFrame:
    """Read one Parquet file, naming the file in any error.

    Args:
        path: the .parquet file.
        required: columns that must be present.
    Returns:
        The table.
    Raises:
        ValueError naming the file for an unreadable file or a missing required column.
    """
    try:
        df = read_parquet(path).to_pandas()
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise ValueError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing required column(s) {missing}")
    return df


def load_run(root: str | Path) -> RunData:
    """Load whatever result files a run directory has.

    Args:
        root: the run directory.
    Returns:
        RunData with None for files the run does not have.
    Raises:
        ValueError when `root` is not a directory or a present file is malformed.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: run directory does not exist")
    run = RunData(root=root)
    for rel, attr in ((REGISTRY, "registry"), (TRIALS, "trials"), (PROMOTION, "promotion")):
        if (root / rel).exists():
            setattr(run, attr, read_table(root / rel, REQUIRED[rel]))
    if (root / STUDY).exists():
        run.study_db = root / STUDY
    if (root / "recipe.yaml").exists():
        run.recipe_yaml = root / "recipe.yaml"
    if (root / EXPERIMENT).exists():
        run.lower_is_better = _lower_is_better(root / EXPERIMENT)
    return run


def _lower_is_better(path: Path) -> set[str]:
    """The proxy tasks of a saved search experiment whose scale points down (Proxy.best < worst).

    Only its `proxies` are read, each as a `Proxy`: the rest of the schema may have moved since
    the run. A run saved with implicit (default) proxies predates lower-is-better proxies.
    """
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get("proxies") or []
        proxies = [Proxy.model_validate(p) for p in saved]
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not a search experiment's proxies ({e})") from e
    return {p.task for p in proxies if p.lower_is_better}


# ---------------------------------------------------------------------------------------------
# Task names: their families, splits and languages are spaces.task_families' to say.


def is_target_family(task: str) -> bool:
    """Whether a task (or an `ind__` indicator column) is of a family that measures the task
    skill (MGSM-like: spaces.task_families); a task of no family is not."""
    fam = find_family(task.removeprefix(IND))
    return fam is not None and fam.skill == "task"


def target_tasks(run: RunData) -> list[str]:
    """The target tasks: test tasks of the task-skill family (MGSM) in a non-English language.

    Taken from the promotion results (split "test") when present, else from the registry's
    indicator columns. Returns test-split task names, sorted.
    """
    found: set[str] = set()
    if run.promotion is not None:
        prom = run.promotion
        test = prom[prom["split"] == "test"] if "split" in prom.columns else prom
        for t in test["task"].dropna().unique():
            if is_target_family(t) and task_split(t) == "test" and task_language(t) != "en":
                found.add(str(t))
    if not found and run.registry is not None:
        for c in indicator_columns(run.registry):
            t = c[len(IND) :]
            if is_target_family(t) and task_language(t) != "en":
                found.add(heldout_task(t))
    return sorted(found)


def indicator_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith(IND)]


def proxy_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("proxy__")]


def target_rows(promotion: pd.DataFrame, task: str) -> pd.DataFrame:
    """Promotion's rows of `task` on its test split (a row without a split counts as test):
    the rows every section reads a model's target score from."""
    sel = promotion["task"] == task
    if "split" in promotion.columns:
        sel &= promotion["split"].fillna("test") == "test"
    return promotion[sel]


def target_scores(run: RunData, task: str) -> pd.DataFrame:
    """Per promoted model, its score on `task` (test split): columns model, kind, recipe_id,
    value, n_items. Empty when the run has no promotion results for it."""
    cols = ["model", "kind", "recipe_id", "value", "n_items"]
    if run.promotion is None:
        return pd.DataFrame(columns=cols)
    p = target_rows(run.promotion, task).copy()
    for c in cols:
        if c not in p.columns:
            p[c] = None
    # One row per (model, task) by design; if a producer wrote several (a promotion with several
    # seeds), average them. analysis/paired.py averages each item over the same rows.
    agg = p.groupby("model", as_index=False).agg(
        kind=("kind", "first"),
        recipe_id=("recipe_id", "first"),
        value=("value", "mean"),
        n_items=("n_items", "max"),
    )
    return agg[cols]


def merge_scores(run: RunData, task: str) -> pd.DataFrame:
    """`target_scores` of the merges: one row per recipe id, the candidate's where a baseline is
    the same recipe (the paper default is often also the search's first trial, and a promotion
    before this rule evaluated it twice): one merge counts once in a correlation or a table."""
    tgt = target_scores(run, task)
    tgt = tgt[tgt["recipe_id"].notna()]  # base and the experts have no recipe
    first = tgt.assign(_baseline=tgt["kind"] == "baseline").sort_values("_baseline", kind="stable")
    return first.drop_duplicates("recipe_id").drop(columns="_baseline").sort_index()


def ok_trials(run: RunData) -> pd.DataFrame | None:
    """Trials that finished (status "ok" when the column exists), in finishing order."""
    t = run.trials
    if t is None or t.empty:
        return None
    if "status" in t.columns:
        t = t[t["status"] == "ok"]
    if "finished_at" in t.columns:
        t = t.sort_values("finished_at", kind="stable")
    return t.reset_index(drop=True)


def trial_by_recipe(run: RunData) -> pd.DataFrame | None:
    """One trial row per recipe_id: the highest-fidelity, latest ok trial of that recipe."""
    t = ok_trials(run)
    if t is None or "recipe_id" not in t.columns:
        return None
    if "fidelity" in t.columns:
        t = t.sort_values("fidelity", kind="stable")
    return t.drop_duplicates("recipe_id", keep="last").set_index("recipe_id")


def hparams(row: pd.Series) -> dict:
    """An expert's hparams JSON as a dict ({} when absent or unparsable)."""
    raw = row.get("hparams")
    if not isinstance(raw, str):
        return {}
    try:
        out = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return out if isinstance(out, dict) else {}


def short(task: str) -> str:
    """A compact label for a task name in figures."""
    return task.removeprefix(WORLD_PREFIX)
