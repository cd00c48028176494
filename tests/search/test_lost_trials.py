"""Trials Ray lost (actor or node died, retries spent) vs a trial's own errors: rows, budget, resume.

Run: .venv/bin/python -m pytest -q tests/search/test_lost_trials.py
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from ray.exceptions import ActorDiedError, RayTaskError

from layerswap.cli import main
from layerswap.search.optuna_tune import ErrorNotes, trial_error
from layerswap.search.reconcile import requeue_lost
from layerswap.search.results import LOST, MAX_LOSSES, TWIN_LOST, TrialStore, params_of
from layerswap.search.tune_trial import META
from layerswap.trainables.outputs import write_marker
from layerswap.trainables.ray_session import cluster_line
from tests.search.search_fixtures import experiment, make_experts
from tests.search.test_searcher import POINT, _ok, _searcher

S = optuna.trial.TrialState


def _own(exc: Exception) -> RayTaskError:
    """What Tune hands over when the trial's own code raised `exc`."""
    return RayTaskError("merge_trial", "Traceback ...", exc).as_instanceof_cause()


def test_a_trial_ray_lost_is_neither_failed_nor_served_nor_counted_and_is_requeued(tmp_path):
    s, store, _ = _searcher(tmp_path, points=[POINT, POINT, POINT])
    s.suggest("a")
    s.note_error("a", ActorDiedError())
    s.on_trial_complete("a", None, error=True)
    row = TrialStore(store.path).rows[0]
    assert row["status"] == LOST and row["error"].startswith("ActorDiedError: The actor died")
    # the same recipe again: run, not served from the lost row
    c = s.suggest("b")
    assert c is not None and c[META]["served"] is None
    s.note_error("b", _own(ValueError("boom")))  # the trial's own exception: a failed row
    s.on_trial_complete("b", None, error=True)
    c = s.suggest("c")
    assert c[META]["served"]["trial_id"] == "0001"  # a failed recipe is served, as before
    s.on_trial_complete("c", {**c[META]["served"], "status": "duplicate", "served_from": "0001", "source_status": "failed"})  # fmt: skip
    store = TrialStore(store.path)
    assert [r["status"] for r in store.rows] == [LOST, "failed", "duplicate"]
    assert store.rows[1]["error"] == "ValueError: boom"
    assert store.spent() == 2 and [r["trial_id"] for r in store.lost()] == ["0000"]
    assert [t.state for t in s.study.trials] == [S.FAIL, S.FAIL, S.FAIL]  # TPE learns nothing
    # --resume queues the lost recipe once, whatever how often it resumes
    assert requeue_lost(s.study, store) == 1 and requeue_lost(s.study, store) == 0
    waiting = s.study.get_trials(states=(S.WAITING,))
    assert [t.user_attrs["rerun_of"] for t in waiting] == ["0000"]
    assert waiting[0].system_attrs["fixed_params"] == params_of(store.rows[0])
    s.suggest("d")  # the queued trial is the next one asked
    s.on_trial_complete("d", _ok(0.5))
    assert TrialStore(store.path).rows[-1]["params"] == store.rows[0]["params"]


def test_a_recipe_lost_again_and_again_is_failed_not_requeued_forever(tmp_path):
    """A loss that recurs (an OOM kill of a merge that never fits) was re-queued by every
    --resume, so the search never finished (red-team of today's changes)."""
    s, store, _ = _searcher(tmp_path, points=[POINT] * MAX_LOSSES)
    for tid in "abc"[:MAX_LOSSES]:
        s.suggest(tid)
        s.note_error(tid, ActorDiedError())
        s.on_trial_complete(tid, None, error=True)
        requeue_lost(s.study, TrialStore(store.path))  # what each --resume does
    rows = TrialStore(store.path).rows
    assert [r["status"] for r in rows] == [LOST] * (MAX_LOSSES - 1) + ["failed"]
    assert rows[-1]["error"].startswith(f"lost to Ray {MAX_LOSSES} times, so failed")
    assert requeue_lost(s.study, TrialStore(store.path)) == 0


def test_a_twin_lost_with_its_source_is_no_loss_of_its_own(tmp_path):
    """Three copies of a recipe in one batch and one node loss made three LOST rows; counted
    all, the recipe was failed for good after one real loss (a review found it)."""
    store = TrialStore(tmp_path / "trials.parquet")
    store.rows = [
        {"status": LOST, "recipe_id": "r", "error": "ActorDiedError: ..."},
        {"status": LOST, "recipe_id": "r", "error": TWIN_LOST},
        {"status": LOST, "recipe_id": "r", "error": TWIN_LOST},
        {"status": LOST, "recipe_id": "q", "error": "ActorDiedError: ..."},
    ]
    assert store.losses("r") == 1 and store.losses("q") == 1


