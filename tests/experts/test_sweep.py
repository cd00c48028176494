"""Expert sweeps: set-up, seeds, search spaces, and a 4-trial Ray Tune sweep whose registry
scores equal lm-eval's re-evaluation of the chosen checkpoints.

Run: .venv/bin/python -m pytest -q tests/experts/test_sweep.py   (the sweep is marked slow)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from layerswap.experts.registry import read_rows, registry_path, top_k
from layerswap.experts.sweep import (
    _flat_params,
    run_sweep,
    score_rows,
    set_up_sweep,
    trial_seed,
)
from layerswap.experts.sweep_tuner import searcher
from layerswap.spaces.train_experiment import parse_train_experiment

MGSM, BELE = "world_mgsm_direct_en_dev", "world_belebele_en_dev"
LIMIT, GEN_TOKS = 8, 16


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory) -> Path:
    """The session's tiny world (seed 0), copied to a folder named `world`, as the examples'
    relative `runs/world/...` paths name it: a copy (0.5 MB) instead of a second build (a
    minute on 2 shared cores); build_world only checks it is complete and returns it."""
    from layerswap.world import build_world

    out = tmp_path_factory.getbasetemp() / "sweep_world" / "world"
    if not out.exists():
        shutil.copytree(tiny_world, out)
    return build_world(out, seed=0, size="tiny", progress=False)


def experiment(world: Path, sweep: dict, **kw):
    data = {
        "name": "sweep_math",
        "base": str(world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(world / "data/sft/math_en.jsonl")}],
        "mode": "full",
        "hyper": {"lr": 1e-3, "max_steps": 4, "batch_size": 4, "seq_len": 96, "warmup_steps": 1},
        "checkpoint_every_samples": 8,
        "sweep": sweep,
    }
    data.update(kw)
    return parse_train_experiment(data)


SPACE = {
    "hyper.lr": {"low": 1e-4, "high": 3e-3, "log": True},
    "hyper.warmup_steps": {"low": 0, "high": 2},
}


def test_setup_resolves_world_tasks_and_executor(world, tmp_path):
    setup = set_up_sweep(experiment(world, {"params": SPACE}), tmp_path)
    assert setup.tasks == [MGSM] and setup.metric_task == MGSM
    assert (Path(setup.include_path) / f"{MGSM}.yaml").is_file()
    assert setup.int_params == {"hyper.warmup_steps"}
    assert setup.executor == "in_trial"
    assert setup.storage == str((tmp_path / "train").resolve())
    two = experiment(world, {"params": SPACE}, scaling={"num_workers": 2})
    assert set_up_sweep(two, tmp_path).executor == "ray_train"
    xa = [{"path": str(world / "data/sft/lang_xa.jsonl")}]
    lang = experiment(world, {"params": SPACE}, kind="language", language="xa", datasets=xa)
    assert set_up_sweep(lang, tmp_path).tasks == ["world_belebele_xa_dev"]
    with pytest.raises(ValueError, match="no sweep"):
        set_up_sweep(experiment(world, None), tmp_path)


def test_relative_paths_are_resolved_in_the_driver(world, tmp_path, monkeypatch):
    """Trials run in Tune's folders: the examples' relative `runs/world/base` must not reach them."""
    monkeypatch.chdir(world.parent)
    exp = experiment(world, {"params": SPACE}, base="world/base")
    exp = exp.model_copy(update={"datasets": [exp.datasets[0].model_copy(update={"path": "world/data/sft/math_en.jsonl"})]})  # fmt: skip
    setup = set_up_sweep(exp, tmp_path)
    assert setup.experiment["base"] == str(world / "base")
    assert setup.experiment["datasets"][0]["path"] == str(world / "data/sft/math_en.jsonl")
    assert setup.include_path is not None  # the world was found through the resolved base


def test_real_base_uses_builtin_tasks(world, tmp_path):
    exp = experiment(world, {"params": SPACE}, base="meta-llama/Llama-3.1-8B-Instruct")
    swh = [exp.datasets[0].model_copy(update={"path": None, "source": "aya", "language": "swh"})]
    exp = exp.model_copy(update={"language": "swh", "kind": "language", "datasets": swh})
    setup = set_up_sweep(exp, tmp_path)
    assert setup.tasks == ["belebele_swh_Latn"] and setup.include_path is None


def test_trial_seed_and_params():
    a = trial_seed(0, {"hyper.lr": 1e-3})
    assert a == trial_seed(0, {"hyper.lr": 1e-3}) and a != trial_seed(0, {"hyper.lr": 2e-3})
    assert trial_seed(5, {"hyper.lr": 1e-3}) == a + 5
    assert trial_seed(0, {"hyper.seed": 9}) == 9
    assert _flat_params({"hyper": {"lr": 1.0}, "mode.rank": 4}) == {"hyper.lr": 1.0, "mode.rank": 4}


def test_random_search_space(world, tmp_path):
    from ray.tune.search.sample import Categorical, Float, Integer

    sweep = {"algorithm": "random", "params": {**SPACE, "hyper.schedule": {"choices": ["linear", "wsd"]}}}  # fmt: skip
    _, space = searcher(set_up_sweep(experiment(world, sweep), tmp_path))
    assert isinstance(space["hyper.lr"], Float)
    assert isinstance(space["hyper.warmup_steps"], Integer)
    assert (space["hyper.warmup_steps"].lower, space["hyper.warmup_steps"].upper) == (0, 3)
    assert isinstance(space["hyper.schedule"], Categorical)


def test_score_rows_last_checkpoint(world, tmp_path):
    """Rows straight from the plain loop's checkpoints (no Ray): `checkpoints: last` keeps one."""
    from layerswap.trainables.train import find_checkpoints, run_training

    sweep = {"params": SPACE, "checkpoints": "last", "limit": 4, "max_gen_toks": 8}
    exp = experiment(world, sweep, hyper={"lr": 1e-3, "max_steps": 4, "batch_size": 4, "seq_len": 96, "seed": 3})  # fmt: skip
    run_training(exp, workdir=tmp_path / "t0")
    cks = find_checkpoints(tmp_path / "t0")
    assert len(cks) == 2
    (row,) = score_rows(set_up_sweep(exp, tmp_path), cks, "t0", {"hyper.lr": 1e-3, "mode.x": 1})
    assert (row["step"], row["samples"], row["seed"], row["trial_id"]) == (4, 16, 3, "t0")
    assert row["path"] == str(cks[-1].resolve()) and row["mode"] == "full"
    assert json.loads(row["hparams"])["lr"] == 1e-3 and json.loads(row["hparams"])["mode.x"] == 1
    assert row[f"n_items__{MGSM}"] == 4 and 0 <= row[f"ind__{MGSM}"] <= 1


