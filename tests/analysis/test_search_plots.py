"""The search section's parameter importances (analysis/search_plots.py) read search/study.db
as the search left it, killed mid-commit included, without writing into the run; its progress
figure counts the pruned trials the search ran.

Run: .venv/bin/python -m pytest -q tests/analysis/test_search_plots.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from layerswap.analysis import search_plots
from layerswap.analysis.load import load_run
from layerswap.analysis.search_plots import _importances
from layerswap.analysis.sections import Figure, Section
from tests.analysis.analysis_synth import make_run


def _section(db) -> list:
    sec = Section("search", "search")
    _importances(sec, db)
    return [b if isinstance(b, str) else b.caption for b in sec.blocks]


def test_importances_of_a_study_left_mid_commit_are_those_of_its_last_commit(
    tmp_path, kill_mid_commit
):
    db = make_run(tmp_path) / "search" / "study.db"
    committed = _section(db)
    assert committed and "complete trials" in committed[0], committed
    kill_mid_commit(db)
    journal = db.with_name("study.db-journal")
    before = (db.read_bytes(), journal.read_bytes())
    assert _section(db) == committed  # not "0 complete trials", nor "not computable"
    assert (db.read_bytes(), journal.read_bytes()) == before  # the run is left as it was


def test_progress_counts_pruned_trials_and_says_what_it_leaves_out(tmp_path, monkeypatch):
    """16 trials as the demo ran them (ok and pruned interleaved) plus a failed and a duplicate
    one: the progress figure's x axis counts the 16 that ran, the best at its place (13th, not
    6th among the scored), pruned ones marked; the texts say what each figure leaves out."""
    status = ["ok"] * 4 + ["pruned", "ok"] + ["pruned"] * 6 + ["ok"] + ["pruned"] * 3
    status += ["failed", "duplicate"]
    obj = [0.1, 0.3, 0.2, 0.1, None, 0.25] + [None] * 6 + [0.5] + [None] * 3 + [None, 0.3]
    trials = pd.DataFrame({"trial_id": [f"{i:04d}" for i in range(18)], "status": status,
                           "objective": obj, "finished_at": [f"2026-01-01T00:00:{i:02d}" for i in range(18)]})  # fmt: skip
    (tmp_path / "search").mkdir()
    trials.to_parquet(tmp_path / "search" / "trials.parquet")
    seen = {}
    real = search_plots.best_so_far
    monkeypatch.setattr(search_plots, "best_so_far", lambda o, **kw: seen.update(o=o, **kw) or real(o, **kw))  # fmt: skip
    sec = search_plots.search_section(load_run(tmp_path))
    assert len(seen["o"]) == 16 and np.nanargmax(seen["o"]) + 1 == 13
    assert seen["pruned"].tolist() == [s == "pruned" for s in status[:16]]
    fig = next(b for b in sec.blocks if isinstance(b, Figure) and b.name == "search_progress")
    assert fig.caption.startswith("Objective of 16 trials (6 scored, 10 pruned: marked"), (
        fig.caption
    )
    text = next(b for b in sec.blocks if isinstance(b, str) and b.startswith("18 trials"))
    assert "pruned ones marked" in text and "duplicate, failed trials are left out of all" in text
