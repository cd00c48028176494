"""Search trials without Ray: in-memory composition into one live model, proxy scoring, failures.

Run: .venv/bin/python -m pytest -q tests/search/test_trial.py
"""

from __future__ import annotations

import re

import pytest
import torch
from search_fixtures import experiment, make_experts

from layerswap.search.trial import TrialRunner, combine
from layerswap.spaces.search_experiment import Proxy
from layerswap.spaces.search_space import ExpertPool, decode, warm_start
from layerswap.trainables.merge.compose import compose_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from layerswap.trainables.evaluate.tasks import write_world_tasks
    from layerswap.world import build_world

    world = build_world(tmp_path_factory.getbasetemp() / "tiny_world", size="tiny", progress=False)
    root = tmp_path_factory.mktemp("trial")
    paths = make_experts(world, root / "experts", nan_expert=True)
    bad = root / "experts" / "corrupt"
    bad.mkdir()
    for f in (paths["task"]).iterdir():
        (bad / f.name).write_bytes(
            b"not safetensors" if f.suffix == ".safetensors" else f.read_bytes()
        )
    paths["corrupt"] = bad
    tasks = root / "tasks"
    write_world_tasks(world, tasks)
    pool = ExpertPool.from_paths(
        [str(paths["task"])],
        [str(paths["language"]), str(paths["nan_lang"]), str(paths["corrupt"])],
        str(paths["base"]),
    )
    exp = experiment(world, paths, search={"fidelity": {"policy": "screen", "screen": 0.5}})
    runner = TrialRunner(exp, pool, [str(tasks)])
    return exp, pool, runner, paths, tasks


def _recipe(exp, pool, **params):
    return decode({**warm_start(exp.space, 4, pool), **params}, exp.space, 4, pool)


def test_trial_scores_dev_proxies_only(setup):
    exp, pool, runner, _, _ = setup
    res = runner.run(_recipe(exp, pool))
    assert res.status == "ok", res.error
    assert set(res.proxies) == {p.task for p in exp.proxy_list}
    assert all(0 <= v <= 1 for v in res.proxies.values())
    assert res.fidelity == exp.proxy_eval.limit
    assert res.objective == pytest.approx(combine(exp.proxy_list, res.proxies)[0])
    assert res.t_compose_s < res.t_eval_s
    # the target's test split (world_mgsm_direct_xa) and every test split stay unread
    assert all(
        task.endswith("_dev") and split in ("dev", "train") for task, split in res.splits_read
    )


def test_only_changed_tensors_move_and_model_equals_compose(setup):
    exp, pool, runner, _, _ = setup
    a = _recipe(exp, pool, bottom=1, top=0, bottom_transition=0)
    b = _recipe(exp, pool, bottom=2, top=0, bottom_transition=0)  # layer 1: task -> language
    runner.load(a)
    assert runner.load(a) == 0
    moved = runner.load(b)
    names = list(runner.cache.get(pool.task[0].path))
    assert moved == sum(".layers.1." in n for n in names)
    sources = {
        r: runner.cache.get(r) for r in (pool.task[0].path, pool.language[0].path, pool.base)
    }
    want = compose_recipe(b, sources, 4)
    got = dict(runner.model.named_parameters())
    assert all(torch.equal(got[n], want[n]) for n in want)
    # shared, not copied: a taken tensor is the cache's own storage
    lang0 = runner.cache.get(pool.language[0].path)["model.layers.0.mlp.up_proj.weight"]
    assert got["model.layers.0.mlp.up_proj.weight"].data_ptr() == lang0.data_ptr()


def test_nan_and_unreadable_experts_fail_without_breaking_the_runner(setup):
    exp, pool, runner, _, _ = setup
    bad = runner.run(_recipe(exp, pool, language_expert="1", bottom=1))
    assert (
        bad.status == "failed" and "non-finite" in bad.error and "layers.0.mlp.up_proj" in bad.error
    )
    broken = runner.run(_recipe(exp, pool, language_expert="2"))
    assert broken.status == "failed" and broken.objective is None
    ok = runner.run(_recipe(exp, pool))
    assert ok.status == "ok"
    first = runner.run(_recipe(exp, pool))
    assert first.proxies == ok.proxies and first.moved == 0