def test_score_rows_leaves_a_checkpoint_with_non_finite_outputs_unscored(world, tmp_path, capsys):
    """Finite weights whose outputs overflow (a norm scaled to 1e38) get no registry row and one
    line naming them; the trial's other checkpoint is still scored (before: argmax over NaN
    logits picked the first option and the row carried a made-up score)."""
    import torch
    from safetensors.torch import load_file, save_file

    from layerswap.trainables.train import find_checkpoints, run_training

    sweep = {"params": SPACE, "checkpoints": "all", "limit": 4, "max_gen_toks": 8}
    exp = experiment(world, sweep, hyper={"lr": 1e-3, "max_steps": 4, "batch_size": 4, "seq_len": 96, "seed": 3})  # fmt: skip
    run_training(exp, workdir=tmp_path / "t0")
    cks = find_checkpoints(tmp_path / "t0")
    (weights,) = cks[0].glob("*.safetensors")
    state = load_file(weights)
    name = next(k for k in state if k.endswith("input_layernorm.weight"))
    state[name] = torch.full_like(state[name], 1e38)  # finite, but every activation overflows
    assert all(torch.isfinite(t).all() for t in state.values())
    save_file(state, weights, metadata={"format": "pt"})
    rows = score_rows(set_up_sweep(exp, tmp_path), cks, "t0", {"hyper.lr": 1e-3})
    assert [r["path"] for r in rows] == [str(cks[1].resolve())]
    err = capsys.readouterr().err
    assert f"layerswap: sweep trial t0: {cks[0]} left unscored:" in err and "not finite" in err, err