def test_a_trial_that_never_reported_or_whose_twin_was_lost_is_lost(tmp_path):
    s, store, _ = _searcher(tmp_path, points=[POINT, POINT])
    s.plan_batches(2, 2)
    s.suggest("a")
    b = s.suggest("b")  # the same recipe in the batch: served from "a" when the batch is told
    s.on_trial_complete("b", {**b[META]["served"], "objective": math.nan})
    s.on_trial_complete("a")  # stopped before it ran (no result, no error)
    rows = TrialStore(store.path).rows
    assert [(r["status"], r["error"]) for r in rows] == [
        (LOST, "Ray ended the trial before it reported (see the Ray logs)"),
        (LOST, "its twin trial was lost"),
    ]


@pytest.mark.parametrize(
    ("exc", "own", "text"),
    [
        (None, False, "Ray ended the trial before it reported"),
        (ActorDiedError(), False, "ActorDiedError: The actor died"),
        (_own(OSError("disk")), True, "OSError: disk"),
        (_own(ActorDiedError()), False, "RayTaskError(ActorDiedError)"),  # Ray's, inside it
    ],
)
def test_trial_error_tells_the_trials_own_error_from_rays(exc, own, text):
    got_own, got_text = trial_error(exc)
    assert got_own == own and got_text.startswith(text)


@pytest.mark.slow
def test_tune_notes_the_error_before_it_tells_the_searcher(ray_session, tmp_path):
    """The ray 2.60 order ErrorNotes relies on: scheduler.on_trial_error, then the searcher's
    on_trial_complete(error=True), with the error readable from the trial."""
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    seen: list = []

    def dies(config):  # defined here: Ray pickles it by value (its workers cannot import tests)
        if config["kind"] == "die":
            os._exit(1)  # the process ends under Ray: not the trial's doing
        raise ValueError("own")

    class Probe(BasicVariantGenerator):
        def on_trial_complete(self, trial_id, result=None, error=False):
            seen.append(("complete", trial_id, error))

    def note(trial_id, exc):
        seen.append(("note", trial_id, trial_error(exc)))

    tuner = tune.Tuner(
        dies,
        param_space={"kind": tune.grid_search(["die", "raise"])},
        tune_config=tune.TuneConfig(search_alg=Probe(), scheduler=ErrorNotes(note)),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    assert cluster_line().startswith("Ray: started a local cluster at ")  # what a search prints
    tuner.fit()
    notes = [e for e in seen if e[0] == "note"]
    assert len(notes) == 2, seen
    for note_, complete in zip(seen[::2], seen[1::2], strict=True):
        assert note_[0] == "note" and complete == ("complete", note_[1], True), seen
    verdicts = sorted(n[2][0] for n in notes)
    assert verdicts == [False, True], seen  # the dead process is Ray's, the ValueError its own


@pytest.fixture
def search_yaml(tiny_world, tmp_path) -> Path:
    exp = experiment(tiny_world, make_experts(tiny_world, tmp_path / "pair"))
    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    return f


def test_a_search_with_lost_trials_is_not_finished(search_yaml, tmp_path, monkeypatch, capsys):
    """`layerswap search --continue` ends a search short of lost trials with exit 1 and a line
    naming them; it is not recorded finished, so the next --continue resumes it."""
    from layerswap.search import promote as promote_mod
    from layerswap.search import search as search_mod

    calls: list = []

    def run_search(exp, run_dir, resume=False, **kw):
        calls.append("search")
        (Path(run_dir) / "search").mkdir(parents=True, exist_ok=True)
        write_marker(Path(run_dir) / "search", "search", "a stub's")
        return SimpleNamespace(n_trials=6, trials_path="T", study_path="S", lost=2 if len(calls) == 1 else 0)  # fmt: skip

    monkeypatch.setattr(search_mod, "run_search", run_search)
    monkeypatch.setattr(promote_mod, "promote", lambda *a, **k: SimpleNamespace(leaderboard="L", best_dir="B"))  # fmt: skip
    argv = ["search", str(search_yaml), "--out", str(tmp_path / "run"), "--continue", "--no-promote"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("layerswap: failed: search: 2 trial(s) lost to Ray") and "--resume" in err
    assert not (tmp_path / "run" / "search" / "finished.json").exists()
    assert main(argv) == 0 and calls == ["search", "search"]  # resumed, then finished
    assert main(argv) == 0 and calls == ["search", "search"]  # skipped
