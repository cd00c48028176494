"""A reproducible search killed at any write resumes into the trials an uninterrupted one runs.

Every durable step is counted (each study.db write, each trials.parquet rewrite); a run is cut
right after the k-th by raising there (like a SIGKILL, nothing after it runs, nothing is cleaned
up) and resumed by a fresh driver over the same files, as `search --resume` does. One test kills
a real process with SIGKILL. Run: .venv/bin/python -m pytest -q tests/search/test_search_crash.py
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import layerswap.search.results as results
from layerswap.search.reconcile import reconcile
from layerswap.search.results import TrialStore
from layerswap.search.tune_trial import META
from tests.search.test_sampler import TRIALS, _driver
from tests.search.test_searcher import POINT, _ok, _searcher

# RDBStorage's committing writes; Optuna's cache layer calls the first two by these private names
# (Optuna 5.0), so a rename fails `_batch` loudly (no trial created) rather than quietly.
STORAGE_WRITES = (
    "_create_new_trial",
    "_set_trial_param",
    "set_trial_state_values",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
)


class Killed(BaseException):
    """Not an Exception: no `except Exception` on the way up may handle it."""


class Cut:
    """Counts durable writes; raises Killed right after each write numbered in `at`."""

    def __init__(self, monkeypatch):
        self.n, self.at, self.log = 0, set(), []
        for name in STORAGE_WRITES:
            real = getattr(optuna.storages.RDBStorage, name)
            monkeypatch.setattr(optuna.storages.RDBStorage, name, self._wrap(name, real))
        monkeypatch.setattr(results, "write_parquet_atomic", self._wrap("parquet", results.write_parquet_atomic))  # fmt: skip

    def _wrap(self, name, real):
        def write(*a, **k):
            out = real(*a, **k)
            self.n += 1
            self.log.append(name)
            if self.n in self.at:
                raise Killed(f"after write {self.n} ({name})")
            return out

        return write


@pytest.fixture(scope="module")
def cut():
    with pytest.MonkeyPatch.context() as mp:
        yield Cut(mp)


def _score(cfg: dict) -> dict:
    p = {k: v for k, v in cfg.items() if k != META}
    return _ok(round(0.1 * p["bottom"] + 0.01 * p.get("top", 0), 3))


def _drive(s, store: TrialStore, n: int, forever: bool = False) -> int:
    """Run the search as Tune would: ask a batch, finish it, until the budget is spent."""
    while forever or store.spent() < TRIALS:
        batch = []
        while (cfg := s.suggest(f"t{n}")) is not None:
            batch.append((f"t{n}", cfg))
            n += 1
        for tid, cfg in batch:
            s.on_trial_complete(tid, _score(cfg))
    return n


def _run(folder: Path, cut: Cut, at=()) -> list[str]:
    """The search of tests/search/test_sampler.py (batches of 2, 12 trials), killed right after
    each write numbered in `at` and resumed each time. Returns the table's recipe ids in order."""
    folder.mkdir()
    cut.n, cut.at, cut.log, n = 0, set(at), [], 0
    while True:
        store = TrialStore(folder / "trials.parquet")
        try:
            n = _drive(_driver(folder, store), store, n)
            break
        except Killed:  # a new driver resumes from the files
            n += 10
    cut.at = set()
    return [r["recipe_id"] for r in TrialStore(folder / "trials.parquet").rows]


def _batch(log: list[str], i: int) -> range:
    """The writes from asking batch i (trials 2i, 2i+1) to asking the next one."""
    creates = [k + 1 for k, name in enumerate(log) if name == "_create_new_trial"]
    return range(creates[2 * i], creates[2 * i + 2] + 1)


@pytest.fixture(scope="module")
def whole(tmp_path_factory, cut):
    """The uninterrupted search: its recipe ids, and the writes it made in order."""
    recipes = _run(tmp_path_factory.mktemp("whole") / "run", cut)
    return recipes, list(cut.log)


def test_a_kill_while_a_batch_is_recorded_resumes_into_the_same_trials(tmp_path, cut, whole):
    recipes, log = whole
    write = next(k for k in _batch(log, 2) if log[k - 1] == "parquet")
    # right after the batch's rows are written, and after Optuna heard the first of them
    for k in (write, write + 1):
        assert _run(tmp_path / f"cut{k}", cut, at={k}) == recipes, f"killed after write {k}"


