"""The searcher's bookkeeping without Ray: rows, repeats served or held, what Optuna is told, resume.

Run: .venv/bin/python -m pytest -q tests/search/test_searcher.py
"""

from __future__ import annotations

import json
import math

import optuna
import pytest

from layerswap.search.reconcile import reconcile
from layerswap.search.results import TrialStore
from layerswap.search.searcher import LayerswapSearch
from layerswap.search.tune_trial import META, flat_report, served_result
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool

S = optuna.trial.TrialState
POINT = {"bottom": 1, "top": 0, "bottom_transition": 0, "weights": "uniform"}


def _searcher(tmp_path, multi=False, points=None, progress=False, space_high=2, **search):
    exp = SearchExperiment.model_validate(
        {
            "name": "s",
            "language": "xa",
            "base": "/b",
            "task_experts": ["/t"],
            "language_experts": ["/l"],
            "space": {"bottom": {"low": 0, "high": space_high}, "top": {"low": 0, "high": 1}},
            "search": {"multi_objective": multi, **search},
        }
    )
    pool = ExpertPool.from_paths(["/t"], ["/l"], "/b")
    store = TrialStore(tmp_path / "trials.parquet")
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    metric = ["objective_0", "objective_1"] if multi else "objective"
    mode = ["max", "max"] if multi else "max"
    s = LayerswapSearch(
        exp=exp,
        pool=pool,
        depth=4,
        store=store,
        progress=progress,
        metric=metric,
        mode=mode,
        sampler=optuna.samplers.TPESampler(seed=0),
        storage=storage,
        study_name="s",
        points_to_evaluate=points,
    )
    return s, store, storage


def _ok(obj, **kw):
    return {"status": "ok", "objective": obj, "fidelity": 8, "proxy__a_dev": obj, "t_total_s": 1.0, **kw}  # fmt: skip


def test_repeat_waits_then_is_served_and_optuna_hears_the_truth(tmp_path):
    s, store, _ = _searcher(tmp_path, points=[POINT, POINT, POINT])
    c0 = s.suggest("a")
    assert c0[META]["served"] is None and c0[META]["gates"] == [None, None, None]  # halving
    assert s.suggest("b") is None  # same recipe running: held, not evaluated twice
    s.on_trial_complete("a", _ok(0.5))
    c1 = s.suggest("c")  # the held trial, now served from the table
    assert c1[META]["served"]["trial_id"] == "0000"
    s.on_trial_complete("c", {**c1[META]["served"], "status": "duplicate", "served_from": "0000", "source_status": "ok"})  # fmt: skip
    c2 = s.suggest("d")
    s.on_trial_complete("d", {"status": "pruned", "fidelity": 4, "rungs": [[4, 0.1]], "low_fidelity_objective": 0.1, "objective": math.nan, "proxy__a_dev": 0.1})  # fmt: skip
    c3 = s.suggest("e")
    s.on_trial_complete("e", {"status": "failed", "error": "ValueError: boom", "objective": math.nan})  # fmt: skip
    assert c2 is not None and c3 is not None
    rows = TrialStore(store.path).rows
    assert [r["status"] for r in rows] == ["ok", "duplicate", "pruned", "failed"]
    assert rows[1]["objective"] == 0.5 and rows[1]["recipe_id"] == rows[0]["recipe_id"]
    assert rows[2]["objective"] is None and rows[2]["proxy__a_dev"] == 0.1 and rows[2]["fidelity"] == 4  # fmt: skip
    states = [t.state for t in s.study.trials]
    assert states == [S.COMPLETE, S.COMPLETE, S.PRUNED, S.FAIL]
    assert s.study.trials[2].intermediate_values == {4: 0.1}  # never a COMPLETE value


def test_reject_threshold_is_the_kth_best_full_objective(tmp_path):
    s, store, _ = _searcher(tmp_path, fidelity={"policy": "screen", "screen": 0.25, "keep_top": 2})
    for i, v in enumerate([0.2, 0.6, 0.4]):
        s.suggest(f"t{i}")
        s.on_trial_complete(f"t{i}", _ok(v))
    assert store.kth_best(2) == 0.4
    cfg = s.suggest("t9")
    assert cfg[META]["gates"] == [0.4] or cfg[META]["served"] is not None


