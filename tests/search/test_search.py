"""The merge search end to end on the tiny world: Ray Tune + Optuna, failures, repeats, resume, promotion.

Run: .venv/bin/python -m pytest -q tests/search/test_search.py   (slow: Ray starts per test)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from search_fixtures import experiment, make_experts

from layerswap.trainables.atomic import read_parquet
from tests.conftest import ray_pids

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def world_and_experts(tmp_path_factory):
    from layerswap.world import build_world

    world = build_world(tmp_path_factory.getbasetemp() / "tiny_world", size="tiny", progress=False)
    paths = make_experts(world, tmp_path_factory.mktemp("search") / "experts", nan_expert=True)
    return world, paths


def _rows(run: Path) -> list[dict]:
    return read_parquet(run / "search" / "trials.parquet").to_pylist()


@pytest.mark.slow
def test_search_end_to_end_with_failures_repeats_and_promotion(
    world_and_experts, tmp_path, ray_session
):
    from layerswap.search.promote import promote
    from layerswap.search.search import run_search

    world, paths = world_and_experts
    point = {
        "language_expert": "1",
        "bottom": 2,
        "top": 0,
        "bottom_transition": 0,
        "weights": "uniform",
    }
    exp = experiment(
        world,
        paths,
        # expert "0" has a NaN tensor in layer 0: the warm start (b>=1) must fail, the rest go on
        language_experts=[str(paths["nan_lang"]), str(paths["language"])],
        search={"num_samples": 6, "points_to_evaluate": [point, point]},
        promote={
            "top_k": 1,
            "limit": 2,
            "max_gen_toks": 4,
            "baselines": ["base", "paper_default"],
        },
    )
    run = tmp_path / "run"
    res = run_search(exp, run, progress=False)
    rows = _rows(run)
    assert res.n_trials == len(rows) == 6
    assert len({r["trial_id"] for r in rows}) == 6
    by_id = {r["trial_id"]: r for r in rows}
    assert by_id["0000"]["status"] == "failed" and "non-finite" in by_id["0000"]["error"]
    first, second = by_id["0001"], by_id["0002"]
    assert first["recipe_id"] == second["recipe_id"] and first["status"] == "ok"
    assert second["status"] == "duplicate" and second["t_eval_s"] == 0.0
    assert second["objective"] == first["objective"] and "served from trial 0001" in second["error"]
    evaluated = [r["recipe_id"] for r in rows if r["status"] != "duplicate"]
    assert len(evaluated) == len(set(evaluated)), "a recipe was evaluated twice"
    for r in rows:
        assert r["status"] in ("ok", "failed", "duplicate", "pruned")
        if r["status"] == "ok":
            assert r["fidelity"] == 8 and 0 <= r["proxy__world_belebele_brier_xa_dev"] <= 2
            # Both stages timed. Not their order: with the Brier-scored proxy (log-likelihoods
            # only) a tiny world's eval of 8 items takes as long as composing (24 ms each, seen).
            assert r["t_compose_s"] > 0 and r["t_eval_s"] > 0
    # the proxy stage read dev splits only: never the target's (or any) test split
    assert res.splits_read and all(t.endswith("_dev") and s == "dev" for t, s in res.splits_read)
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{run / 'search' / 'study.db'}")
    states = {t.number: t.state for t in study.trials}
    assert states[0] == optuna.trial.TrialState.FAIL
    assert states[1] == states[2] == optuna.trial.TrialState.COMPLETE
    assert len(study.trials) == 6

    board = promote(exp, run, progress=False)
    got = read_parquet(board.results_path).to_pylist()
    models = {r["model"] for r in got}
    # paper_default over each pair (baseline_pairs: all): the one with language expert 1 (the
    # NaN one) is reported failed, the other is scored, and promotion goes on
    assert "base" in models and "paper_default_t1_l1" not in models
    assert "paper_default_t1_l2" in models
    assert any(m.startswith("candidate_") for m in models)
    assert {"world_mgsm_direct_xa", "world_belebele_brier_xa", "world_belebele_brier_xa_dev"} <= {
        r["task"] for r in got
    }
    assert all(Path(r["raw_json"]).is_file() for r in got)
    text = board.leaderboard.read_text()
    assert "paper_default_t1_l1 (failed)" in text and "(best)" in text
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(board.best_dir)
    assert (board.best_dir / "layerswap_recipe.yaml").is_file()


DRIVER = """
import sys, ray
sys.path.insert(0, {here!r})
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.search.search import run_search
ray.init(num_cpus=2, _temp_dir={tmp!r}, include_dashboard=False, log_to_driver=False)
exp = SearchExperiment.model_validate_json(open({exp!r}).read())
run_search(exp, {run!r}, resume={resume}, progress=True)
ray.shutdown()
"""


def _driver(tmp: Path, exp_file: Path, run: Path, resume: bool, ray_tmp: str) -> subprocess.Popen:
    code = DRIVER.format(
        here=str(HERE), tmp=ray_tmp, exp=str(exp_file), run=str(run), resume=resume
    )
    log = open(tmp / f"driver-{int(resume)}.log", "w")
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _kill_started_under(ray_tmp: str) -> None:
    """SIGKILL, by pid, the Ray processes this test started (conftest.ray_pids)."""
    for pid in ray_pids(ray_tmp):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.slow
def test_a_search_whose_every_trial_failed_fails_before_promotion(
    world_and_experts, tmp_path, ray_session
):
    """Every recipe takes the NaN expert's layer 0: each trial fails on its own. The search
    ended 'finished' with exit 0 and promoted the baselines alone, and a study's --continue then
    skipped it for good (a red-team reproduced it); now it ends unfinished (exit 1), the table
    kept, naming the error."""
    from layerswap.cli import main

    world, paths = world_and_experts
    exp = experiment(
        world,
        paths,
        language_experts=[str(paths["nan_lang"])],
        space={"bottom": {"low": 1, "high": 2}},
        search={"num_samples": 2, "fidelity": {"screen": None}},
    )
    f = tmp_path / "search.yaml"
    f.write_text(exp.model_dump_json())
    run = tmp_path / "run"
    assert main(["search", str(f), "--out", str(run)]) == 1
    rows = _rows(run)
    assert [r["status"] for r in rows] == ["failed", "failed"]
    assert not (run / "search" / "finished.json").exists()
    assert not (run / "promotion").exists() and not (run / "leaderboard.md").exists()


@pytest.mark.slow
def test_killed_driver_resumes_without_losing_or_repeating(world_and_experts, tmp_path):
    import tempfile

    world, paths = world_and_experts
    exp = experiment(world, paths, search={"num_samples": 7, "fidelity": {"screen": None}})
    exp_file = tmp_path / "exp.json"
    exp_file.write_text(exp.model_dump_json())
    run = tmp_path / "run"
    ray_tmp = tempfile.mkdtemp(prefix="lsk", dir="/tmp")
    proc = _driver(tmp_path, exp_file, run, False, ray_tmp)
    table = run / "search" / "trials.parquet"
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            if table.exists() and len(read_parquet(table)) >= 2:
                break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver (and what it started in its group)
        _kill_started_under(ray_tmp)  # Ray's processes: a session of their own
        proc.wait()
    before = read_parquet(table).to_pylist()
    assert 2 <= len(before) < 7, (tmp_path / "driver-0.log").read_text()[-3000:]

    ray_tmp2 = tempfile.mkdtemp(prefix="lsr", dir="/tmp")
    proc = _driver(tmp_path, exp_file, run, True, ray_tmp2)
    try:
        assert proc.wait(timeout=180) == 0, (tmp_path / "driver-1.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _kill_started_under(ray_tmp2)
        for d in (ray_tmp, ray_tmp2):
            shutil.rmtree(d, ignore_errors=True)
    after = read_parquet(table).to_pylist()
    ids = [r["trial_id"] for r in after]
    assert len(after) == 7 and len(set(ids)) == 7
    assert after[: len(before)] == before  # finished trials kept as they were
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{run / 'search' / 'study.db'}")
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    finished = {f"{t.number:04d}" for t in study.trials if t.state != optuna.trial.TrialState.FAIL}
    assert finished <= set(ids)
    assert json.loads((run / "search" / "splits_read.json").read_text())


def test_default_proxies_are_saved_spelled_out_and_resuming_other_proxies_is_refused(tmp_path):
    """No Ray: the search's own checks. A search saved before the world default changed (its
    experiment.json left the proxies implicit) must not continue under the new objective."""
    from layerswap.search.results import TrialStore
    from layerswap.search.search_dir import check_search_dir, search_identity
    from layerswap.spaces.search_experiment import SearchExperiment
    from layerswap.trainables.outputs import OutputError, write_marker

    exp = SearchExperiment(language="xa", base="b", task_experts=["m"], language_experts=["l"])
    assert exp.proxies is None and exp.explicit().proxies == exp.proxy_list
    assert search_identity(exp.explicit()) == search_identity(exp)
    sdir = tmp_path / "search"
    store = TrialStore(sdir / "trials.parquet")
    store.append({"trial_id": "0000", "status": "ok", "objective": 0.9,
                  "proxy__world_belebele_xa_dev": 0.9, "proxy__world_mgsm_direct_en_dev": 0.8})  # fmt: skip
    (sdir / "experiment.json").write_text(exp.model_dump_json())  # implicit, as before
    write_marker(sdir, "search", search_identity(exp))
    with pytest.raises(OutputError, match=r"scored on \['world_belebele_xa_dev', 'world_mgsm"):
        check_search_dir(exp, sdir, TrialStore(sdir / "trials.parquet"), sdir / "db", True)
    assert TrialStore(sdir / "trials.parquet").rows[0]["objective"] == 0.9  # untouched