def test_screening_prunes_and_full_scores_match_unscreened(setup):
    exp, pool, runner, _, tasks = setup
    rec = _recipe(exp, pool, bottom=2, bottom_transition=1)
    pruned = runner.run(rec, gates=[1.5])  # unreachable: any bound is below it
    assert pruned.status == "pruned" and pruned.fidelity == 4 and pruned.upper_bound < 1.5
    full = runner.run(rec, gates=[-1.0])
    assert full.status == "ok" and full.fidelity == 8
    plain = TrialRunner(
        exp.model_copy(
            update={
                "search": exp.search.model_copy(
                    update={"fidelity": exp.search.fidelity.model_copy(update={"policy": "none"})}
                )
            }
        ),
        pool,
        [str(tasks)],
    )
    again = plain.run(rec)
    assert again.proxies == pytest.approx(full.proxies) and again.fidelity == 8
    assert full.items_scored == again.items_scored == 8 * len(full.proxies)
    assert [n for n, _ in full.rungs] == [4, 8] and full.rungs[-1][1] == full.objective
    halving = TrialRunner(_with_fidelity(exp, policy="halving", eta=2), pool, [str(tasks)])
    assert [len(next(iter(p.tasks.values())).items) for p in halving.parts] == [1, 1, 2, 4]
    stopped = halving.run(rec, gates=[2.0, None, None])  # no objective reaches 2
    assert stopped.status == "pruned" and stopped.fidelity == 1 and len(stopped.rungs) == 1
    assert stopped.items_scored == len(full.proxies)
    passed = halving.run(rec, gates=[-9.0, -9.0, -9.0])  # every objective reaches -9
    assert passed.status == "ok" and [n for n, _ in passed.rungs] == [1, 2, 4, 8]
    assert passed.proxies == pytest.approx(full.proxies)  # every item, each once


def _with_fidelity(exp, **fidelity):
    fid = exp.search.fidelity.model_copy(update=fidelity)
    return exp.model_copy(update={"search": exp.search.model_copy(update={"fidelity": fid})})


BRIER = {"task": "world_belebele_brier_xa_dev", "chance": 0.75, "best": 0.0, "worst": 2.0}


def test_brier_proxy_lower_is_better_normalises_and_screens_optimistically(setup):
    """A lower-is-better proxy: Brier 0 scores 1, guessing 0 and the screen's bound lies on
    the low (optimistic) side of the screened Brier; pruning still works."""
    exp, pool, _, _, tasks = setup
    bexp = exp.model_copy(update={"proxies": [Proxy(**BRIER)]})
    runner = TrialRunner(bexp, pool, [str(tasks)])
    rec = _recipe(bexp, pool, bottom=2, bottom_transition=1)
    full = runner.run(rec, gates=[-10.0])
    assert full.status == "ok", full.error
    brier = full.proxies[BRIER["task"]]
    assert 0 < brier < 2 and full.objective == pytest.approx(1 - brier / 0.75)
    pruned = runner.run(rec, gates=[1.01])  # above any Brier's best
    assert pruned.status == "pruned" and pruned.fidelity == 4
    screened = pruned.proxies[BRIER["task"]]
    assert pruned.upper_bound > 1 - screened / 0.75  # the bound is optimistic: a lower Brier
    assert combine([Proxy(**BRIER)], {BRIER["task"]: 0.0})[0] == 1.0
    assert combine([Proxy(**BRIER)], {BRIER["task"]: 0.75})[0] == 0.0


def test_proxy_scale_against_the_metrics_direction_is_refused(setup):
    exp, pool, _, _, tasks = setup
    wrong = exp.model_copy(
        update={"proxies": [Proxy(task=BRIER["task"], chance=0.75, best=2.0, worst=0.0)]}
    )
    with pytest.raises(ValueError, match=r"brier_score is lower-is-better.*best 2\.0"):
        TrialRunner(wrong, pool, [str(tasks)])
    acc = exp.model_copy(
        update={"proxies": [Proxy(task="world_belebele_xa_dev", chance=0.25, best=0, worst=1)]}
    )
    with pytest.raises(ValueError, match="acc is higher-is-better"):
        TrialRunner(acc, pool, [str(tasks)])


