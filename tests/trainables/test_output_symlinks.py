"""An output given as a symbolic link is written through it, never replaced: the link survives,
the data lands in its target, and the lock, temporaries and set-aside copies lie beside the
target (so a second writer through either spelling, and the dead-writer sweep, see one output).

Researchers link `runs/exp1` to scratch storage (`ln -s /scratch/me/exp1 runs/exp1`); here
`home/exp1 -> scratch/exp1`, in two folders so that "beside the link" and "beside the target"
differ. A dangling link is written into its target when the target's folder exists (the
scratch folder a user linked before the first run), else refused naming the link and target.

Run: .venv/bin/python -m pytest -q tests/trainables/test_output_symlinks.py   (about 45 s on 2
CPU cores; -m "not slow" skips the merge-only demo, about 20 s)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerswap.cli import main
from layerswap.trainables.atomic import atomic_dir, atomic_write_text
from layerswap.trainables.locks import writing
from layerswap.trainables.outputs import (
    OutputError,
    check_output,
    check_output_file,
    output_dir,
    read_marker,
    replacing,
    write_marker,
)
from tests.cli.cli_process import leftovers
from tests.trainables.test_dead_writer_temps import _kill_writer_at


@pytest.fixture
def linked(tmp_path) -> tuple[Path, Path]:
    """(home/exp1, scratch/exp1): the link and its target, an existing empty folder."""
    (tmp_path / "home").mkdir()
    target = tmp_path / "scratch" / "exp1"
    target.mkdir(parents=True)
    link = tmp_path / "home" / "exp1"
    link.symlink_to(target)
    return link, target


def _intact(link: Path, target: Path) -> None:
    """The link is still the user's link to `target`, and nothing temporary is left anywhere."""
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert target.is_dir() and not target.is_symlink()
    root = target.parent.parent
    assert not leftovers(root), leftovers(root)
    assert not list(root.rglob("*.layerswap.lock"))


def test_atomic_dir_overwrite_writes_into_the_target_and_keeps_the_link(linked):
    link, target = linked
    (target / "old.txt").write_text("old\n")
    with atomic_dir(link, overwrite=True) as tmp:
        # built beside the target: the final rename stays on its file system
        assert tmp.parent == target.parent.resolve()
        (tmp / "new.txt").write_text("new\n")
    _intact(link, target)
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]


def test_output_dir_overwrite_keeps_the_link_and_marks_the_target(linked):
    link, target = linked
    with output_dir(link, "analysis", overwrite=True) as tmp:
        (tmp / "report.md").write_text("first\n")
    with output_dir(link, "analysis", overwrite=True) as tmp:
        (tmp / "report.md").write_text("second\n")
    _intact(link, target)
    assert (target / "report.md").read_text() == "second\n"
    assert read_marker(target)["files"] == ["report.md"]


def test_a_dangling_link_is_written_into_its_target_when_its_folder_exists(linked):
    link, target = linked
    target.rmdir()  # linked before the first run: scratch/ exists, scratch/exp1 not yet
    check_output(link, "analysis")
    with output_dir(link, "analysis") as tmp:
        (tmp / "report.md").write_text("r\n")
    _intact(link, target)
    assert (target / "report.md").read_text() == "r\n"


def test_a_dangling_link_whose_target_folder_is_missing_is_refused_naming_both(tmp_path):
    link = tmp_path / "exp1"
    target = tmp_path / "unmounted" / "me" / "exp1"
    link.symlink_to(target)
    with pytest.raises(OutputError) as e:
        check_output(link, "analysis")
    assert str(link) in str(e.value) and str(target) in str(e.value), e.value
    assert "does not exist" in str(e.value)
    with pytest.raises(OutputError, match="does not exist"):
        check_output_file(link, ours=lambda p: True, what="a file")
    assert not (tmp_path / "unmounted").exists() and link.is_symlink()


def test_a_symlink_loop_is_refused_in_one_line(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OutputError, match="symbolic link loop") as e:
        check_output(loop, "analysis")
    assert str(loop) in str(e.value)


