"""benchmarks/bench_search.py run as a new user runs it, at a tiny size: from a fresh working
directory with relative paths (once read by Ray's workers as Hub repo ids, failing every trial
while the script printed a speed-up of 3276x from 0 recipes and exited 0), and a failing run
exits 1 saying what failed, with no figures.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_bench_search.py   (slow: ~1 min)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_search


def _links(world: Path, experts: dict, *roles: str) -> dict:
    return {"world": world, **{f"experts/{r}": experts[r] for r in roles}}


@pytest.mark.slow
def test_the_race_runs_with_relative_expert_paths_through_rays_workers(tiny_world, tiny_experts, run_bench):  # fmt: skip
    run = run_bench(
        "bench_search.py", "--world", "world", "--experts", "experts/task", "experts/language",
        "--space", "demo", "--recipes", "2", "--seeds", "1", "--out", "out/search.json",
        links=_links(tiny_world, tiny_experts, "task", "language"),
    )  # fmt: skip
    report = json.loads((run.cwd / "out" / "search.json").read_text())
    a = report["a_throughput"]
    assert a["recipes"] == 2, run.tail()  # both recipes evaluated inside Ray's workers
    assert a["search_trial_seconds"] > 0 and a["loop_seconds"] > 0 and a["speedup_per_trial"] > 0
    assert 0 < report["b_compose_share"]["search_trials"] < 1
    assert report["grid_size"] == len(report["grid_table"]) > 0
    assert report["c_search_efficiency"]["tpe"]["found"].endswith("/1")


def test_a_failing_trial_exits_1_naming_it_and_reports_no_figures(tiny_world, tiny_experts, run_bench):  # fmt: skip
    run = run_bench(
        "bench_search.py", "--world", "world", "--experts", "experts/task", "experts/nan_lang",
        "--space", "demo", "--only-c", "--seeds", "1", "--out", "search.json", expect=1,
        links=_links(tiny_world, tiny_experts, "task", "nan_lang"),
    )  # fmt: skip
    assert "FAILED" in run.stderr and "non-finite" in run.stderr, run.tail()
    assert not (run.cwd / "search.json").exists()
    assert "speedup" not in run.stdout


def test_shape_trials_run_at_a_tiny_shape(tiny_world, run_bench):
    run = run_bench(
        "bench_search.py", "--shape", "llama-tiny", "--world", "world", "--trials", "1",
        "--limit", "2", links={"world": tiny_world},
    )  # fmt: skip
    trials = [line for line in run.stdout.splitlines() if line.startswith("trial: ")]
    assert len(trials) == 2, run.tail()  # the paper default, then one recipe of the grid
    assert "later trials median" in run.stdout


def test_relative_paths_are_made_absolute_and_missing_ones_refused(tiny_world, tiny_experts, tmp_path, monkeypatch, capsys):  # fmt: skip
    monkeypatch.chdir(tiny_experts["task"].parent)
    args = bench_search.parse_args(["--world", str(tiny_world), "--experts", "task", "language", "--out", "o.json"])  # fmt: skip
    assert args.experts == [tiny_experts["task"].resolve(), tiny_experts["language"].resolve()]
    assert args.out == (tiny_experts["task"].parent / "o.json").resolve()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        bench_search.parse_args(["--world", "nowhere", "--grid-from", "x.json"])
    assert exit_.value.code == 2 and "--world nowhere" in capsys.readouterr().err
