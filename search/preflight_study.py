"""Before a --resume starts Ray: the saved study (RUN/search/study.db) opens and matches the table.

`study_problem(db, name, store)` reads the SQLite file with sqlite3, not Optuna (whose RDBStorage
would create or migrate tables); search.search_dir.check_search_dir refuses with its line. Tests:
.venv/bin/python -m pytest -q tests/search/test_preflight_study.py
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from layerswap.search.results import TrialStore

# Optuna writes a trial's row before it tells the study (searcher._record), so a study trial told
# COMPLETE or PRUNED always has one; FAIL/RUNNING/WAITING ones may not (interrupted, re-queued).
_TOLD_WITH_A_ROW = ("COMPLETE", "PRUNED")
_FIX = "restore it, or start the search over with --overwrite"
# mode=rw, not ro: a driver killed mid-write leaves a hot journal (study.db-journal), which SQLite
# must roll back before anyone reads, and a read-only connection cannot ("attempt to write a
# readonly database"). The rollback restores the last committed study, as Optuna's own open
# would; rw never creates the file.
_OPEN = "mode=rw"


def study_problem(db: Path, name: str, store: TrialStore) -> str | None:
    """Why `db` cannot resume the search whose table is `store`, or None.

    Refused: no study file while the table holds trials (the numbering would restart at 0 and
    collide with the table's), a file SQLite cannot read whole, no study `name` in it while the
    table holds trials, a table trial the study does not hold, or a study trial told finished
    that the table lacks (a replaced or emptied table).

    Args:
        db: RUN/search/study.db.
        name: the study's name (the experiment's).
        store: the trial table as loaded.
    Returns:
        one line naming the file and what is wrong, or None.
    """
    rows = {r["trial_id"] for r in store.rows}
    if not db.exists():
        return f"{db}: missing, while {store.path} holds {len(rows)} trial(s); {_FIX}" if rows else None  # fmt: skip
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?{_OPEN}", uri=True)
        try:
            check = con.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                return f"{db}: damaged ({check}); {_FIX}"
            trials = con.execute(
                "SELECT t.number, t.state FROM trials t JOIN studies s USING (study_id) "
                "WHERE s.study_name = ?",
                (name,),
            ).fetchall()
            studies = con.execute("SELECT count(*) FROM studies WHERE study_name = ?", (name,))
            has_study = studies.fetchone()[0] > 0
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"{db}: not a readable Optuna study ({e}); {_FIX}"
    if not has_study:
        return f"{db}: holds no study {name!r}, while {store.path} holds {len(rows)} trial(s); {_FIX}" if rows else None  # fmt: skip
    numbers = {f"{n:04d}" for n, _ in trials}
    if missing := sorted(rows - numbers):
        return f"{db}: lacks trial(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} of {store.path}; {_FIX}"  # fmt: skip
    told = {f"{n:04d}" for n, state in trials if state in _TOLD_WITH_A_ROW}
    if extra := sorted(told - rows):
        return f"{store.path}: lacks trial(s) {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''} the study {db} holds as finished; {_FIX}"  # fmt: skip
    return None
