"""A seed fixes the search across a resume and across machines: TPE seeded per trial
(search/sampler.py), the batch independent of the cluster, a changed seed refused on --resume.

Run: .venv/bin/python -m pytest -q tests/search/test_sampler.py
"""

from __future__ import annotations

import optuna
import pytest

from layerswap.search.reconcile import reconcile
from layerswap.search.results import TrialStore
from layerswap.search.search import _make_searcher, batch_size
from layerswap.search.search_dir import check_search_dir
from layerswap.search.tune_trial import META
from layerswap.spaces.search_experiment import SearchExperiment, SearchSettings
from layerswap.spaces.search_space import ExpertPool
from layerswap.trainables.outputs import OutputError, write_marker
from tests.search.test_searcher import _ok

POOL = ExpertPool.from_paths(["/t"], ["/l"], "/b")
SIZE, TRIALS = 2, 12


def _exp(seed: int = 0) -> SearchExperiment:
    return SearchExperiment.model_validate(
        {
            "name": "s",
            "language": "xa",
            "base": "/b",
            "task_experts": ["/t"],
            "language_experts": ["/l"],
            "space": {"bottom": {"low": 0, "high": 6}, "top": {"low": 0, "high": 2}},
            "proxies": [{"task": "a_dev"}],
            "search": {"num_samples": TRIALS, "seed": seed, "fidelity": {"policy": "none"}},
        }
    )


def _driver(folder, store):
    """The search's own searcher (search._make_searcher: make_sampler, warm start) over folder."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / 'study.db'}")
    fresh = not optuna.get_all_study_summaries(storage)
    if not fresh:
        reconcile(optuna.load_study(study_name="s", storage=storage), store)
    s = _make_searcher(_exp(), POOL, 4, store, storage, fresh, progress=False)
    s.plan_batches(SIZE, TRIALS - store.spent())
    return s


def _run(folder, stop_after: int | None = None) -> list[str]:
    """Run the search as Tune would (batches of SIZE), scoring each recipe by its params; with
    `stop_after` trials told, ask the next batch and stop (an interrupted driver), then resume in
    a new searcher. Returns (trial id, recipe id) in table order."""
    folder.mkdir()
    store = TrialStore(folder / "trials.parquet")
    s, n = _driver(folder, store), 0
    while store.spent() < TRIALS:
        batch = []
        while (cfg := s.suggest(f"t{n}")) is not None:
            batch.append((f"t{n}", cfg))
            n += 1
        if stop_after is not None and store.spent() >= stop_after:
            stop_after = None  # the batch asked is interrupted: a new driver resumes
            s = _driver(folder, store)
            continue
        for tid, cfg in batch:
            p = {k: v for k, v in cfg.items() if k != META}
            s.on_trial_complete(tid, _ok(round(0.1 * p["bottom"] + 0.01 * p.get("top", 0), 3)))
    return [(r["trial_id"], r["recipe_id"]) for r in TrialStore(folder / "trials.parquet").rows]


def test_a_resumed_search_proposes_what_an_uninterrupted_one_does(tmp_path):
    whole = _run(tmp_path / "whole")
    cut = _run(tmp_path / "cut", stop_after=4)
    assert len(whole) == len(cut) == TRIALS
    # the interrupted batch (0004, 0005) ran again as 0006, 0007, in its place
    assert [t for t, _ in cut][4:6] == ["0006", "0007"]
    assert [r for _, r in cut] == [r for _, r in whole]


def test_the_batch_depends_on_the_budget_not_the_cluster():
    assert batch_size(SearchSettings(num_samples=16)) == 4  # on 2 cores or 64
    assert batch_size(SearchSettings(num_samples=16, max_concurrent=3)) == 3
    assert batch_size(SearchSettings(num_samples=1)) == 1


def test_resume_with_another_seed_is_refused_naming_both(tmp_path):
    sdir = tmp_path / "search"
    sdir.mkdir()
    write_marker(sdir, "search", "s")
    (sdir / "experiment.json").write_text(_exp(0).explicit().model_dump_json())
    store = TrialStore(sdir / "trials.parquet")
    with pytest.raises(OutputError, match=r"--resume: search.seed was 0, is now 5 \("):
        check_search_dir(_exp(5), sdir, store, sdir / "study.db", resume=True)
    check_search_dir(_exp(0), sdir, store, sdir / "study.db", resume=True)