def test_reconcile_after_a_crash(tmp_path):
    s, store, storage = _searcher(tmp_path)
    s.suggest("a")
    s.suggest("b")
    s.on_trial_complete("a", _ok(0.3))
    # crash 1: row written, Optuna not told; crash 2: trial "b" still running
    s.suggest("c")
    row_c = s._row(s.meta["c"], _ok(0.7))
    store.append(row_c)
    study = optuna.load_study(study_name="s", storage=storage)
    assert reconcile(study, TrialStore(store.path)) == 1
    states = {t.number: t.state for t in study.trials}
    assert states[0] == S.COMPLETE and states[2] == S.COMPLETE and states[1] == S.FAIL
    assert study.trials[2].value == 0.7
    waiting = [t for t in study.trials if t.state == S.WAITING]
    assert len(waiting) == 1
    assert waiting[0].system_attrs["fixed_params"] == study.trials[1].params  # re-queued


def test_multi_objective_tells_every_proxy(tmp_path):
    s, _, _ = _searcher(tmp_path, multi=True)
    s.suggest("a")
    s.on_trial_complete("a", _ok(0.5, objective_0=0.2, objective_1=0.8))
    t = s.study.trials[0]
    assert t.state == S.COMPLETE and t.values == [0.2, 0.8]


def test_multi_objective_tells_a_served_row_normalised_on_each_proxys_scale():
    """A duplicate (or a reconciled trial) carries only raw proxy scores: Optuna must hear them
    as the trial reports them, chance 0 and best 1, a Brier score turned the right way up."""
    import json

    from layerswap.search.searcher import tell

    study = optuna.create_study(directions=["maximize", "maximize"])
    scales = [{"task": "bele_brier_dev", "chance": 0.75, "best": 0.0, "worst": 2.0},
              {"task": "mgsm_dev"}]  # fmt: skip
    study.set_user_attr("proxies", json.dumps(scales))
    trial = study.ask()
    row = {"status": "duplicate", "objective": 0.1, "proxy__bele_brier_dev": 1.5, "proxy__mgsm_dev": 0.2}  # fmt: skip
    tell(study, trial, row, {"source_status": "ok"})
    assert study.trials[0].values == [-1.0, 0.2]
    # a study begun before the scales were recorded names its proxies only: told as before
    old = optuna.create_study(directions=["maximize", "maximize"])
    old.set_user_attr("proxies", json.dumps(["a_dev", "b_dev"]))
    t = old.ask()
    tell(old, t, {"status": "ok", "objective": 0.5, "proxy__a_dev": 0.3, "proxy__b_dev": 0.7}, None)
    assert old.trials[0].values == [0.3, 0.7]


def test_store_refuses_a_trial_twice(tmp_path):
    store = TrialStore(tmp_path / "x.parquet")
    store.append({"trial_id": "0001", "recipe_id": "r", "status": "ok", "objective": 1.0})
    with pytest.raises(ValueError, match="already"):
        store.append({"trial_id": "0001", "recipe_id": "r", "status": "ok"})