def test_the_drivers_check_reads_configs_and_refuses_tags_and_a_lower_is_better_target(setup):
    """check_proxy_scales (run before a search writes anything): the world default passes; a
    tag as a proxy, a proxy scaled against its metric and a Brier target are refused by name."""
    from layerswap.search.trial import check_proxy_scales

    exp = setup[0]
    check_proxy_scales(exp.model_copy(update={"proxies": None}))  # the world default
    check_proxy_scales(exp.model_copy(update={"proxies": [Proxy(**BRIER)]}))
    cases = {
        "a group or tag of tasks": {"proxies": [Proxy(task="world_belebele_dev", chance=0.25)]},
        "brier_score is lower-is-better, but the proxy has best 1.0": {
            "proxies": [Proxy(task=BRIER["task"], chance=0.75)]
        },
        "target world_belebele_brier_xa: lm-eval's brier_score is lower-is-better": {
            "target": "world_belebele_brier_xa"
        },
    }
    for words, update in cases.items():
        with pytest.raises(ValueError, match=re.escape(words)):
            check_proxy_scales(exp.model_copy(update=update))


def test_served_duplicate_does_no_work(setup):
    from layerswap.search.tune_trial import META, TrialSpec, run_config

    exp, pool, _, _, tasks = setup
    spec = TrialSpec(exp.model_dump_json(), pool.model_dump_json(), (str(tasks),), 4)
    row = {"trial_id": "0003", "status": "ok", "objective": 0.4, "proxy__x": 0.5, "t_eval_s": 3.0}
    out = run_config({"bottom": 1, META: {"served": row}}, spec)
    assert out["status"] == "duplicate" and out["served_from"] == "0003"
    assert out["objective"] == 0.4 and out["t_eval_s"] == 0.0


def test_lora_experts_are_folded_and_match_the_disk_merge(setup, tmp_path):
    """LoRA experts: the cache folds each adapter into the base; a swap equals merge --fold."""
    import peft
    import transformers
    from safetensors.torch import load_file

    from layerswap.spaces.recipe import parse_recipe
    from layerswap.spaces.search_space import ExpertRef
    from layerswap.trainables.merge.live import ExpertCache, LiveModel
    from layerswap.trainables.merge.lora import merge_lora_to_disk

    _, _, _, paths, _ = setup
    base = str(paths["base"])
    adapters = []
    for i in range(2):
        model = transformers.AutoModelForCausalLM.from_pretrained(base)
        pm = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "up_proj"]))  # fmt: skip
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if "lora_" in name:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        pm.save_pretrained(tmp_path / f"lora{i}")
        adapters.append(str(tmp_path / f"lora{i}"))
    pool = ExpertPool(
        task=[ExpertRef(path=adapters[0], kind="lora")],
        language=[ExpertRef(path=adapters[1], kind="lora")],
        base=base,
    )
    recipe = parse_recipe(
        {
            "method": "layer_swap",
            "task_expert": adapters[0],
            "language_expert": adapters[1],
            "base": base,
            "bottom": 1,
            "top": 1,
            "bottom_transition": 1,
        }
    )
    live = LiveModel(ExpertCache(base), pool)
    live.load(recipe)
    merge_lora_to_disk(recipe, tmp_path / "folded", fold=True)
    want = load_file(tmp_path / "folded" / "model.safetensors")
    got = dict(live.model.named_parameters())
    for name, t in want.items():
        assert torch.allclose(got[name], t, atol=1e-6), name


def test_a_trial_whose_node_does_not_see_an_input_reports_it_without_loading(tmp_path, monkeypatch):  # fmt: skip
    """Each trial (not one served from results) checks its node's view of the driver's inputs
    before its runner loads anything, and reports a failed result carrying the lines (no raise,
    so Tune does not retry it; search.py ends the search in them)."""
    from ray import tune

    from layerswap.search import tune_trial
    from layerswap.trainables.node_paths import described

    expert = tmp_path / "expert"
    expert.mkdir()
    (expert / "model.safetensors").write_bytes(b"12")
    driver = described([("task_experts[0]", str(expert))])
    (expert / "model.safetensors").write_bytes(b"1")  # this node's copy differs
    spec = tune_trial.TrialSpec("{}", "{}", (), 4, node_inputs=tuple(driver))
    monkeypatch.setattr(tune_trial, "runner_for", lambda s: pytest.fail("loaded on that node"))
    reports = []
    monkeypatch.setattr(tune, "report", reports.append)
    tune_trial.merge_trial({"bottom": 1}, spec)
    [rep] = reports
    assert rep["status"] == "failed" and rep["error"] == rep[tune_trial.NODE_PATHS_KEY]
    assert re.fullmatch(rf"node .+: task_experts\[0\] {expert}: other sizes there: model\.safetensors 2 bytes here, 1 there; .+", rep["error"])  # fmt: skip
