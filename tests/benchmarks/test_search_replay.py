"""benchmarks/search_replay.py at a tiny size: every policy and mode reported, a search without
early stopping pays whole trials only, and a replay from saved items repeats itself exactly.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_search_replay.py   (slow: ~40 s)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import search_replay


@pytest.mark.slow
def test_replay_reports_every_policy_and_repeats_from_saved_items(tiny_world, tmp_path):
    out = tmp_path / "replay.json"
    args = ["--world", str(tiny_world), "--seeds", "2", "--budget", "0.75"]
    assert search_replay.main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    names = {f"{p}/{m}" for p, _, _ in search_replay.POLICIES for m, _, _ in search_replay.MODES}
    assert set(report["results"]) == names
    per = report["items_per_full_trial"]
    assert per > 0 and len(report["items"]) == report["grid_size"]
    for key, r in report["results"].items():
        assert r["hit_rate"].endswith("/2")
        if key.split("/")[0] in ("random", "tpe"):  # no early stop: whole trials or served repeats
            assert all(n % per == 0 for n in r["items_in_all"]), key
        for n in r["items_to_top5"]:
            assert n is None or n > 0
    again = tmp_path / "again.json"
    assert search_replay.main([*args, "--items-from", str(out), "--out", str(again)]) == 0
    assert json.loads(again.read_text())["results"] == report["results"]
