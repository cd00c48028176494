"""Writers of one output, and what `--overwrite` may replace (issue 41, kinds 1 and 2).

One writer per output: a command that writes a world, run folder, model or result file holds
its lock (`.NAME.layerswap.lock` beside it) while it runs; a second writer is refused in one
line naming the owner (pid, host, command, since when), exit 2, before any work, and the
first's output is left as it was. The first writer here is a real `layerswap` process, stopped
(SIGSTOP) once its lock is taken; the second runs in this process, with tripwires on the first
step of real work. A lock whose owner died is taken over, saying so.

`--overwrite` replaces only what layerswap wrote: a file added to an output is refused, named;
a search replaces only the RUN/promotion, RUN/leaderboard.md and RUN/best a search there wrote;
outputs never nest inside another layerswap output, nor go into the installed package without
`--maintainer`. These cases follow tests/cli/test_bad_input.py (exit 2, the message named,
nothing changed, no temporary sibling left).

Run: .venv/bin/python -m pytest -q tests/cli/test_bad_input_writers.py   (about a minute on 2
CPU cores, most of it the holders' imports; -m "not slow" skips the world build that finishes)
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from layerswap.cli import main
from layerswap.world import prebuilt
from tests.cli.cli_process import leftovers
from tests.cli.test_bad_input import (
    TRIPPED,
    WORLD_TASK,
    Env,
    _changes,
    _leftovers,
    _roots,
    case_list,
)


@pytest.fixture
def env(tmp_path, monkeypatch, tiny_world, family, expert_pair, analysis_run, merged_model) -> Env:
    """A case's folder, also the working directory (as in test_bad_input)."""
    monkeypatch.chdir(tmp_path)
    return Env(tmp_path, tiny_world, family.paths, expert_pair, analysis_run, merged_model)


@pytest.fixture
def tripwires(monkeypatch):
    """The first step of real work in each command fails the case at once."""

    def trip(where: str):
        def tripped(*args, **kwargs):
            pytest.fail(f"got past the checks into {where}")

        return tripped

    for target in TRIPPED:
        monkeypatch.setattr(target, trip(target))


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """`layerswap ARGV` in this process: (exit code, stderr)."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    return code, capsys.readouterr().err


def _lock_of(out: str | Path) -> Path:
    """Where the lock of `out` lives (the contract: `.NAME.layerswap.lock` beside it)."""
    out = Path(out).resolve()
    return out.parent / f".{out.name}.layerswap.lock"


def _owner(lock: Path) -> dict:
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return {}


def _stopped_holder(cli, argv: list, out: str | Path, env: dict | None = None):
    """Start `layerswap ARGV` and SIGSTOP it once it holds the lock of `out`."""
    c = cli(*argv, env=env)
    lock = _lock_of(out)
    c.wait_for(lambda: _owner(lock).get("pid") == c.proc.pid, f"its lock {lock}", timeout=180)
    os.kill(c.proc.pid, signal.SIGSTOP)
    return c


def _refused_by(holder, code: int, err: str, out: str | Path, command: str) -> None:
    """The second writer's refusal: exit 2, one line naming the output and its owner."""
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    for part in (str(out), f"pid {holder.proc.pid}", f"host {os.uname().nodename}", command, "since "):  # fmt: skip
        assert part in line, f"{part!r} not in {line!r}"


# ------------------------------------------------------------------ kind 1: one writer per output


@pytest.mark.slow
def test_world_build_beside_a_running_one(env: Env, cli, tree_state, tripwires, capsys):
    """Two `world build`s into one folder both printed "built"; now the second is refused, as
    is an output inside the world being built, and the first builds its world."""
    w = env.at("w")
    recipe = env.recipe()
    first = _stopped_holder(cli, ["world", "build", "--out", w, "--size", "tiny"], w)
    before = tree_state(env.tmp)
    code, err = _run(["world", "build", "--out", w, "--size", "tiny", "--overwrite"], capsys)
    _refused_by(first, code, err, w, "world build")
    code, err = _run(["merge", recipe, "--out", f"{w}/merged", "-q"], capsys)
    assert code == 2 and f"{w}/merged: lies inside {w}" in err and f"pid {first.proc.pid}" in err, err  # fmt: skip
    assert not _changes(before, tree_state(env.tmp))
    os.kill(first.proc.pid, signal.SIGCONT)
    assert first.finish() == 0, first.tail()
    assert "world: built" in first.stdout
    assert main(["world", "build", "--out", w, "--size", "tiny"]) == 0  # intact: a no-op
    assert not _lock_of(w).exists() and not leftovers(env.tmp)


