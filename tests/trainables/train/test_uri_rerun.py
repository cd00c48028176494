"""Training into URI storage (file:// takes the s3:// code path) keeps the output policy: a changed
experiment is refused naming what changed, --overwrite starts over in a fresh Ray run and drops
the old one once the new one finished, a finished run is not trained again, a second writer is
refused, older checkpoints in the store lose their resume state, and a worker refuses a restored
checkpoint of another experiment.

Run: .venv/bin/python -m pytest -q tests/trainables/train/test_uri_rerun.py  (slow: two Ray fits)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from layerswap.cli import main
from layerswap.spaces.train_experiment import parse_train_experiment
from layerswap.trainables.merge.checkpoint import CheckpointError
from layerswap.trainables.outputs import OutputLocked
from layerswap.trainables.train.checkpoint_store import check_restored
from layerswap.trainables.train.run import train_expert


def _cfg(world: Path, store: Path, **hyper) -> dict:
    return {
        "name": "uri_t",
        "base": str(world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(world / "data/sft/math_en.jsonl")}],
        "mode": "full",
        "hyper": {"lr": 3e-3, "warmup_steps": 1, "batch_size": 8, "max_steps": 4, "seq_len": 64}
        | hyper,
        "checkpoint_every_samples": 16,
        "storage_path": f"file://{store}",
    }


def _write(tmp: Path, name: str, cfg: dict) -> str:
    f = tmp / name
    f.write_text(yaml.safe_dump(cfg))
    return str(f)


def _manifests(run: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in run.rglob("layerswap_train.json")]
    return sorted(found, key=lambda m: m["step"])


@pytest.mark.slow
def test_uri_run_refuses_a_changed_config_and_overwrite_starts_over(tiny_world, tmp_path, ray_session, capsys):  # fmt: skip
    store = tmp_path / "store"
    run = store / "uri_t"
    a = _write(tmp_path, "a.yaml", _cfg(tiny_world, store))
    b = _write(tmp_path, "b.yaml", _cfg(tiny_world, store, lr=9e-4, max_steps=6))
    assert main(["train", a]) == 0
    assert [m["step"] for m in _manifests(run)] == [2, 4]
    # resume_state newest: only the newest checkpoint keeps its optimizer state in the store
    old, new = sorted(p.parent for p in run.rglob("layerswap_train.json"))
    assert not list((old / "trainer_state").glob("optimizer__*"))
    assert json.loads((old / "trainer_state/state.json").read_text())["resumable"] is False
    assert list((new / "trainer_state").glob("optimizer__*"))
    capsys.readouterr()

    assert main(["train", b]) == 2  # another experiment, no flag: refused, nothing trained
    err = capsys.readouterr().err
    assert "different experiment" in err and "hyper.lr 0.003 -> 0.0009" in err, err
    assert [m["step"] for m in _manifests(run)] == [2, 4]

    assert main(["train", b, "--overwrite"]) == 0  # from step 1, not restored from step 4
    steps = [(m["step"], m["hparams"]["lr"]) for m in _manifests(run)]
    assert steps == [(2, 9e-4), (4, 9e-4), (6, 9e-4)], steps  # the old run is gone
    capsys.readouterr()
    assert main(["train", b]) == 0  # finished: nothing to train
    assert "already trained; nothing to do" in capsys.readouterr().out
    assert main(["train", a]) == 2  # the first config is now the changed one


@pytest.mark.slow
def test_uri_run_refuses_a_second_writer(tiny_world, tmp_path, ray_session):
    store = tmp_path / "store"
    exp = parse_train_experiment(_cfg(tiny_world, store), source="test")
    hold = (
        "import sys, time; from pathlib import Path\n"
        "from layerswap.trainables.outputs import writing\n"
        "with writing(Path(sys.argv[1])):\n print('held', flush=True); time.sleep(120)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", hold, str(store / "uri_t")], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(OutputLocked, match=r"another layerswap command is writing it: pid"):
            train_expert(exp, exp.storage_path)
        assert time.monotonic() - t0 < 10  # refused before Ray trains anything
    finally:
        p.kill()
        p.wait()
    assert not list(store.rglob("layerswap_train.json"))


def test_worker_refuses_a_restored_checkpoint_of_another_experiment(tiny_world, tmp_path):
    exp = parse_train_experiment(_cfg(tiny_world, tmp_path), source="test")
    other = parse_train_experiment(_cfg(tiny_world, tmp_path, lr=9e-4), source="test")
    ckpt = tmp_path / "samples_000000016"
    ckpt.mkdir()
    (ckpt / "layerswap_train.json").write_text(json.dumps({"experiment": other.model_dump(mode="json"), "step": 2}))  # fmt: skip
    with pytest.raises(CheckpointError, match="checkpoint of another experiment"):
        check_restored(exp, str(ckpt), "file:///s/uri_t/samples_000000016")
    check_restored(other, str(ckpt), "file:///s/uri_t/samples_000000016")  # its own: accepted


def test_store_run_in_s3_prunes_resume_state_and_drops_a_replaced_run(s3, tmp_path):
    """The store side on a real S3 server (moto): what Ray's own upload leaves is pruned and
    replaced through pyarrow's S3 filesystem, which has no rename."""
    from layerswap.trainables import storage
    from layerswap.trainables.outputs import MARKER
    from layerswap.trainables.train import checkpoint_store as store

    run = storage.join(s3.bucket(), "train", "t")
    for step in (2, 4):
        d = tmp_path / f"samples_{step}"
        (d / "trainer_state").mkdir(parents=True)
        (d / "trainer_state/optimizer__all.safetensors").write_bytes(b"moments")
        (d / "trainer_state/state.json").write_text(json.dumps({"step": step, "total_steps": 4}))
        (d / "layerswap_train.json").write_text(json.dumps({"step": step, "experiment": {}}))
        storage.upload_dir(d, storage.join(run, d.name))

    assert store.drop_older_resume_state(run) == 1
    rel = [f[len(run) + 1 :] for f in storage.list_files(run)]
    assert "samples_2/trainer_state/optimizer__all.safetensors" not in rel
    assert "samples_4/trainer_state/optimizer__all.safetensors" in rel
    assert json.loads(storage.read_text(f"{run}/samples_2/trainer_state/state.json"))["resumable"] is False  # fmt: skip
    assert store.last_checkpoint(run) == (f"{run}/samples_4", True)

    store.write_store_marker(run, store.new_marker("abc", "gen-x", replaces="."))
    assert store.read_store_marker(run)["generation"] == "gen-x"
    storage.upload_dir(tmp_path / "samples_4", f"{run}/gen-x/samples_4")
    store.delete_except(run, {MARKER, "gen-x"})  # the replacement finished: the old run goes
    rel = [f[len(run) + 1 :] for f in storage.list_files(run)]
    assert rel and all(r == MARKER or r.startswith("gen-x/samples_4/") for r in rel), rel
    store.delete_generation(run, "gen-x")
    assert [f[len(run) + 1 :] for f in storage.list_files(run)] == [MARKER]


