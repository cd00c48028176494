"""Bad numbers to every command (issue 41, kinds 3 and 6): non-finite values and values past a
limit are refused in one line naming the field or flag, the value and the limit; work that turns
non-finite stops, names where, and keeps nothing non-finite.

Two kinds of case. REFUSED cases are bad input like tests/cli/test_bad_input.py's, run by its
own check (exit 2, no traceback, nothing changed, the tripwires on real work armed). STOPPED
cases must start real work to see the problem (a merge that overflows, a training run whose
loss turns NaN, a model whose outputs are NaN): they run the command for real and check that it
fails with one line and that no output, checkpoint or temporary sibling is left behind.

Run: .venv/bin/python -m pytest -q tests/cli/test_bad_input_numbers.py   (about 60 s on 2 cores)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from layerswap.cli import main
from layerswap.trainables.evaluate import harness
from layerswap.trainables.merge import engine
from layerswap.trainables.train import run as train_run
from tests.cli.test_bad_input import (  # noqa: F401  (bases_in_tmp, env, tripwires: fixtures)
    WORLD_TASK,
    Env,
    _changes,
    _leftovers,
    _plan_study,
    _roots,
    bases_in_tmp,
    env,
    tripwires,
)
from tests.cli.test_bad_input import (
    test_bad_input_is_refused_and_changes_nothing as refused_and_unchanged,
)

REFUSED: list = []
STOPPED: list = []
FINITE = "must be a finite number"


def refused(fn: Callable) -> Callable:
    REFUSED.append(pytest.param(fn, id=fn.__name__))
    return fn


def stopped(fn: Callable) -> Callable:
    STOPPED.append(pytest.param(fn, id=fn.__name__))
    return fn


def _with_nan(e: Env, src: Path, rel: str) -> tuple[str, str]:
    """A private copy of the checkpoint `src` with one NaN weight; (folder, tensor name)."""
    folder = Path(e.copy(src, rel))
    f = folder / "model.safetensors"
    state = load_file(f)
    name = sorted(n for n in state if n.endswith("mlp.down_proj.weight"))[0]
    state[name].view(-1)[0] = float("nan")
    save_file(state, f, {"format": "pt"})
    return str(folder), name


def _checkpoints(run: Path) -> list[Path]:
    return sorted(run.rglob("samples_*")) if run.exists() else []


# ------------------------------------------------------------------ kind 3: finite numbers


@refused
def train__learning_rate_is_infinite(e: Env):
    exp = e.train_exp(hyper=e.train_data()["hyper"] | {"lr": float("inf")})
    return ["train", exp, "--out", e.at("runs"), "--no-ray"], [f"hyper.lr: {FINITE}, got inf"]


@refused
def train__learning_rate_is_nan(e: Env):
    exp = e.train_exp(hyper=e.train_data()["hyper"] | {"lr": float("nan")})
    return ["train", exp, "--out", e.at("runs"), "--no-ray"], [f"hyper.lr: {FINITE}, got nan"]


@refused
def merge__task_arithmetic_scale_is_infinite(e: Env):
    f = e.family
    r = e.yaml("ta.yaml", {"method": "task_arithmetic", "base": str(f["base"]), "models": [str(f["task"]), str(f["language"])], "scale": float("inf")})  # fmt: skip
    return ["merge", r, "--out", e.at("merged"), "-q"], [f"scale: {FINITE}, got inf"]


@refused
def world__config_learning_rate_is_nan(e: Env):
    cfg = e.file("variant.yaml", "model:\n  lr: .nan\n")
    argv = ["world", "build", "--out", e.at("w"), "--size", "tiny", "--config", cfg]
    return argv, [f"{cfg}: invalid world config", f"model.lr: {FINITE}, got nan"]


@stopped
def merge__task_arithmetic_scale_overflows(e: Env):
    f = e.family
    r = e.yaml("ta.yaml", {"method": "task_arithmetic", "base": str(f["base"]), "models": [str(f["task"]), str(f["language"])], "scale": 1e300})  # fmt: skip
    out = e.tmp / "merged"
    return ["merge", r, "--out", str(out), "-q"], 2, ["overflows to a non-finite value"], [out]


@stopped
def train__base_has_a_nan_weight(e: Env):
    base, name = _with_nan(e, e.world / "base", "base")
    exp = e.train_exp(base=base)
    runs = e.tmp / "runs"
    argv = ["train", exp, "--out", str(runs), "--no-ray"]
    return argv, 2, [f"{base}: tensor '{name}' contains NaN or Inf"], [runs]


@stopped
def train__loss_turns_non_finite(e: Env):
    # lr 1000 is the most the config takes; the first update moves the weights by ~1e3 and the
    # second step's loss is no longer finite.
    exp = e.train_exp(hyper=e.train_data()["hyper"] | {"lr": 1000.0})
    runs = e.tmp / "runs"
    argv = ["train", exp, "--out", str(runs), "--no-ray"]
    return argv, 1, ["training turned non-finite at step 2", "no checkpoint of it was saved"], [runs]  # fmt: skip


@stopped
def eval__model_outputs_are_nan(e: Env):
    model, _ = _with_nan(e, e.family["task"], "model")
    out = e.tmp / "raw.json"
    argv = ["eval", model, "--tasks", WORLD_TASK, "--world", str(e.world), "--limit", "2", "--max-gen-toks", "16", "--out", str(out)]  # fmt: skip
    return argv, 2, [f"{model}: the model's outputs are not finite", "no score"], [out]


# ------------------------------------------------------------------------------ kind 6: bounds


@refused
def eval__generation_budget_beyond_the_models_context(e: Env):
    # the red-team's case: lm-eval asserted it in a traceback once the model was loaded
    model = e.family["task"]
    argv = ["eval", str(model), "--tasks", WORLD_TASK, "--world", str(e.world), "--max-gen-toks", "100000"]  # fmt: skip
    return argv, ["--max-gen-toks 100000: the model's context is", f"{model}/config.json"]


@refused
def search__a_trillion_trials_and_generated_tokens(e: Env):
    # the red-team's case: it ran, "trial 54/1000000000000 ... ETA 198547085h"
    data = e.search_data()
    data["search"]["num_samples"] = 10**12
    data["proxy_eval"]["max_gen_toks"] = 10**11
    argv = ["search", e.search_exp(**data), "--out", e.at("run")]
    return argv, ["search.num_samples", "100000", "proxy_eval.max_gen_toks", "131072"]


@refused
def world__model_widths_multiply_past_memory(e: Env):
    # the red-team's case: each width within its bound, their product 16 GiB per matrix
    cfg = e.file("wide.yaml", "model: {hidden_size: 65536, intermediate_size: 65536, vocab_size: 65536, num_heads: 512, num_kv_heads: 512}\n")  # fmt: skip
    argv = ["world", "build", "--out", e.at("w"), "--size", "tiny", "--config", cfg]
    return argv, [f"{cfg}: invalid world config", "is more than a world pretrained on CPU may have (2,000,000,000)"]  # fmt: skip


@refused
def world__split_size_too_large(e: Env):
    cfg = e.file("variant.yaml", f"math_sft: {10**23}\n")
    argv = ["world", "build", "--out", e.at("w"), "--size", "tiny", "--config", cfg]
    return argv, [f"{cfg}: invalid world config", "math_sft: Input should be less than or equal to 1000000"]  # fmt: skip


@refused
def train__batch_size_too_large(e: Env):
    exp = e.train_exp(hyper=e.train_data()["hyper"] | {"batch_size": 10**12})
    return ["train", exp, "--out", e.at("runs"), "--no-ray"], ["hyper.batch_size: Input should be less than or equal to"]  # fmt: skip


@refused
def train__learning_rate_over_the_limit(e: Env):
    # 1e38 is finite, but AdamW's first step size (lr / 0.1) overflowed float32 in torch
    exp = e.train_exp(hyper=e.train_data()["hyper"] | {"lr": 1e38})
    return ["train", exp, "--out", e.at("runs"), "--no-ray"], ["hyper.lr: Input should be less than or equal to 1000"]  # fmt: skip


@refused
def analyze__resamples_over_the_limit(e: Env):
    argv = ["analyze", str(e.run), "--out", e.at("report"), "--resamples", "1000001"]
    return argv, ["--resamples", "expected at most 1000000 (the limit), got '1000001'"]


@refused
def demo__trials_over_the_limit(e: Env):
    argv = ["demo", "--out", e.at("demo"), "--world-size", "tiny", "--trials", str(10**9)]
    return argv, ["--trials", "expected at most 10000 (the limit), got '1000000000'"]


@refused
def plan__json_is_a_device_overwrite(e: Env):
    argv = ["plan", _plan_study(e), "--json", "/dev/full", "--overwrite"]
    return argv, ["--json", "/dev/full: is not a regular file"]


@refused
def schema__out_is_dev_null_overwrite(e: Env):
    argv = ["schema", "train", "--out", os.devnull, "--overwrite"]
    return argv, ["--out", f"{os.devnull}: is not a regular file"]


@refused
def eval__out_is_a_fifo(e: Env):
    # Beside the case's folder: the battery hashes every file under it, and a FIFO never ends.
    fifo = str(e.tmp.parent / f"{e.tmp.name}_raw.json")
    os.mkfifo(fifo)
    argv = ["eval", str(e.family["task"]), "--tasks", WORLD_TASK, "--world", str(e.world), "--out", fifo]  # fmt: skip
    return argv, ["--out", f"{fifo}: is not a regular file"]


# ---------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("make", REFUSED)
def test_bad_number_is_refused_and_changes_nothing(make, env, tree_state, capsys):  # noqa: F811
    refused_and_unchanged(make, env, tree_state, capsys)


# What a STOPPED case must reach for real: the tripwires of test_bad_input.py are lifted.
_REAL_WORK = {
    "layerswap.trainables.merge.engine.write_assembly": engine.write_assembly,
    "layerswap.trainables.train.run._train": train_run._train,
    "layerswap.trainables.evaluate.harness.evaluate": harness.evaluate,
}


@pytest.mark.parametrize("make", STOPPED)
def test_non_finite_work_stops_and_keeps_nothing(make, env, tree_state, capsys, monkeypatch):  # noqa: F811
    for target, real in _REAL_WORK.items():
        monkeypatch.setattr(target, real)
    argv, want_code, expected, outputs = make(env)
    shared = [r for r in _roots(env) if r != env.tmp]
    before = tree_state(*shared)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == want_code, err
    assert "Traceback" not in err
    missing = [s for s in expected if s not in err]
    assert not missing, f"stderr lacks {missing}:\n{err}"
    for out in outputs:  # a run folder may stay marked (kind 4's concern), but holds no checkpoint
        assert not (out.is_file() or _checkpoints(out)), f"{out} was written"
        assert out.is_dir() or not out.exists(), out
        if out.is_dir() and out.name != "runs":
            pytest.fail(f"{out} was written")
    assert not _changes(before, tree_state(*shared))
    assert not _leftovers(_roots(env))


def test_every_kind_has_three_cases():
    ids = [p.id for p in REFUSED + STOPPED]
    finite = [i for i in ids if "finite" in i or "nan" in i or "overflow" in i]
    bounds = [i for i in ids if "limit" in i or "large" in i or "regular" in i or "fifo" in i or "device" in i or "dev_null" in i]  # fmt: skip
    assert len(finite) >= 3 and len(bounds) >= 3, ids


def test_a_nan_base_is_refused_before_the_run_is_marked(env, capsys, monkeypatch):  # noqa: F811
    """The red-team's case: a NaN in the base used to be found when training loaded it, after
    the run folder was marked, and that mark blocked the corrected rerun."""
    for target, real in _REAL_WORK.items():
        monkeypatch.setattr(target, real)
    argv, _, expected, [runs] = train__base_has_a_nan_weight(env)
    capsys.readouterr()
    assert main(argv) == 2
    assert expected[0] in capsys.readouterr().err
    assert not runs.exists()  # nothing marked: the corrected rerun is not blocked