def test_a_kill_between_a_trials_draws_resumes_into_the_same_trials(tmp_path, cut, whole):
    """Trial 0 is the queued warm-start point, trial 3 a TPE proposal: each cut after its first
    param, so the re-run must neither fix that one param nor lose the queued point."""
    recipes, log = whole
    for trial in (0, 3):
        k = next(k for k in _batch(log, trial // 2) if log[k - 1] == "_set_trial_param"
                 and log[:k].count("_create_new_trial") == trial + 1)  # fmt: skip
        assert _run(tmp_path / f"cut{k}", cut, at={k}) == recipes, f"killed in trial {trial}"


@pytest.mark.slow
def test_a_kill_after_any_write_of_a_batch_resumes_into_the_same_trials(tmp_path, cut, whole):
    recipes, log = whole
    for k in _batch(log, 1):  # asking it (a start-up draw, a TPE one), its rows, each tell
        assert _run(tmp_path / f"cut{k}", cut, at={k}) == recipes, f"killed after {log[k - 1]} {k}"


def test_a_kill_inside_the_resumes_reconcile_is_finished_by_the_next(tmp_path, cut, whole):
    recipes, log = whole
    running = next(k for k in _batch(log, 2) if log[k] == "parquet")  # batch asked, running
    # the resume re-queues trials 4 and 5 and tells them FAIL: kill it after the first two
    for j in (1, 2):
        got = _run(tmp_path / f"cut{j}", cut, at={running, running + j})
        assert got == recipes, f"resume killed after its write {j}"


def test_reconcile_tells_optuna_what_the_running_search_would(tmp_path, monkeypatch):
    """A pruned trial keeps its rung values, and a row served from it is PRUNED, not FAIL."""
    pruned = {"status": "pruned", "fidelity": 4, "rungs": [[4, 0.1]], "objective": math.nan, "proxy__a_dev": 0.1}  # fmt: skip

    def history(folder, kill_at_tell):
        import layerswap.search.searcher as searcher

        folder.mkdir()
        s, store, storage = _searcher(folder, points=[POINT, POINT])
        s.plan_batches(3, 3)
        b = [s.suggest(t) for t in "abc"][1]
        assert b[META]["served"] == {"twin_of": s.meta["a"]["recipe_id"]}
        real, told = searcher.tell, []

        def tell(*args):
            if len(told) == kill_at_tell:
                raise Killed
            told.append(real(*args))

        monkeypatch.setattr(searcher, "tell", tell)
        s.on_trial_complete("c", _ok(0.2))
        s.on_trial_complete("b", {"twin_of": s.meta["b"]["recipe_id"], "objective": math.nan})
        try:
            s.on_trial_complete("a", pruned)
        except Killed:
            reconcile(optuna.load_study(study_name="s", storage=storage), TrialStore(store.path))
        trials = optuna.load_study(study_name="s", storage=storage).trials
        return [(t.state, t.values, t.intermediate_values) for t in trials]

    live = history(tmp_path / "live", kill_at_tell=None)
    assert [h[0] for h in live] == [optuna.trial.TrialState.PRUNED] * 2 + [optuna.trial.TrialState.COMPLETE]  # fmt: skip
    for k in range(3):
        assert history(tmp_path / f"cut{k}", kill_at_tell=k) == live, f"killed at tell {k}"


def test_reconcile_requeues_a_trial_an_earlier_resume_failed_but_did_not_requeue(tmp_path):
    """A study left so by a kill between the FAIL and the re-queue (before this was fixed)."""
    s, store, storage = _searcher(tmp_path)
    s.suggest("a")
    study = optuna.load_study(study_name="s", storage=storage)
    study.tell(0, state=optuna.trial.TrialState.FAIL)
    assert reconcile(study, store) == 1
    assert reconcile(study, store) == 0  # once
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert [t.user_attrs["rerun_of"] for t in waiting] == ["0000"]
    assert waiting[0].system_attrs["fixed_params"] == study.trials[0].params


def test_reconcile_leaves_a_proposal_that_never_ran(tmp_path):
    """An async search whose budget ran out while a proposal waited for its twin tells that
    proposal FAIL (search._run_tuner) without a row: --resume must not run it in the budget slot
    of a trial Ray lost (a red-team saw the lost recipe never run again, and '1 interrupted')."""
    from layerswap.search.reconcile import NEVER_RAN, requeue_lost

    s, store, storage = _searcher(tmp_path)
    s.suggest("a")
    s.on_trial_complete("a", None, error=True)  # lost to Ray: a row, re-run on --resume
    study = optuna.load_study(study_name="s", storage=storage)
    never = study.ask()
    never.set_user_attr(NEVER_RAN, True)  # as _run_tuner marks the waiting proposal
    study.tell(never, state=optuna.trial.TrialState.FAIL)
    store = TrialStore(store.path)
    assert [r["status"] for r in store.rows] == ["lost"]
    assert reconcile(study, store) == 0 and requeue_lost(study, store) == 1
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert [t.user_attrs["rerun_of"] for t in waiting] == ["0000"]


KILLED = """
import os, signal
import layerswap.search.searcher as searcher
from tests.search.test_search_crash import _drive_forever
searcher.tell = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # rows written, none told
_drive_forever({folder!r})
"""


def _drive_forever(folder: str) -> None:
    """The SIGKILL test's process: runs the search in `folder` until it is killed."""
    store = TrialStore(Path(folder) / "trials.parquet")
    _drive(_driver(Path(folder), store), store, 0, forever=True)


@pytest.mark.slow
def test_a_search_sigkilled_between_its_rows_and_optuna_resumes_into_the_same_trials(tmp_path, cut, whole):  # fmt: skip
    recipes, _ = whole
    folder = tmp_path / "killed"
    folder.mkdir()
    root = Path(__file__).resolve().parents[2]
    code = KILLED.format(folder=str(folder))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [r["trial_id"] for r in TrialStore(folder / "trials.parquet").rows] == ["0000", "0001"]
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{folder / 'study.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING] * 2  # none told
    store = TrialStore(folder / "trials.parquet")  # resumed here, as `search --resume` would
    _drive(_driver(folder, store), store, 100)
    assert [r["recipe_id"] for r in TrialStore(folder / "trials.parquet").rows] == recipes
