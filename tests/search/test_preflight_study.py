"""--resume refuses a missing, damaged or mismatched study, or a damaged table, in one line, before
Ray starts and writing nothing (search/preflight_study.py, search.search_dir.check_search_dir).

Run: .venv/bin/python -m pytest -q tests/search/test_preflight_study.py
"""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from layerswap.search.results import TrialStore
from layerswap.search.search_dir import check_search_dir, search_identity
from layerswap.spaces.search_experiment import Proxy
from layerswap.trainables.outputs import OutputError, write_marker
from tests.search.test_searcher import _ok, _searcher


@pytest.fixture
def searched(tmp_path):
    """A search folder after 4 trials (table and study agree); returns (exp, folder)."""
    sdir = tmp_path / "search"
    sdir.mkdir()
    s, _, _ = _searcher(sdir, space_high=6)
    write_marker(sdir, "search", search_identity(s.exp))  # as run_search marks it
    for i in range(4):
        s.suggest(f"t{i}")
        s.on_trial_complete(f"t{i}", _ok(0.1 * i))
    return s.exp.model_copy(update={"proxies": [Proxy(task="a_dev")]}), sdir  # as _ok scores


def _check(exp, sdir):
    """What run_search checks first on --resume: the table loads, then the folder's checks."""
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sdir.iterdir()}
    try:
        store = TrialStore(sdir / "trials.parquet")
        check_search_dir(exp, sdir, store, sdir / "study.db", resume=True)
    finally:  # reads only, whatever it finds
        assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sdir.iterdir()} == before


def test_an_intact_study_resumes(searched):
    _check(*searched)


def _finished(db):
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT number, state FROM trials ORDER BY number").fetchall()
    finally:
        con.close()


def test_a_study_left_mid_write_by_a_killed_driver_resumes(searched, kill_mid_commit):
    """As the demo's driver SIGKILLed mid-search leaves it (CI saw 'attempt to write a readonly
    database'): the hot journal is rolled back and the last committed study resumes."""
    exp, sdir = searched
    db = sdir / "study.db"
    committed = _finished(db)
    kill_mid_commit(db)
    store = TrialStore(sdir / "trials.parquet")
    check_search_dir(exp, sdir, store, db, resume=True)
    assert not (sdir / "study.db-journal").exists()
    assert _finished(db) == committed and {s for _, s in committed} == {"COMPLETE"}


def test_a_missing_study_is_refused_naming_it(searched):
    exp, sdir = searched
    (sdir / "study.db").unlink()
    with pytest.raises(OutputError, match=rf"--resume: {sdir / 'study.db'}: missing, while .*trials.parquet holds 4 trial\(s\); restore it, or start the search over with --overwrite"):  # fmt: skip
        _check(exp, sdir)


def test_a_damaged_study_is_refused_naming_it(searched):
    exp, sdir = searched
    os.truncate(sdir / "study.db", 8192)  # as the red-team did: a copy cut short
    with pytest.raises(OutputError, match=rf"--resume: {sdir / 'study.db'}: (damaged|not a readable Optuna study)"):  # fmt: skip
        _check(exp, sdir)


def test_another_studys_file_is_refused(searched, tmp_path):
    exp, sdir = searched
    other = tmp_path / "other"
    other.mkdir()
    s, _, _ = _searcher(other, space_high=6)  # the same name, 1 trial: 0001-0003 are not in it
    s.suggest("x")
    s.on_trial_complete("x", _ok(0.3))
    shutil.copy(other / "study.db", sdir / "study.db")
    with pytest.raises(OutputError, match=r"study.db: lacks trial\(s\) 0001, 0002, 0003 of "):
        _check(exp, sdir)


def test_a_table_missing_finished_trials_is_refused(searched):
    exp, sdir = searched
    store = TrialStore(sdir / "trials.parquet")
    store.rows = store.rows[:2]
    store.append({**store.rows.pop(), "trial_id": "0001"})  # rewrite it with rows 0000-0001
    with pytest.raises(OutputError, match=r"trials.parquet: lacks trial\(s\) 0002, 0003 the study"):  # fmt: skip
        _check(exp, sdir)


def test_a_damaged_table_names_its_file(searched):
    exp, sdir = searched
    os.truncate(sdir / "trials.parquet", 300)
    with pytest.raises(ValueError, match=rf"{sdir / 'trials.parquet'}: not a readable trial table"):  # fmt: skip
        _check(exp, sdir)