def test_the_lock_and_temporaries_lie_beside_the_target_whatever_the_spelling(linked):
    link, target = linked
    with writing(link) as lock:
        assert lock.parent == target.parent.resolve()
        with writing(target) as again:  # the other spelling: the same (re-entrant) lock
            assert again == lock
            with atomic_dir(link, overwrite=True) as tmp:
                assert tmp.parent == lock.parent
                (tmp / "a.txt").write_text("a\n")
    _intact(link, target)


def test_replacing_a_linked_folder_keeps_the_link_and_restores_the_target_on_failure(linked):
    link, target = linked
    (target / "old.txt").write_text("old\n")
    with pytest.raises(RuntimeError), replacing([link]) as aside:
        assert link.is_symlink() and list(target.iterdir()) == []  # set aside, target emptied
        assert aside[link].parent == target.parent.resolve()
        link.mkdir(parents=True, exist_ok=True)  # what a run writing in place does
        (link / "half.txt").write_text("half\n")
        raise RuntimeError("the run failed")
    _intact(link, target)
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    with replacing([link]):
        (link / "new.txt").write_text("new\n")
    _intact(link, target)
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]


def test_a_single_file_output_is_written_through_its_link(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "scratch").mkdir()
    target = tmp_path / "scratch" / "plan.json"
    target.write_text("{}\n")
    link = tmp_path / "home" / "plan.json"
    link.symlink_to(target)
    check_output_file(link, overwrite=True, ours=lambda p: p.read_text() == "{}\n", what="a plan")
    atomic_write_text(link, '{"new": 1}\n')
    assert link.is_symlink() and json.loads(target.read_text()) == {"new": 1}
    assert not leftovers(tmp_path)


def test_a_swap_through_a_link_killed_midway_is_put_back_by_the_next_writer(linked, capfd):
    """The killed writer's set-aside copy and temporary lie beside the target, where the next
    writer (through the link) takes over its lock and looks for them."""
    link, target = linked
    (target / "old.txt").write_text("old\n")
    pid = _kill_writer_at(link, "atomic_dir", renames=1)  # the old output aside, the new not in
    with writing(link):
        pass
    err = capfd.readouterr().err
    assert f"pid {pid} was killed while replacing it" in err, err
    _intact(link, target)
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]


def test_merge_and_schema_commands_write_through_linked_outputs(tmp_path, family, capsys):
    """End to end: `layerswap merge --out LINK` (then --overwrite) and `layerswap schema
    --out LINK --overwrite` keep the links and write into their targets."""
    (tmp_path / "home").mkdir()
    (tmp_path / "scratch").mkdir()
    recipe = tmp_path / "recipe.yaml"
    data = {"method": "layer_swap", "bottom": 2, "top": 2, "bottom_transition": 1}
    data |= {"task_expert": str(family.paths["task"]), "language_expert": str(family.paths["language"])}  # fmt: skip
    recipe.write_text(json.dumps(data))
    link, target = tmp_path / "home" / "m", tmp_path / "scratch" / "m"
    link.symlink_to(target)  # dangling until the first merge creates scratch/m
    for again in ([], ["--overwrite"]):
        assert main(["merge", str(recipe), "--out", str(link), "-q", *again]) == 0, capsys.readouterr().err  # fmt: skip
        _intact(link, target)
        assert (target / "model.safetensors").is_file()
    schema, file = tmp_path / "home" / "s.json", tmp_path / "scratch" / "s.json"
    schema.symlink_to(file)
    for again in ([], ["--overwrite"]):
        assert main(["schema", "recipe", "--out", str(schema), *again]) == 0, capsys.readouterr().err  # fmt: skip
        assert schema.is_symlink() and json.loads(file.read_text())["title"].startswith("layerswap")
    assert not leftovers(tmp_path)


@pytest.mark.slow
def test_a_merge_only_demo_overwrites_through_its_link(linked, capsys):
    """`demo --merge-only --out LINK --overwrite`: the earlier demo in the target is set aside
    and rebuilt there (it had refused, the emptied target "already existing", and hidden the
    link while cleaning up)."""
    link, target = linked
    write_marker(target, "merge-demo", files=[])  # an earlier (empty) merge-only demo
    code = main(["demo", "--merge-only", "--out", str(link), "--overwrite"])
    assert code == 0, capsys.readouterr().err
    _intact(link, target)
    assert (target / "merged" / "model.safetensors").is_file()