def test_pool_from_the_expert_registry(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from layerswap.search.pool import resolve_pool

    def row(i, kind, lang, mode, ind_m, ind_b):
        return {"expert_id": f"e{i}", "kind": kind, "language": lang, "mode": mode, "path": f"/x/e{i}", "base": "/b", "ind__world_mgsm_direct_en_dev": ind_m, "ind__world_belebele_xa_dev": ind_b}  # fmt: skip

    rows = [
        row(0, "math", "en", "full", 0.1, 0.3),
        row(1, "math", "en", "lora", 0.5, 0.2),
        row(2, "math", "en", "full", 0.3, 0.9),
        row(3, "language", "xa", "full", 0.0, 0.4),
        row(4, "language", "xb", "full", 0.0, 0.9),
        row(5, "language", "xa", "full", 0.0, 0.6),
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "registry.parquet")
    exp = SearchExperiment.model_validate({"language": "xa", "base": "/b", "experts": {"registry": str(tmp_path / "registry.parquet"), "top_k": 2}})  # fmt: skip
    pool = resolve_pool(exp)
    assert [(r.expert_id, r.kind) for r in pool.task] == [("e1", "lora"), ("e2", "full")]
    assert [r.expert_id for r in pool.language] == ["e5", "e3"]
    assert pool.base == "/b"


def _run_batches(tmp_path, finish_order, size=3, trials=9):
    """Drive the reproducible mode as Tune would: ask while it answers, finish in `finish_order`
    (a permutation applied to each batch), and return what Optuna proposed and the table."""
    tmp_path.mkdir()
    s, store, _ = _searcher(tmp_path, space_high=6)
    s.plan_batches(size, trials)
    asked, n = [], 0
    while n < trials:
        batch = []
        while (cfg := s.suggest(f"t{n}")) is not None:
            batch.append((f"t{n}", cfg))
            n += 1
        assert batch, "a finished batch must open the next"
        for i in finish_order[: len(batch)]:
            tid, cfg = batch[i % len(batch)]
            params = {k: v for k, v in cfg.items() if k != META}
            asked.append(params)
            # a deterministic score of the proposal, as a real trial's would be
            s.on_trial_complete(
                tid, _ok(round(0.1 * params["bottom"] + 0.01 * params.get("top", 0), 3))
            )
    rows = [(r["trial_id"], r["recipe_id"], r["objective"]) for r in TrialStore(store.path).rows]
    return sorted(map(str, asked)), rows


def test_reproducible_batches_do_not_depend_on_the_finishing_order(tmp_path):
    a = _run_batches(tmp_path / "a", [0, 1, 2])
    b = _run_batches(tmp_path / "b", [2, 0, 1])
    assert a == b
    assert [r[0] for r in a[1]] == [f"{i:04d}" for i in range(9)]  # rows in trial order


def test_reproducible_batch_waits_for_all_and_serves_a_twin_when_told(tmp_path):
    s, store, _ = _searcher(tmp_path, points=[POINT, POINT])
    s.plan_batches(3, 3)
    a, b = s.suggest("a"), s.suggest("b")
    assert s.suggest("c") is not None
    assert s.suggest("d") is None  # the batch is full
    assert a[META]["served"] is None
    assert b[META]["served"] == {"twin_of": s.meta["a"]["recipe_id"]}
    s.on_trial_complete("c", _ok(0.2))
    s.on_trial_complete("b", {"twin_of": s.meta["b"]["recipe_id"], "objective": math.nan})
    assert len(TrialStore(store.path)) == 0  # nothing told until all of the batch finished
    s.on_trial_complete("a", _ok(0.5))
    rows = TrialStore(store.path).rows
    assert [r["status"] for r in rows] == ["ok", "duplicate", "ok"]
    assert rows[1]["objective"] == 0.5 and rows[1]["error"] == "served from trial 0000"
    assert [t.state for t in s.study.trials] == [S.COMPLETE] * 3


def test_the_splits_log_is_derived_from_the_table(tmp_path):
    """A driver killed after its last trial's row, before RUN/search/splits_read.json: the resume
    (nothing left to run) wrote `[]`. Each row now keeps what its trial read; a repeat served
    from the table (through the trial's own report) read nothing."""
    from layerswap.search.search import _write_splits

    s, _, _ = _searcher(tmp_path, points=[POINT, POINT])
    s.suggest("a")
    s.on_trial_complete("a", flat_report(_ok(0.5, splits_read=[("a_dev", "dev"), ("a_dev", "train")])))  # fmt: skip
    served = s.suggest("b")[META]["served"]  # the repeat, served from row 0000 by its trial
    s.on_trial_complete("b", flat_report(served_result(served)))
    s.suggest("c")
    s.on_trial_complete("c", _ok(0.4, splits_read=json.dumps([["b_dev", "dev"]])))
    # A fresh driver: only the table (as the resume reads it), no searcher state.
    table = TrialStore(tmp_path / "trials.parquet")
    assert [json.loads(r["splits_read"]) for r in table.rows] == [[["a_dev", "dev"], ["a_dev", "train"]], [], [["b_dev", "dev"]]]  # fmt: skip
    want = {("a_dev", "dev"), ("a_dev", "train"), ("b_dev", "dev")}
    assert _write_splits(tmp_path, table) == want
    assert {tuple(x) for x in json.loads((tmp_path / "splits_read.json").read_text())} == want
