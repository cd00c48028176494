"""The search section's parameter importances (analysis/search_plots.py) read search/study.db
as the search left it, killed mid-commit included, without writing into the run.

Run: .venv/bin/python -m pytest -q tests/analysis/test_search_plots.py
"""

from __future__ import annotations

import signal
import subprocess
import sys

from layerswap.analysis.search_plots import _importances
from layerswap.analysis.sections import Section
from tests.analysis.analysis_synth import make_run

# A search SIGKILLed mid-commit: its uncommitted pages are in the file, the journal that undoes
# them beside it (with cache_size=1, the rows written after the update push its pages out).
_KILLED_MID_WRITE = """
import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size=1")
con.execute("BEGIN")
con.execute("UPDATE trials SET state = 'FAIL'")
con.execute("CREATE TABLE spill AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) SELECT i FROM n")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _section(db) -> list:
    sec = Section("search", "search")
    _importances(sec, db)
    return [b if isinstance(b, str) else b.caption for b in sec.blocks]


def test_importances_of_a_study_left_mid_commit_are_those_of_its_last_commit(tmp_path):
    db = make_run(tmp_path) / "search" / "study.db"
    committed = _section(db)
    assert committed and "complete trials" in committed[0], committed
    p = subprocess.run([sys.executable, "-c", _KILLED_MID_WRITE, str(db)], check=False)
    assert p.returncode == -signal.SIGKILL
    journal = db.with_name("study.db-journal")
    before = (db.read_bytes(), journal.read_bytes())
    assert _section(db) == committed  # not "0 complete trials", nor "not computable"
    assert (db.read_bytes(), journal.read_bytes()) == before  # the run is left as it was