@pytest.mark.slow
def test_a_diverging_sweep_trial_fails_once_without_retry(world, tmp_path, ray_local):
    """lr 1000 turns step 2 non-finite: with max_failures 2 Tune would restart the trial twice
    and diverge twice more (each restart logs step 1 again); it fails once, no registry row."""
    log = tmp_path / "steps.jsonl"
    sweep = {"num_samples": 1, "params": {"hyper.lr": {"choices": [1000.0]}}, "executor": "in_trial", "limit": 4}  # fmt: skip
    exp = experiment(world, sweep, failure={"max_failures": 2}, debug={"step_log": str(log)})
    res = run_sweep(exp, tmp_path / "run")
    assert list(res.trials.values()) == ["error"] and res.rows == [] and res.best == []
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps.count(1) == 1, steps


@pytest.mark.slow
def test_sweep_registry_matches_lm_eval(world, tmp_path, ray_local):
    from layerswap.trainables.evaluate.harness import evaluate
    from layerswap.trainables.evaluate.scoring import task_score

    sweep = {
        "num_samples": 4,
        "seed": 0,
        "params": SPACE,
        # Belebele too: its multiple-choice scores move with every weight, unlike tiny MGSM.
        "indicators": [BELE, MGSM],
        "limit": LIMIT,
        "max_gen_toks": GEN_TOKS,
        "top_k": 3,
    }
    exp = experiment(world, sweep)
    res = run_sweep(exp, tmp_path)
    assert len(res.trials) == 4 and set(res.trials.values()) == {"ok"}

    rows = read_rows(registry_path(tmp_path))
    assert rows == res.rows and len(rows) == 8  # 2 checkpoints (8 and 16 samples) per trial
    assert {r["trial_id"] for r in rows} == set(res.trials)
    assert sorted({r["samples"] for r in rows}) == [8, 16]
    assert len({json.loads(r["hparams"])["lr"] for r in rows}) == 4  # every trial sampled its own
    assert len({r["seed"] for r in rows}) == 4
    for r in rows:
        assert Path(r["path"]).is_relative_to(tmp_path / "train" / "sweep_math" / r["trial_id"])
        assert r[f"n_items__{BELE}"] == LIMIT and r[f"n_items__{MGSM}"] == LIMIT

    chosen = top_k(tmp_path / "experts" / "registry.parquet", "math", "en", BELE, k=3)
    assert chosen == res.best and len(chosen) == 3
    for r in chosen:  # lm-eval itself, from the checkpoint folder on disk
        raw = evaluate(
            r["path"], [BELE, MGSM], include_path=str(tmp_path / "experts" / "tasks"),
            limit=LIMIT, num_fewshot=0, max_gen_toks=GEN_TOKS,
        )  # fmt: skip
        assert r[f"ind__{BELE}"] == pytest.approx(task_score(raw, BELE), abs=1e-12)
        assert r[f"ind__{MGSM}"] == pytest.approx(task_score(raw, MGSM), abs=1e-12)


@pytest.mark.slow
def test_sweep_nested_torch_trainer(world, tmp_path, ray_local):
    """executor: ray_train drives the experiment's TorchTrainer inside the Tune trial, and
    scores its checkpoint in a task of its own (27-31 s here; it was opt-in while Ray Train's
    start-up took 65-220 s, and so missed that the scoring task could not be placed)."""
    sweep = {
        "num_samples": 1,
        "params": {"hyper.lr": {"choices": [1e-3]}},
        "executor": "ray_train",
        "checkpoints": "last",
        "limit": 4,
        "max_gen_toks": 8,
    }
    exp = experiment(world, sweep)
    res = run_sweep(exp, tmp_path)
    assert list(res.trials.values()) == ["ok"]
    (row,) = res.rows
    assert row["samples"] == 16 and Path(row["path"]).name == "samples_000000016"
    assert Path(row["path"]).parent == tmp_path / "train" / "sweep_math" / row["trial_id"]