def test_train_beside_a_running_one(env: Env, cli, tree_state, tripwires, capsys):
    """Two `train`s ran the same run at once; now the second is refused and the first trains."""
    exp = env.train_exp(hyper=env.train_data()["hyper"] | {"max_steps": 1})
    run = env.at("run/train/t")
    first = _stopped_holder(cli, ["train", exp, "--out", env.at("run"), "--no-ray"], run)
    before = tree_state(env.tmp)
    code, err = _run(["train", exp, "--out", env.at("run"), "--no-ray", "--resume"], capsys)
    _refused_by(first, code, err, run, "train")
    assert not _changes(before, tree_state(env.tmp))
    os.kill(first.proc.pid, signal.SIGCONT)
    first.interrupt(signal.SIGINT)  # its run stays its own, to continue with --resume
    assert not _lock_of(run).exists() and not leftovers(env.tmp)


def test_eval_out_beside_a_running_one(env: Env, cli, tree_state, tripwires, capsys):
    """Two `eval --out X` both exited 0, one result surviving; now the second is refused."""
    out = env.at("raw.json")
    argv = ["eval", str(env.family["task"]), "--tasks", WORLD_TASK, "--world", str(env.world)]
    argv += ["--limit", "1", "--max-gen-toks", "4", "--device", "cpu"]
    first = _stopped_holder(cli, [*argv, "--out", out], out)
    before = tree_state(env.tmp)
    code, err = _run([*argv, "--out", out, "--overwrite"], capsys)
    _refused_by(first, code, err, out, "eval")
    assert not _changes(before, tree_state(env.tmp))
    os.kill(first.proc.pid, signal.SIGCONT)
    first.interrupt(signal.SIGINT)  # its own output: nothing half-written kept
    assert not Path(out).exists() and not _lock_of(out).exists() and not leftovers(env.tmp)


def test_merge_demo_beside_a_running_one(env: Env, cli, tree_state, monkeypatch, capsys):
    """A merge-only demo wrote its stages 2-4 into its folder after releasing the lock, so a
    second `--overwrite` then set the first's demo aside and built its own, which the first,
    failing, would remove; now the whole demo holds the lock and the second is refused."""
    out = env.at("md")
    first = cli("demo", "--merge-only", "--out", out)
    first.wait_for(lambda: "[2/4]" in first.stdout, "its stage 2", timeout=180)
    os.kill(first.proc.pid, signal.SIGSTOP)
    monkeypatch.setattr("layerswap.demo.merge_only.make_tiny_family", lambda *a, **k: pytest.fail("the second demo got to work"))  # fmt: skip
    before = tree_state(env.tmp)
    code, err = _run(["demo", "--merge-only", "--out", out, "--overwrite"], capsys)
    _refused_by(first, code, err, out, "demo")
    assert not _changes(before, tree_state(env.tmp))
    os.kill(first.proc.pid, signal.SIGCONT)
    assert first.finish() == 0, first.tail()
    assert (Path(out) / "merged" / "config.json").is_file()
    assert not _lock_of(out).exists() and not leftovers(env.tmp)


@pytest.mark.slow
def test_search_resume_beside_a_running_search(env: Env, cli, ray_tmp, tree_state, tripwires, capsys):  # fmt: skip
    """`search --resume` beside a live search crashed one of them and finished trials vanished
    from trials.parquet; now the resume is refused and the running search is left alone."""
    exp = env.search_exp()
    run = env.at("run")
    first = _stopped_holder(cli, ["search", exp, "--out", run, "--no-promote"], f"{run}/search", env=ray_tmp.env)  # fmt: skip
    before = tree_state(env.tmp)
    code, err = _run(["search", exp, "--out", run, "--resume", "--no-promote"], capsys)
    _refused_by(first, code, err, f"{run}/search", "search")
    assert not _changes(before, tree_state(env.tmp))
    os.kill(first.proc.pid, signal.SIGCONT)
    first.interrupt(signal.SIGINT)
    ray_tmp.assert_gone()
    assert not _lock_of(f"{run}/search").exists()


def test_a_stale_lock_is_taken_over_and_named(env: Env, monkeypatch, capsys):
    """A lock left by a killed command (its pid gone) is taken over, saying whose it was."""
    monkeypatch.setattr("layerswap.world.prebuilt.BASES_DIR", env.tmp / "bases")
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    lock = _lock_of(env.tmp / "bases" / "b")
    lock.parent.mkdir()
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    record = {"pid": dead, "host": os.uname().nodename, "command": "layerswap world export-base w --name b", "since": since}  # fmt: skip
    lock.write_text(json.dumps(record))
    code, err = _run(["world", "export-base", str(env.world), "--name", "b"], capsys)
    assert code == 0, err
    assert f"taking over a stale lock of pid {dead}" in err and since in err, err
    assert (env.tmp / "bases/b/prebuilt.json").is_file() and not lock.exists()


# ------------------------------------------------ kind 2: --overwrite replaces only what it wrote

CASES, case = case_list()


@case
def search__overwrite_with_a_leaderboard_it_did_not_write(e: Env):
    data = e.search_data()
    e.earlier_search("run", data)
    board = e.file("run/leaderboard.md", "# my notes on this run\n")
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--overwrite"]
    return argv, [f"{board}: exists and was not written by the search in {e.at('run/search')}"]