def test_a_checkpoint_whose_upload_was_cut_is_not_complete(tmp_path):
    # Ray uploads a checkpoint's files in no fixed order: a manifest (and trainer state) that
    # arrived before the weights must not make the run "finished" with the weights missing.
    from layerswap.trainables.train import checkpoint_store as store

    ckpt = tmp_path / "run" / "samples_000000016"
    (ckpt / "trainer_state").mkdir(parents=True)
    (ckpt / "trainer_state/state.json").write_text(json.dumps({"step": 4, "total_steps": 4}))
    files = {"config.json": 3, "model.safetensors": 8}
    (ckpt / "layerswap_train.json").write_text(json.dumps({"step": 4, "files": files}))
    (ckpt / "config.json").write_text("{}\n")
    run = f"file://{tmp_path / 'run'}"
    assert store.checkpoints(run) == [] and store.last_checkpoint(run) == (None, False)
    (ckpt / "model.safetensors").write_bytes(b"1234")  # a part: not its full size
    assert store.checkpoints(run) == []
    (ckpt / "model.safetensors").write_bytes(b"12345678")
    assert store.last_checkpoint(run) == (f"{run}/samples_000000016", True)
    # A manifest written before manifests listed their files is taken at its word.
    (ckpt / "layerswap_train.json").write_text(json.dumps({"step": 4}))
    (ckpt / "model.safetensors").unlink()
    assert [u for u, _ in store.checkpoints(run)] == [f"{run}/samples_000000016"]
