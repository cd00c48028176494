"""Promotion without a search: a hand-written trials table (one candidate) and the base model,
evaluated on the device "auto" picks (the CPU here), with per-task few-shot counts.

Run: .venv/bin/python -m pytest -q tests/search/test_promote.py
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from search_fixtures import experiment, make_experts, one_trial_run

from layerswap.search.pool import model_depth, resolve_pool
from layerswap.search.promote import RESULT_COLUMNS, _models, promote, shot_groups
from layerswap.spaces.errors import RunFailed
from layerswap.spaces.recipe import recipe_id
from layerswap.trainables.evaluate.harness import resolve_device
from layerswap.trainables.model_ids import content_recipe_id

pytestmark = pytest.mark.usefixtures("one_thread")

TARGET, BELE, MGSM = "world_mgsm_direct_xa", "world_belebele_xa_dev", "world_mgsm_direct_en_dev"
# Two proxies, each with a held-out test variant: promotion's task order and shot groups
PROXIES = [{"task": BELE, "chance": 0.25}, {"task": MGSM}]


@pytest.fixture(scope="module")
def experts(tiny_world, tmp_path_factory) -> dict[str, Path]:
    return make_experts(tiny_world, tmp_path_factory.mktemp("promote") / "experts")


def test_shot_groups(tiny_world, experts):
    exp = experiment(tiny_world, experts, proxies=PROXIES)  # 0 shots everywhere: one lm-eval run
    assert shot_groups(exp) == [(0, [TARGET, "world_belebele_xa", "world_mgsm_direct_en", BELE, MGSM])]  # fmt: skip
    exp = experiment(tiny_world, experts, proxies=PROXIES, promote={"num_fewshot": None})
    assert shot_groups(exp) == [
        (None, [TARGET]),
        (0, ["world_belebele_xa", "world_mgsm_direct_en", BELE, MGSM]),
    ]


def test_baseline_ids_are_content_ids(tiny_world, experts, tmp_path):
    """The same baselines over the experts copied elsewhere keep their ids (and run nothing)."""
    moved = {k: shutil.copytree(p, tmp_path / "elsewhere" / k) for k, p in experts.items()}
    want = {"baselines": ["base", "soup_uniform", "soup_magnitude", "ties", "paper_default"]}
    ids = []
    for paths in (experts, moved):
        exp = experiment(tiny_world, paths, promote=want)
        pool = resolve_pool(exp)
        models = _models(exp, pool, model_depth(pool), [])
        assert [m[0] for m in models] == want["baselines"]
        assert models[0][2] is None  # a checkpoint, not a recipe: no recipe id
        assert all(rid == content_recipe_id(x) != recipe_id(x) for _, _, rid, x in models[1:])
        ids.append([m[2] for m in models])
    assert ids[0] == ids[1]


def test_unusable_device_fails_before_any_model(tiny_world, experts, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run, _ = one_trial_run(tmp_path, experts)
    exp = experiment(tiny_world, experts, promote={"device": "cuda"})
    with pytest.raises(ValueError, match=r"device 'cuda': torch .* sees no usable CUDA GPU"):
        promote(exp, run, progress=False)
    assert not (run / "promotion" / "results.parquet").exists()


def test_promote_on_the_auto_device(tiny_world, experts, tmp_path):
    run, rid = one_trial_run(tmp_path, experts)
    exp = experiment(
        tiny_world,
        experts,
        proxies=PROXIES,
        promote={"top_k": 1, "limit": 2, "max_gen_toks": 4, "baselines": ["base"],
                 "device": "auto", "batch_size": "auto", "num_fewshot": 1, "write_best": False},
    )  # fmt: skip
    res = promote(exp, run, progress=False)
    table = pq.read_table(res.results_path)
    assert table.schema.names == list(RESULT_COLUMNS)  # the file's format is unchanged
    rows = table.to_pylist()
    tasks = [TARGET, "world_belebele_xa", "world_mgsm_direct_en", BELE, MGSM]
    assert [(r["model"], r["task"]) for r in rows] == [
        (m, t) for m in (f"candidate_{rid}", "base") for t in tasks
    ]  # rows in task order, whatever run scored each task
    assert res.best_model == f"candidate_{rid}" and res.best_dir is None
    device = resolve_device("auto")
    for r in rows:
        assert r["n_items"] == 2 and 0.0 <= r["value"] <= 1.0
        raw = json.loads(Path(r["raw_json"]).read_text())
        assert set(raw["results"]) == {r["task"]}
        assert raw["config"]["device"] == device and raw["config"]["batch_size"] == "auto"
        # the model evaluated, not the checkpoint composition loaded first (lm-eval's reading)
        want = (f"layerswap:candidate_{rid}", f"recipe_id={rid}") if r["model"] != "base" else (str(experts["base"]), f"pretrained={experts['base']}")  # fmt: skip
        assert (raw["config"]["model"], raw["config"]["model_args"]) == want
        # the target at promote.num_fewshot, proxies (dev and held-out) at Proxy.num_fewshot
        assert raw["n-shot"] == {r["task"]: 1 if r["task"] == TARGET else 0}
    board = res.leaderboard.read_text()
    assert "**candidate_" in board
    # promote.limit 2: each column's header says its score rests on 2 of the split's items
    assert re.search(rf"\*\*{TARGET} \(target, test, 2 of \d+ items\)\*\*", board), board
    assert re.search(rf"{BELE} \(dev, 2 of \d+ items\)", board), board


def _oom_above(k: int, seen: list[int]):
    """harness.evaluate, with the model raising CUDA's out-of-memory error for a batch of more
    than `k` rows (as a GPU would); `seen` collects every batch the model was called with."""
    from layerswap.trainables.evaluate import harness

    real = harness.evaluate

    def evaluate(model, *a, **kw):
        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            seen.append(ids.shape[0])
            if ids.shape[0] > k:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 47.2 GiB (simulated)")  # fmt: skip

        handle = model.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            return real(model, *a, **kw)
        finally:
            handle.remove()

    return evaluate


def test_out_of_memory_halves_the_batch_and_promotion_completes(tiny_world, experts, tmp_path, monkeypatch, capsys):  # fmt: skip
    from layerswap.trainables.evaluate import harness

    seen: list[int] = []
    monkeypatch.setattr(harness, "evaluate", _oom_above(2, seen))
    run, rid = one_trial_run(tmp_path, experts)
    exp = experiment(
        tiny_world, experts, proxies=[PROXIES[0]],
        promote={"top_k": 1, "limit": 8, "max_gen_toks": 2, "baselines": ["base"],
                 "batch_size": 8, "num_fewshot": 0, "write_best": False},
    )  # fmt: skip
    res = promote(exp, run, progress=True)
    out = capsys.readouterr().out
    assert "out of memory at batch 8; retrying at 4" in out and "retrying at 2" in out
    assert "failed" not in out
    assert {r["model"] for r in res.rows} == {f"candidate_{rid}", "base"}
    assert all(r["n_items"] == 8 for r in res.rows)
    # after the back-off every forward pass was at most 2 rows, and the next model started there
    first_ok = next(i for i, b in enumerate(seen) if b <= 2)
    assert max(seen[first_ok:]) <= 2


def test_every_model_failing_is_an_error_with_the_reasons(tiny_world, experts, tmp_path, monkeypatch):  # fmt: skip
    from layerswap.trainables.evaluate import harness

    def broken(*a, **kw):
        raise ValueError("tokenizer has no pad token (simulated)")

    monkeypatch.setattr(harness, "evaluate", broken)
    run, rid = one_trial_run(tmp_path, experts)
    exp = experiment(tiny_world, experts, promote={"top_k": 1, "limit": 2, "baselines": ["base"], "write_best": False})  # fmt: skip
    with pytest.raises(RunFailed, match="every model's evaluation failed") as e:
        promote(exp, run, progress=False)
    assert "tokenizer has no pad token" in str(e.value)
    board = (run / "leaderboard.md").read_text()
    assert f"- candidate_{rid}: ValueError: tokenizer has no pad token (simulated)" in board
    # the objective column says what it is: each proxy from chance 0 to best 1, then their mean
    legend = next(line for line in board.splitlines() if line.startswith("Search objective"))
    for q in exp.proxy_list:
        assert f"({q.task} - {q.chance:g}) / ({q.best:g} - {q.chance:g})" in legend, legend
    assert "- base: ValueError" in board


def test_a_baseline_that_is_a_candidates_recipe_is_evaluated_once(tiny_world, experts, tmp_path, monkeypatch, capsys):  # fmt: skip
    """The paper default is the search's first trial, so it is often also a top-k candidate:
    one model, one lm-eval run, its rows under both names (analysis counts it once)."""
    from layerswap.search import promote_eval
    from layerswap.search.results import TrialStore
    from layerswap.spaces.recipe import dump_recipe

    exp = experiment(tiny_world, experts, proxies=[PROXIES[0]], promote={"top_k": 1, "limit": 2, "max_gen_toks": 2, "baselines": ["paper_default"], "num_fewshot": 0, "write_best": False})  # fmt: skip
    pool = resolve_pool(exp)
    [(_, _, rid, recipe)] = _models(exp, pool, model_depth(pool), [])
    run = tmp_path / "run"
    TrialStore(run / "search" / "trials.parquet").append(
        {"trial_id": "0000", "recipe_id": rid, "recipe_yaml": dump_recipe(recipe, rid),
         "method": "layer_swap", "status": "ok", "fidelity": 8, "objective": 0.5}
    )  # fmt: skip
    evaluated = []
    real = promote_eval._evaluate_model
    monkeypatch.setattr(promote_eval, "_evaluate_model", lambda *a, **kw: evaluated.append(a[3]) or real(*a, **kw))  # fmt: skip
    res = promote(exp, run, progress=True)
    assert len(evaluated) == 1, evaluated
    by_model = {}
    for r in res.rows:
        by_model.setdefault(r["model"], {})[r["task"]] = (r["kind"], r["recipe_id"], r["value"])
    cand = f"candidate_{rid}"
    assert set(by_model) == {cand, "paper_default"}
    assert {t: v[2] for t, v in by_model[cand].items()} == {t: v[2] for t, v in by_model["paper_default"].items()}  # fmt: skip
    assert {v[:2] for v in by_model["paper_default"].values()} == {("baseline", rid)}
    assert f"the same recipe as {cand}" in capsys.readouterr().out
