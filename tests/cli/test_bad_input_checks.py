"""Check, then work; and Ctrl-C clean from the first instant (issue 41, kinds 4 and 5).

Kind 4: every input of `train` and `eval` is checked before anything is marked or written (a
dataset that is empty, in no known schema or too small; base weights truncated or pickled only;
a resume state that is damaged falls back to the previous intact checkpoint, said so), and an
I/O failure mid-run (a full disk, a file-size limit) is one line naming the path, nothing
half-written left. Kind 5: a signal before the command's own handler (during the imports, torch's
included) exits 130 with one line, and an interrupted `demo --merge-only` leaves no folder.

Run: .venv/bin/python -m pytest -q tests/cli/test_bad_input_checks.py   (about 3 min on 2 CPU
cores: two cases train the tiny model for real, a few run as processes)
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from layerswap.cli import main
from layerswap.spaces.train_experiment import (
    absolute_local_paths,
    experiment_identity,
    load_train_experiment,
)
from layerswap.trainables.output_markers import write_marker
from tests.cli.cli_process import leftovers

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
NAMES_A_LINE = re.compile(r"^layerswap: error: ", re.M)


def _exp(world: Path, tmp: Path, **over) -> Path:
    """An experiment file for a 2-step full fine-tune on the tiny world (`over` replaces keys)."""
    data = {
        "name": "t",
        "base": str(world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(world / "data/sft/math_en.jsonl")}],
        "mode": "full",
        "hyper": {"lr": 3e-3, "batch_size": 8, "max_steps": 2, "seq_len": 96, "seed": 0},
    } | over
    f = tmp / "exp.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def _refused(argv: list[str], capsys, *expected: str) -> str:
    """Run `argv` in-process; it must exit 2 with one `layerswap: error:` line naming `expected`."""
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(NAMES_A_LINE.findall(err)) == 1, err
    missing = [s for s in expected if s not in err]
    assert not missing, f"stderr lacks {missing}:\n{err}"
    return err


def _math_rows(world: Path, n: int) -> str:
    lines = (world / "data/sft/math_en.jsonl").read_text(encoding="utf-8").splitlines()
    return "".join(line + "\n" for line in lines[:n])


@pytest.fixture
def no_training(monkeypatch):
    """Bad input must be refused before the model loads: loading it fails the case."""

    def tripped(*args, **kwargs):
        pytest.fail("bad input got past the checks into the training run")

    monkeypatch.setattr("layerswap.trainables.train.run._train", tripped)


# ------------------------------------------------------------------- kind 4: data, checked first


def test_empty_dataset_marks_nothing_and_the_corrected_rerun_trains(tiny_world, tmp_path, capsys):
    """The reported case: an empty file left a marked run folder that blocked the rerun."""
    data = tmp_path / "math.jsonl"
    data.write_text("")
    f = _exp(tiny_world, tmp_path, datasets=[{"path": str(data)}], hyper={"lr": 3e-3, "batch_size": 8, "max_steps": 1, "seq_len": 96})  # fmt: skip
    out = tmp_path / "run"
    _refused(["train", str(f), "--out", str(out), "--no-ray"], capsys, f"{data}: no rows")
    assert not out.exists()
    data.write_text(_math_rows(tiny_world, 40))  # the user fixes the file in place
    assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 0, capsys.readouterr().err
    assert (out / "train/t/checkpoints/samples_000000008/layerswap_train.json").is_file()


def test_rows_in_no_known_schema_are_refused_before_work(tiny_world, tmp_path, capsys, no_training):  # fmt: skip
    data = tmp_path / "math.jsonl"
    data.write_text('{"q": "1+1?", "a": "2"}\n' * 20)
    f = _exp(tiny_world, tmp_path, datasets=[{"path": str(data)}])
    out = tmp_path / "run"
    _refused(["train", str(f), "--out", str(out), "--no-ray"], capsys, f"{data}:1: row has none of prompt/response")  # fmt: skip
    assert not out.exists()


def test_too_few_rows_for_the_validation_share_and_a_batch(tiny_world, tmp_path, capsys, no_training):  # fmt: skip
    data = tmp_path / "math.jsonl"
    data.write_text(_math_rows(tiny_world, 5))
    f = _exp(tiny_world, tmp_path, datasets=[{"path": str(data)}])
    out = tmp_path / "run"
    err = _refused(["train", str(f), "--out", str(out), "--no-ray"], capsys, f"datasets[0] ({data}): 5 rows")  # fmt: skip
    assert "hyper.batch_size 8" in err and "val_share" in err
    assert not out.exists()


# ---------------------------------------------------------------- kind 4: weights, checked first


def _truncated_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    return weights


def test_truncated_base_weights_in_train(tiny_world, tmp_path, capsys, no_training):
    weights = _truncated_copy(tiny_world / "base", tmp_path / "base")
    f = _exp(tiny_world, tmp_path, base=str(tmp_path / "base"))
    out = tmp_path / "run"
    _refused(["train", str(f), "--out", str(out), "--no-ray"], capsys, f"base: {weights}", "truncated")  # fmt: skip
    assert not out.exists()


def test_pickle_only_base_is_refused_by_name_in_train(tiny_world, tmp_path, capsys, no_training):
    base = tmp_path / "base"
    shutil.copytree(tiny_world / "base", base)
    (base / "model.safetensors").unlink()
    (base / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")  # never unpickled
    f = _exp(tiny_world, tmp_path, base=str(base))
    _refused(["train", str(f), "--out", str(tmp_path / "run"), "--no-ray"], capsys, f"base: {base}: only pickled weights (pytorch_model.bin)")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_truncated_model_weights_in_eval(tiny_world, tmp_path, capsys, monkeypatch):
    weights = _truncated_copy(tiny_world / "base", tmp_path / "model")
    monkeypatch.setattr("layerswap.trainables.evaluate.harness.evaluate", lambda *a, **k: pytest.fail("evaluated"))  # fmt: skip
    argv = ["eval", str(tmp_path / "model"), "--tasks", "world_mgsm_direct_xa_dev", "--world", str(tiny_world)]  # fmt: skip
    _refused(argv, capsys, str(weights), "truncated")


# ------------------------------------------------------------ kind 4: resume state, checked first


def test_truncated_optimizer_state_on_resume_falls_back(tiny_world, tmp_path, capsys):
    """The newest checkpoint's AdamW state is cut short: the run resumes from the previous
    intact one (every checkpoint keeps its resume state here) and says so; each step once."""
    f = _exp(tiny_world, tmp_path, hyper={"lr": 3e-3, "batch_size": 8, "max_steps": 3, "seq_len": 96}, checkpoint_every_samples=8, resume_state="all")  # fmt: skip
    out, run = tmp_path / "run", tmp_path / "run/train/t/checkpoints"
    assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 0
    shutil.rmtree(run / "samples_000000024")  # as if stopped after step 2
    damaged = run / "samples_000000016/trainer_state/optimizer__all.safetensors"
    with open(damaged, "r+b") as fh:
        fh.truncate(damaged.stat().st_size - 100)
    capsys.readouterr()
    assert main(["train", str(f), "--out", str(out), "--no-ray", "--resume"]) == 0
    std = capsys.readouterr()
    assert "Traceback" not in std.err
    assert f"{damaged}" in std.err and "truncated" in std.err, std.err
    assert f"resuming from the previous intact checkpoint {run / 'samples_000000008'}" in std.err
    assert "step 2 " in std.out and "step 3 " in std.out and "step 1 " not in std.out
    assert sorted(p.name for p in run.iterdir()) == [f"samples_0000000{n}" for n in ("08", "16", "24")]  # fmt: skip


def test_damaged_resume_state_without_an_intact_one_is_refused(tiny_world, tmp_path, capsys):
    """Only the newest checkpoint keeps resume state (the default): damaged, it is named, and
    nothing is touched."""
    f = _exp(tiny_world, tmp_path, hyper={"lr": 3e-3, "batch_size": 8, "max_steps": 2, "seq_len": 96}, checkpoint_every_samples=8)  # fmt: skip
    out, run = tmp_path / "run", tmp_path / "run/train/t/checkpoints"
    assert main(["train", str(f), "--out", str(out), "--no-ray"]) == 0
    state = run / "samples_000000016/trainer_state/state.json"
    state.write_text(
        state.read_text().replace('"total_steps": 2', '"total_steps": 5')
    )  # unfinished
    damaged = run / "samples_000000016/trainer_state/optimizer__all.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:50])
    _refused(["train", str(f), "--out", str(out), "--no-ray", "--resume"], capsys, str(damaged), "no earlier checkpoint keeps its resume state")  # fmt: skip


# --------------------------------------------------------------- kind 4: I/O failures mid-work


def _file_size_limit(limit: int):
    """Runs in the child before exec: writes past `limit` bytes fail (EFBIG), as a full disk's
    do (ENOSPC); SIGXFSZ ignored (inherited across exec) so the write returns the error."""

    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def test_a_write_failing_mid_run_is_one_line_naming_the_path(tiny_world, tmp_path):
    """The first checkpoint cannot be written (its weights exceed the file-size limit): one
    line naming the checkpoint, exit 1, no temporary folder left."""
    f = _exp(tiny_world, tmp_path, hyper={"lr": 3e-3, "batch_size": 8, "max_steps": 1, "seq_len": 96})  # fmt: skip
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "layerswap.cli", "train", str(f), "--out", str(out), "--no-ray"],
        cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": PYTHONPATH, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        preexec_fn=_file_size_limit(100_000),
        capture_output=True,
        text=True,
        timeout=300,
    )
    ckpt = out / "train/t/checkpoints/samples_000000008"
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"layerswap: failed: {ckpt}: could not be written (File too large" in proc.stderr, proc.stderr  # fmt: skip
    assert not ckpt.exists() and not leftovers(out)


# ------------------------------------------------------------- kind 5: signals from the first instant


def _spawn(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "layerswap.cli", *args],
        cwd="/",
        env=os.environ | {"PYTHONPATH": PYTHONPATH, "HF_HUB_OFFLINE": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def signal_once_mapped(proc: subprocess.Popen, library: str, sig: int) -> None:
    """Send `sig` as soon as the command has mapped a shared library whose name contains
    `library` (its import has begun), polling /proc; fails if it never does."""
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if library in Path(f"/proc/{proc.pid}/maps").read_text():
                os.kill(proc.pid, sig)
                return
        except OSError:
            break
        time.sleep(0.002)
    pytest.fail(f"{library} was never loaded (exit {proc.poll()})")


@pytest.mark.parametrize("sig,code,name", [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])  # fmt: skip
def test_a_signal_while_the_command_line_is_read(sig, code, name):
    """While the CLI's own imports run (pydantic's, before the parser exists), where Python's
    default turned SIGINT into a traceback and SIGTERM killed the process without a word."""
    proc = _spawn("schema", "train")
    signal_once_mapped(proc, "_pydantic_core", sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err == f"layerswap: interrupted ({name}) while starting; nothing was written\n"
    assert out == ""


def test_a_signal_while_torch_imports_exits_130(family, tmp_path):
    """The reported abort: SIGINT while torch's C++ extensions load (its Python bindings are
    mapped). The signal waits for the import to finish, then the command ends: one line."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"method": "layer_swap", "task_expert": family.ref("task"), "language_expert": family.ref("language"), "bottom": 2, "top": 2}))  # fmt: skip
    proc = _spawn("merge", str(recipe), "--out", str(tmp_path / "m"), "-q")
    signal_once_mapped(proc, "libtorch_python", signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == "layerswap: interrupted (SIGINT) while starting; nothing was written\n"
    assert not (tmp_path / "m").exists() and not leftovers(tmp_path)


def test_interrupted_merge_only_demo_leaves_no_folder(tmp_path):
    """The reported case: interrupted once its tiny family was written (while merging), the
    demo left a visible folder while saying nothing half-written was kept."""
    out = tmp_path / "demo"
    proc = _spawn("demo", "--merge-only", "--out", str(out), env={"PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    for line in proc.stdout:  # wait for the merge step
        lines.append(line)
        if line.startswith("[2/4]"):
            break
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(lines) + err
    assert "nothing half-written was kept" in err and "Traceback" not in err, err
    assert not out.exists() and not leftovers(tmp_path), sorted(os.listdir(tmp_path))


@pytest.mark.slow
def test_killed_merge_only_demo_leaves_no_folder_and_the_rerun_sweeps(tmp_path):
    """SIGKILL while the demo merges (a red-team's repro): the demo put its folder in place
    after stage 1 and merged inside it, so a kill left a half-built demo that a re-run called
    "already exists" and --overwrite refused over the dead merge's `.merged.tmp-*`. Now nothing
    is in place until the end, and the re-run takes over the stale lock and sweeps the rest."""
    out = tmp_path / "demo"
    proc = _spawn("demo", "--merge-only", "--out", str(out))
    merging = [f"{out.name}/.merged.tmp-*", f".{out.name}.tmp-*/.merged.tmp-*"]  # before, after
    deadline = time.monotonic() + 120
    while not any(p for g in merging for p in tmp_path.glob(g)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not out.exists(), sorted(os.listdir(out))
    rerun = _spawn("demo", "--merge-only", "--out", str(out))
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert f"removed .{out.name}.tmp-{proc.pid}-" in err, err
    assert (out / "merged" / "model.safetensors").is_file()
    assert not leftovers(tmp_path), leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name], sorted(os.listdir(tmp_path))


def _on_a_read_only_mount(folder: Path, command: str) -> subprocess.CompletedProcess:
    """Run the shell `command` with `folder` a read-only bind mount, in a mount namespace of its
    own (root ignores a folder's modes; a read-only file system it cannot); skipped where no such
    mount can be made, failed on CI."""
    read_only = f"mount --bind '{folder}' '{folder}' && mount -o remount,bind,ro '{folder}'"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", read_only], capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and no read-only mount can be made here: {probe.stderr}")
        pytest.skip(f"no read-only mount can be made here: {probe.stderr.strip()}")
    env = os.environ | {"PYTHONPATH": PYTHONPATH, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", f"{read_only} && exec {command}"], env=env, cwd="/", capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.slow
def test_overwrite_on_a_read_only_mount_is_refused_before_work(family, tmp_path):
    """`merge --overwrite` of an output on a read-only mount ended with exit 1 naming its lock
    file (the lock's write failed); it is an output location refused before work: exit 2,
    naming the output. A real read-only bind mount, in a mount namespace of the command's own."""
    folder = tmp_path / "ro"
    folder.mkdir()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"method": "layer_swap", "task_expert": family.ref("task"), "language_expert": family.ref("language"), "bottom": 2, "top": 2}))  # fmt: skip
    assert main(["merge", str(recipe), "--out", str(folder / "m"), "-q"]) == 0
    merge = (
        f"{sys.executable} -m layerswap.cli merge '{recipe}' --out '{folder / 'm'}' --overwrite -q"
    )
    r = _on_a_read_only_mount(folder, merge)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"layerswap: error: {folder / 'm'}: cannot be replaced or continued, {folder} is not writable\n"  # fmt: skip


@pytest.mark.slow
def test_resume_of_a_read_only_run_folder_in_a_writable_one_is_refused_before_work(tiny_world, tmp_path):  # fmt: skip
    """`train --resume` writes inside its run folder: a read-only one (here a mount) in a
    writable folder passed the check and failed at the first write, exit 1; it is refused before
    work, exit 2, naming the run folder."""
    f = _exp(tiny_world, tmp_path)
    run = tmp_path / "run" / "train" / "t"  # as `train` leaves it once started
    run.mkdir(parents=True)
    write_marker(run, "train", experiment_identity(absolute_local_paths(load_train_experiment(f))))
    train = f"{sys.executable} -m layerswap.cli train '{f}' --out '{tmp_path / 'run'}' --resume --no-ray"  # fmt: skip
    r = _on_a_read_only_mount(run, train)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"layerswap: error: {run}: cannot be continued, it is not writable\n"
