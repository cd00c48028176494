"""benchmarks/world_sweep.py as a new user runs it, at the tiny size: a variant built and probed
(the probe given experts by paths relative to the working directory, which its subprocess once
read from the repository instead), the summary written; a sweep whose runs fail exits 1.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_world_sweep.py   (slow: ~30 s)
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_a_variant_is_built_probed_and_summarised(tiny_experts, tmp_path, run_bench):
    variant = tmp_path / "v.yaml"
    variant.write_text("belebele_dev: 20\n")  # the tiny preset's own value: a variant of nothing
    run = run_bench(
        "world_sweep.py", "v.yaml", "--out", "sweep", "--size", "tiny", "--jobs", "1", "--",
        "--experts", "experts/task", "experts/language", "--resamples", "20",
        links={"v.yaml": variant, "experts/task": tiny_experts["task"], "experts/language": tiny_experts["language"]},
    )  # fmt: skip
    sweep = run.cwd / "sweep"
    probe = json.loads((sweep / "v-s0.json").read_text())
    assert [r["name"] for r in probe["table"]][:3] == ["base", "math", "language"]
    summary = (sweep / "summary.md").read_text()
    row = next(line for line in summary.splitlines() if line.startswith("| v-s0 |"))
    assert "failed" not in row and len(row.split("|")) == 12, summary
    assert "experts/task" in summary  # the probe's arguments, as given


def test_a_sweep_whose_runs_fail_exits_1_naming_them(tmp_path, run_bench):
    bad = tmp_path / "bad.yaml"
    bad.write_text("no_such_field: 1\n")
    run = run_bench("world_sweep.py", "bad.yaml", "--out", "sweep", "--size", "tiny", "--jobs", "1", expect=1, links={"bad.yaml": bad})  # fmt: skip
    assert "1 of 1 runs failed" in run.stderr and "bad-s0: build failed" in run.stderr, run.tail()
    assert "build failed" in (run.cwd / "sweep" / "summary.md").read_text()
