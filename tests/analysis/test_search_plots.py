"""The search section's parameter importances (analysis/search_plots.py) read search/study.db
as the search left it, killed mid-commit included, without writing into the run.

Run: .venv/bin/python -m pytest -q tests/analysis/test_search_plots.py
"""

from __future__ import annotations

from layerswap.analysis.search_plots import _importances
from layerswap.analysis.sections import Section
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
