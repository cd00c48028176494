"""`layerswap train` in-process (--no-ray): validates first, trains, prints the checkpoints;
a `sweep:` block goes to the sweep hook.

Run: .venv/bin/python -m pytest tests/cli/test_train.py
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import huggingface_hub.constants as hub_constants
import pytest
import yaml
from huggingface_hub.errors import (
    GatedRepoError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
)

from layerswap.cli import main
from layerswap.cli import train_inputs as cli_train
from tests.trainables.train.train_helpers import make_exp


def _write(tmp_path: Path, exp_dict: dict) -> Path:
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(exp_dict))
    return f


def test_train_no_ray_writes_checkpoints(tiny_world, tmp_path, capsys):
    exp = make_exp(tiny_world, "full", hyper={"max_steps": 4}, checkpoint_every_samples=16, name="cli_t")  # fmt: skip
    f = _write(tmp_path, exp.model_dump(mode="json"))
    assert main(["train", str(f), "--out", str(tmp_path / "run"), "--no-ray"]) == 0
    out = capsys.readouterr().out
    run = tmp_path / "run/train/cli_t"
    assert f"checkpoints under {run}" in out
    assert (run / "checkpoints/samples_000000016/layerswap_train.json").is_file()
    assert out.strip().endswith(f"last checkpoint: {run / 'checkpoints/samples_000000032'}")


def test_train_validates_before_any_work(tiny_world, tmp_path, capsys):
    exp = make_exp(tiny_world, "full").model_dump(mode="json")
    exp["datasets"] = [{"path": str(tmp_path / "nope.jsonl")}]
    assert main(["train", str(_write(tmp_path, exp)), "--no-ray"]) == 2
    assert "datasets[0].path" in capsys.readouterr().err
    exp["hyper"]["bogus"] = 1
    assert main(["train", str(_write(tmp_path, exp)), "--no-ray"]) == 2
    assert "hyper.bogus" in capsys.readouterr().err
    assert not (tmp_path / "train").exists()


def test_sweep_block_goes_to_the_sweep_hook(tiny_world, tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("layerswap.experts.sweep")
    # one ok trial with one scored checkpoint: a sweep that scored none exits 1 (cli/train_sweep.py)
    done = types.SimpleNamespace(trials={"t0": "ok"}, rows=[{"trial_id": "t0"}], best=[], seconds=0.0, registry="r", metric_task="m")  # fmt: skip
    fake.run_sweep = lambda exp, run_dir, **kw: calls.append((exp.name, run_dir)) or done
    # Ray starts, and every node's view of the inputs is checked, before the sweep's folder
    fake.start_sweep_ray = lambda exp, verbose=0: calls.append(("nodes checked", (tmp_path / "run").exists()))  # fmt: skip
    monkeypatch.setitem(sys.modules, "layerswap.experts.sweep", fake)
    exp = make_exp(tiny_world, "full", sweep={"num_samples": 4, "params": {"hyper.lr": {"low": 1e-4, "high": 1e-2, "log": True}}})  # fmt: skip
    f = _write(tmp_path, exp.model_dump(mode="json"))
    assert main(["train", str(f), "--out", str(tmp_path / "run")]) == 0
    assert calls == [("nodes checked", False), ("t", tmp_path / "run")]


def _steps(run: Path) -> list[int]:
    """The step of every checkpoint under a run, read from the manifests on disk."""
    import json

    return sorted(json.loads(p.read_text())["step"] for p in run.rglob("layerswap_train.json"))


def test_reruns_are_explicit(tiny_world, tmp_path, capsys, tree_state):
    exp = make_exp(tiny_world, "full", hyper={"max_steps": 2}, checkpoint_every_samples=8, name="re")  # fmt: skip
    f = _write(tmp_path, exp.model_dump(mode="json"))
    out, run = tmp_path / "run", tmp_path / "run/train/re"
    assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 0
    capsys.readouterr()
    before = tree_state(run)
    # the same experiment, finished: nothing to do, nothing touched
    assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 0
    assert "already trained; nothing to do" in capsys.readouterr().out
    # a changed experiment is refused without --overwrite, and --resume does not mix them
    changed = exp.model_dump(mode="json") | {"hyper": exp.hyper.model_dump(mode="json") | {"lr": 0.5}}  # fmt: skip
    (tmp_path / "changed").mkdir()
    g = _write(tmp_path / "changed", changed)
    for extra in ([], ["--resume"]):
        assert main(["train", str(g), "--out", str(out), "--no-ray", *extra]) == 2
        err = capsys.readouterr().err
        assert "different experiment" in err and str(run) in err and "Traceback" not in err
    assert tree_state(run) == before
    # --overwrite starts over with the new config; the old run is gone only once it is done
    assert main(["train", str(g), "--out", str(out), "--no-ray", "--overwrite"]) == 0
    assert tree_state(run) != before and _steps(run) == [1, 2]
    assert not list(run.parent.glob(".re.replaced-*"))
    import json

    man = json.loads(next(run.rglob("layerswap_train.json")).read_text())
    assert man["hparams"]["lr"] == 0.5


def test_an_unfinished_run_needs_resume(tiny_world, tmp_path, capsys):
    import shutil

    # Stopped after step 2 is simulated by deleting the later checkpoints, so step 2's must keep
    # its resume state (by default only the newest does; a real stop leaves step 2 the newest).
    exp = make_exp(tiny_world, "full", hyper={"max_steps": 4}, checkpoint_every_samples=8, name="un", resume_state="all")  # fmt: skip
    f = _write(tmp_path, exp.model_dump(mode="json"))
    out, run = tmp_path / "run", tmp_path / "run/train/un"
    assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 0
    assert _steps(run) == [1, 2, 3, 4]
    for ck in sorted(run.rglob("layerswap_train.json"))[2:]:  # as if stopped after step 2
        shutil.rmtree(ck.parent)
    capsys.readouterr()
    assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["train", str(f), "--out", str(out), "--no-ray", "--resume"]) == 0
    assert _steps(run) == [1, 2, 3, 4]  # each step once: continued at 3, not started over


def test_a_cached_hub_base_of_an_unmerged_family_is_refused_online_too(tiny_world, tmp_path, monkeypatch, capsys):  # fmt: skip
    """A Hub base whose config.json is in the HF cache is checked for its family whether the
    Hub is on or off: with HF_HUB_OFFLINE=0 the check was skipped, and the trainer downloaded
    and loaded the whole model before refusing it, after marking the run (a review)."""
    snap = tmp_path / "hub/models--acme--gemma2/snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (tmp_path / "hub/models--acme--gemma2/refs").mkdir()
    (tmp_path / "hub/models--acme--gemma2/refs/main").write_text("0" * 40)
    (snap / "config.json").write_text('{"model_type": "gemma2"}')
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    exp = make_exp(tiny_world, "full", base="acme/gemma2").model_dump(mode="json")
    run = tmp_path / "run"
    assert main(["train", str(_write(tmp_path, exp)), "--out", str(run), "--no-ray"]) == 2
    assert "model_type 'gemma2' is not supported; supported: llama" in capsys.readouterr().err
    assert not run.exists()


def _bare(cls):  # a huggingface_hub error without the HTTP response its __init__ needs
    return cls.__new__(cls)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"model_type": "gemma2"}, "model_type 'gemma2' is not supported; supported: llama"),
        (_bare(GatedRepoError), "a gated Hub repo this machine may not read"),
        (_bare(RepositoryNotFoundError), "no such Hub repo"),
        (_bare(RemoteEntryNotFoundError), "the Hub repo has no config.json"),
        (_bare(LocalEntryNotFoundError), "the Hugging Face Hub did not answer"),
    ],
)
def test_an_uncached_hub_base_is_checked_online_before_the_run_is_marked(answer, message, tiny_world, tmp_path, monkeypatch, capsys):  # fmt: skip
    """Online, an uncached Hub base's config.json is fetched at the edge: a gated, missing or
    unreachable repo, or an unmerged family, used to fail in the trainer after the run folder
    was marked (and only after the whole model was downloaded, for a family)."""
    fetched = []

    def fake_download(repo_id, filename, **_kw):
        fetched.append((repo_id, filename))
        if isinstance(answer, Exception):
            raise answer
        (tmp_path / "config.json").write_text(json.dumps(answer))
        return str(tmp_path / "config.json")

    monkeypatch.setattr(cli_train, "hf_hub_download", fake_download)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    exp = make_exp(tiny_world, "full", base="acme/nothere").model_dump(mode="json")
    run = tmp_path / "run"
    assert main(["train", str(_write(tmp_path, exp)), "--out", str(run), "--no-ray"]) == 2
    assert message in capsys.readouterr().err
    assert fetched == [("acme/nothere", "config.json")]
    assert not run.exists()


def test_an_uncached_hub_base_of_a_merged_family_passes_the_edge(tiny_world, tmp_path, monkeypatch):  # fmt: skip
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    monkeypatch.setattr(cli_train, "hf_hub_download", lambda *a, **k: str(tmp_path / "config.json"))
    cli_train.check_inputs(make_exp(tiny_world, "full", base="acme/llama"))  # no ValueError


def test_a_changed_config_takes_over_a_run_that_saved_no_checkpoint(tiny_world, tmp_path, capsys):  # fmt: skip
    # A run that failed in its workers (rows too long for seq_len) left its marked folder and
    # no checkpoint: the corrected config reruns without --overwrite, saying so in one line.
    from layerswap.spaces.train_experiment import absolute_local_paths, experiment_identity
    from layerswap.trainables.outputs import write_marker

    failed = make_exp(tiny_world, "full", hyper={"max_steps": 2, "seq_len": 8}, name="tk")
    run = tmp_path / "run/train/tk"
    run.mkdir(parents=True)
    write_marker(run, "train", experiment_identity(absolute_local_paths(failed)))
    (run / "left_by_ray.json").write_text("{}")
    fixed = make_exp(tiny_world, "full", hyper={"max_steps": 2}, checkpoint_every_samples=8, name="tk")  # fmt: skip
    f = _write(tmp_path, fixed.model_dump(mode="json"))
    assert main(["train", str(f), "--out", str(tmp_path / "run"), "--no-ray"]) == 0
    err = capsys.readouterr().err
    said = [ln for ln in err.splitlines() if "saved no checkpoint" in ln]
    assert said == [f"layerswap: {run}: holds a run of another experiment that saved no checkpoint; this one replaces it"], err  # fmt: skip
    assert _steps(run) == [1, 2] and not (run / "left_by_ray.json").exists()


@pytest.mark.parametrize("left", ["tuner.pkl", "sweep_finished.json"])
def test_a_sweeps_folder_is_not_taken_over_without_overwrite(left, tiny_world, tmp_path, capsys):
    """An expert sweep's folder holds Tune's state (what its --continue resumes from) and no
    checkpoint of its own: a plain run of the same name needs --overwrite to replace it."""
    from layerswap.cli.train_sweep import SWEEP_FINISHED
    from layerswap.experts.sweep_tuner import TUNER_FILE
    from layerswap.spaces.train_experiment import absolute_local_paths, experiment_identity
    from layerswap.trainables.outputs import write_marker
    from layerswap.trainables.train.run import SWEEP_FILES

    assert SWEEP_FILES == (TUNER_FILE, SWEEP_FINISHED)  # the mirror, pinned
    sweep = make_exp(tiny_world, "full", name="sw", sweep={"num_samples": 2, "params": {"hyper.lr": {"low": 1e-4, "high": 1e-2, "log": True}}})  # fmt: skip
    run = tmp_path / "run/train/sw"
    run.mkdir(parents=True)
    write_marker(run, "train", experiment_identity(absolute_local_paths(sweep)))
    (run / left).write_bytes(b"state")
    plain = make_exp(tiny_world, "full", hyper={"max_steps": 2}, name="sw")
    f = _write(tmp_path, plain.model_dump(mode="json"))
    assert main(["train", str(f), "--out", str(tmp_path / "run"), "--no-ray"]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert (run / left).read_bytes() == b"state"


def test_out_replacing_storage_path_is_said(tiny_world, tmp_path, monkeypatch, capsys):
    import layerswap.trainables.train as train_pkg

    went = []
    monkeypatch.setattr(train_pkg, "train_expert", lambda exp, storage, **kw: went.append(storage))
    exp = make_exp(tiny_world, "full", name="sp").model_dump(mode="json")
    out = tmp_path / "run"
    # the default written out (a config dumped whole) is no choice of the user's: not said
    cases = (("s3://my-bucket/runs", True), (str(out / "train"), False), ("runs/train", False))
    for storage_path, said in cases:
        f = _write(tmp_path, exp | {"storage_path": storage_path})
        assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 0
        err = capsys.readouterr().err
        line = f"layerswap: --out {out} replaces storage_path {storage_path}: checkpoints go to {out / 'train/sp'}"  # fmt: skip
        assert (line in err.splitlines()) is said, err
    assert went == [str(out / "train")] * 3


def test_an_unreachable_hub_is_one_line_not_five_retries(tiny_world, tmp_path, monkeypatch, capsys):  # fmt: skip
    """huggingface_hub logs each of its 5 connection retries (~23 s): the edge says once why it
    waits, and what to do, not five "Retrying in 8s" lines."""
    import logging

    http_log = logging.getLogger("huggingface_hub.utils._http")

    def unreachable(*_a, **_kw):
        for s in (1, 2, 4, 8, 8):
            http_log.warning(f"Retrying in {s}s [Retry n/5].")
        raise _bare(LocalEntryNotFoundError)

    monkeypatch.setattr(cli_train, "hf_hub_download", unreachable)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    level = http_log.level
    exp = make_exp(tiny_world, "full", base="acme/far").model_dump(mode="json")
    assert main(["train", str(_write(tmp_path, exp)), "--out", str(tmp_path / "run"), "--no-ray"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "Retrying" not in err and "set HF_HUB_OFFLINE=1" in err, err
    assert "layerswap: base acme/far: reading its config.json from the Hub" in err, err
    assert http_log.level == level