@case
def search__overwrite_with_a_promotion_folder_it_did_not_write(e: Env):
    e.earlier_search("run", e.search_data())
    mine = e.folder("run/promotion")
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--overwrite", "--no-promote"]
    return argv, [f"{mine}: exists and was not written by the search"]


@case
def search__new_search_would_promote_over_a_users_leaderboard(e: Env):
    board = e.file("run/leaderboard.md", "# my notes on this run\n")
    return ["search", e.search_exp(), "--out", e.at("run")], [f"{board}: exists and was not written by the search"]  # fmt: skip


@case
def merge__overwrite_a_merged_folder_holding_a_users_file(e: Env):
    out = e.copy(e.merged, "merged")
    Path(out, "eval_notes.md").write_text("my notes\n")
    return ["merge", e.recipe(), "--out", out, "--overwrite", "-q"], [f"{out}: holds what layerswap did not write there (eval_notes.md)"]  # fmt: skip


@case
def world__overwrite_a_world_holding_trained_experts(e: Env):
    w = e.copy(e.world, "world")
    e.file("world/train/t/checkpoints/samples_000000016/model.safetensors", b"weights")
    argv = ["world", "build", "--out", w, "--size", "tiny", "--seed", "1", "--overwrite"]
    return argv, [f"{w}: holds what layerswap did not write there (train/)"]  # fmt: skip


@case
def train__out_inside_a_world(e: Env):
    w = e.copy(e.world, "world")
    argv = ["train", e.train_exp(), "--out", w, "--no-ray"]
    return argv, [f"{w}/train/t: lies inside {w}, which holds an embedded world"]


@case
def merge__out_inside_a_merged_model(e: Env):
    m = e.copy(e.merged, "merged")
    return ["merge", e.recipe(), "--out", f"{m}/again", "-q"], [f"{m}/again: lies inside {m}, which holds a merged model"]  # fmt: skip


@case
def world__export_base_into_the_package_without_maintainer(e: Env):
    dest = prebuilt.BASES_DIR / "full-v4-seed0"  # the real one, inside the package
    argv = ["world", "export-base", str(e.world), "--name", "full-v4-seed0", "--overwrite"]
    return argv, [f"{dest}: is inside the installed layerswap package", "--maintainer"]


@pytest.mark.parametrize("make", CASES)
def test_overwrite_replaces_only_what_layerswap_wrote(make, env: Env, tree_state, tripwires, monkeypatch, capsys):  # fmt: skip
    argv, expected = make(env)
    # A copy that lands in the package would change shipped files: a tripwire, as for work.
    monkeypatch.setattr(prebuilt.shutil, "copyfile", lambda *a: pytest.fail("copied into the package"))  # fmt: skip
    roots = _roots(env)
    shipped = prebuilt.BASES_DIR
    before = tree_state(*roots, shipped)
    code, err = _run(argv, capsys)
    assert code == 2, err
    assert "Traceback" not in err
    missing = [s for s in expected if s not in err]
    assert not missing, f"stderr lacks {missing}:\n{err}"
    assert not _changes(before, tree_state(*roots, shipped))
    assert not _leftovers([*roots, shipped])


def test_merge_only_demo_overwrite_owns_its_merged_model(env: Env, capsys):
    """The merge-only demo's merged/ is an output of its own steps (its own marker): --overwrite
    replaces an untouched demo, and names a file the user put inside merged/."""
    out = env.at("mo")
    assert _run(["demo", "--merge-only", "--out", out], capsys)[0] == 0
    code, err = _run(["demo", "--merge-only", "--out", out, "--overwrite"], capsys)
    assert code == 0, err
    Path(out, "merged", "mine.txt").write_text("my notes\n")
    code, err = _run(["demo", "--merge-only", "--out", out, "--overwrite"], capsys)
    assert code == 2 and f"{out}: holds what layerswap did not write there (merged/mine.txt)" in err, err  # fmt: skip
    assert Path(out, "merged", "mine.txt").read_text() == "my notes\n"


def test_a_steps_lock_file_inside_a_demo_is_not_the_users(env: Env, capsys):
    """A killed merge-only demo leaves its merged/ step's lock file (.merged.layerswap.lock)
    inside the demo's folder: layerswap's own, not a file to keep, so --overwrite replaces the
    demo (it was named as "what layerswap did not write there"; CI met it while a running
    demo held that lock, where the lock's own refusal naming the holder belongs)."""
    out = env.at("ml")
    assert _run(["demo", "--merge-only", "--out", out], capsys)[0] == 0
    Path(out, ".merged.layerswap.lock").write_text('{"pid": 999999999}')  # stale: nobody holds it
    code, err = _run(["demo", "--merge-only", "--out", out, "--overwrite"], capsys)
    assert code == 0, err
