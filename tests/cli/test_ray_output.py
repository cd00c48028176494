"""Ray's own notices stay out of a command's output unless it runs with --verbose: Tune's
configuration box, its results path and TensorBoard hint, Ray's token authentication notice and
Optuna's "new study" log line (trainables/ray_session.py: init_ray, tune_output).

Real commands in processes of their own, on the tiny world: a one-trial search, quiet and
--verbose (the verbose run shows the texts are still Ray's to print, so their absence is not a
wording change), and a one-trial expert sweep, quiet.

Run: .venv/bin/python -m pytest -q tests/cli/test_ray_output.py   (slow: about 45 s per command
on an idle 2-core machine, 1.5-2 min each under load)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.trainables.train.train_helpers import TINY_SWEEP, make_exp

pytestmark = pytest.mark.slow

# What each source prints (ray 2.60: tune/experimental/output.py, _private/authentication/
# authentication_token_setup.py; optuna 5.0: storages).
RAY_TEXTS = {
    "Tune's configuration box": "Configuration for experiment",
    "Tune's results path": "View detailed results here",
    "Tune's TensorBoard hint": "tensorboard --logdir",
    "Ray's token notice": "Token authentication is enabled",
    "Optuna's study log": "A new study created",
}


def _search_yaml(world: Path, experts: dict[str, Path], tmp: Path) -> Path:
    from tests.search.search_fixtures import experiment

    exp = experiment(
        world,
        experts,
        proxy_eval={"limit": 2, "max_gen_toks": 2},
        search={"num_samples": 1, "max_concurrent": 1, "fidelity": {"screen": None}},
    )
    f = tmp / "search.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    return f


def _sweep_yaml(world: Path, tmp: Path) -> Path:
    sweep = dict(TINY_SWEEP)
    hyper = {"lr": 1e-3, "max_steps": 2, "batch_size": 4, "seq_len": 64, "warmup_steps": 0}
    exp = make_exp(world, name="sw", hyper=hyper, checkpoint_every_samples=8, sweep=sweep)
    f = tmp / "sweep.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json", exclude_none=True)))
    return f


def _printed(c) -> tuple[int, str]:
    code = c.finish()
    return code, c.stdout + c.stderr


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_search_prints_ray_notices_only_when_verbose(tiny_world, expert_pair, tmp_path, cli, ray_tmp, verbose, monkeypatch):  # fmt: skip
    # A user who never chose an authentication mode (Ray prints its token notice only then): a
    # local ray.init earlier in this test process records RAY_AUTH_MODE=token in its environment
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    f = _search_yaml(tiny_world, expert_pair, tmp_path)
    flags = ["--verbose"] if verbose else []
    c = cli("search", f, "--out", tmp_path / "run", "--no-promote", *flags, env=ray_tmp.env)
    code, out = _printed(c)
    assert code == 0, c.tail()
    assert "[search] trial 1/1" in c.stdout, c.tail()  # layerswap's own line, either way
    shown = {what for what, text in RAY_TEXTS.items() if text in out}
    assert shown == (set(RAY_TEXTS) if verbose else set()), c.tail()


def test_sweep_is_quiet_without_verbose(tiny_world, tmp_path, cli, ray_tmp):
    c = cli("train", _sweep_yaml(tiny_world, tmp_path), "--out", tmp_path / "run", env=ray_tmp.env)
    code, out = _printed(c)
    assert code == 0, c.tail()
    assert "expert sweep sw: 1 trials" in c.stdout, c.tail()
    shown = {what for what, text in RAY_TEXTS.items() if text in out}
    assert not shown, c.tail()
    # Ray's INFO log too ("Started a local Ray instance"; Tune's "Wrote the latest version").
    assert "Started a local Ray instance" not in out and "Wrote the latest" not in out, c.tail()
