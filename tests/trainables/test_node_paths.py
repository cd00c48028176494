"""Local input paths some Ray node cannot see are refused before work starts
(trainables/node_paths.py): the comparison, the one-node shortcut, and a real second node (started
under `unshare -m`, see conftest.hidden_world_cluster) that does not see the world folder.

Run: .venv/bin/python -m pytest -q tests/trainables/test_node_paths.py   (the cluster tests are
slow: ~20 s together, most of it the two Ray nodes starting and the CLI importing torch)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from layerswap.trainables import node_paths
from layerswap.trainables.lock_files import lock_path
from layerswap.trainables.locks import writing
from layerswap.trainables.node_paths import (
    FIX,
    NodePathError,
    check_node_paths,
    describe,
    described,
    difference,
    path_problems,
    run_lock,
)
from layerswap.trainables.outputs import MARKER
from tests.trainables.train.train_helpers import make_exp

ROOT = Path(__file__).resolve().parents[2]


def test_describe_lists_names_and_sizes_without_hidden_entries(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.json").write_text("12345")
    (tmp_path / "sub/b.bin").write_bytes(b"xy")
    (tmp_path / ".lock").write_text("held")
    assert describe(str(tmp_path)) == {"kind": "dir", "files": {"a.json": 5, "sub/b.bin": 2}, "cut": False}  # fmt: skip
    assert describe(str(tmp_path / "a.json")) == {"kind": "file", "size": 5}
    assert describe(str(tmp_path / "nope")) == {"kind": "missing"}


def test_difference_says_what_differs():
    here = {"kind": "dir", "files": {"config.json": 600, "model.safetensors": 10, "tok.json": 3}}
    assert difference(here, here) is None
    assert difference(here, {"kind": "missing"}) == "missing there"
    assert difference(here, {"kind": "file", "size": 1}) == "a folder here, a file there"
    there = {"kind": "dir", "files": {"config.json": 512, "tok.json": 3}}
    assert difference(here, there) == (
        "1 of its 3 file(s) missing there (model.safetensors); "
        "other sizes there: config.json 600 bytes here, 512 there"
    )
    assert difference({"kind": "file", "size": 7}, {"kind": "file", "size": 9}) == "7 bytes here, 9 there"  # fmt: skip
    # A listing cut short there compares only the names it reached.
    cut = {"kind": "dir", "files": {"config.json": 600}, "cut": True}
    assert difference(here, cut) is None


def test_problems_are_one_line_per_node_and_input_naming_field_path_and_fix():
    inputs = [("base", "/b"), ("datasets[0].path", "/d.jsonl"), ("world", "/gone")]
    here = {"/b": {"kind": "dir", "files": {"x": 1}}, "/d.jsonl": {"kind": "file", "size": 4}, "/gone": {"kind": "missing"}}  # fmt: skip
    gone = {**here, "/b": {"kind": "missing"}}
    nodes = {"10.0.0.2 (aaaa)": dict(here), "10.0.0.3 (bbbb)": gone}
    assert path_problems(inputs, here, nodes) == [f"node 10.0.0.3 (bbbb): base /b: missing there; {FIX}"]  # fmt: skip


def test_one_node_alive_costs_no_task(monkeypatch):
    """The usual local case: nothing is submitted, nothing described."""

    class NoTask:
        def options(self, **kw):
            raise AssertionError("a path-check task was submitted on a one-node cluster")

    monkeypatch.setattr(node_paths.ray, "nodes", lambda: [{"Alive": True, "NodeID": "h", "Resources": {"CPU": 2.0}}, {"Alive": False, "NodeID": "d"}])  # fmt: skip
    monkeypatch.setattr(node_paths, "_describe_all", NoTask())
    monkeypatch.setattr(node_paths, "describe", lambda p: pytest.fail("described on one node"))
    check_node_paths([("base", "/nowhere")])


def test_a_node_that_never_answers_is_named_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """docs/guarantees.md: a node that does not answer the upfront check within the timeout is
    named on stderr and left unchecked there; the command goes on, the other nodes checked.
    Ray's task scheduling is stood in by threads (a real Ray start costs ~8 s here): the
    answering node describes the paths for real, the other's answer never comes."""
    from concurrent.futures import Future, ThreadPoolExecutor, wait

    node = {"Alive": True, "Resources": {"CPU": 2.0}}
    answers = dict(node, NodeID="a" * 56, NodeManagerAddress="10.0.0.2")
    silent = dict(node, NodeID="b" * 56, NodeManagerAddress="10.0.0.3")
    never = Future()  # the silent node's answer: never set
    pool = ThreadPoolExecutor(1)
    asked, cancelled = [], []
    describe_all = node_paths._describe_all._function  # what the task runs on a node

    class Pinned:  # node_paths._describe_all.options(scheduling_strategy=...).remote(paths)
        def options(self, scheduling_strategy):
            self.node = scheduling_strategy.node_id
            return self

        def remote(self, paths):
            asked.append(self.node)
            if self.node == silent["NodeID"]:
                return never
            return pool.submit(describe_all, paths)

    def ray_wait(refs, num_returns, timeout):
        assert timeout is not None and timeout <= 0.3, f"waited on the nodes with timeout {timeout}"
        done, late = wait(refs, timeout=timeout)
        return [r for r in refs if r in done], [r for r in refs if r in late]

    monkeypatch.setattr(node_paths.ray, "nodes", lambda: [answers, silent])
    monkeypatch.setattr(node_paths.ray, "wait", ray_wait)
    monkeypatch.setattr(node_paths.ray, "get", lambda ref: ref.result())
    monkeypatch.setattr(node_paths.ray, "cancel", lambda ref, force: cancelled.append(ref))
    monkeypatch.setattr(node_paths, "_describe_all", Pinned())
    (tmp_path / "data.jsonl").write_text("{}\n")
    inputs = [("world", str(tmp_path))]

    t0 = time.monotonic()
    check_node_paths(inputs, timeout_s=0.3)  # returns: the run goes on
    took = time.monotonic() - t0
    pool.shutdown()

    assert sorted(asked) == sorted([answers["NodeID"], silent["NodeID"]])
    assert 0.3 <= took < 5, took
    assert cancelled == [never]
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "layerswap: warning: node 10.0.0.3 (bbbbbbbb) did not answer the path check within 0.3 s; "
        "its paths are unchecked"
    ], err
    # Left unchecked, not passed: the next command's check asks that node again.
    key = (tuple(inputs), tuple(sorted(n["NodeID"] for n in (answers, silent))))
    assert key not in node_paths._CHECKED


def test_a_worker_checks_the_drivers_descriptions_once_per_process(tmp_path, monkeypatch):
    """check_here (what each trial and training worker runs first): silent where the node sees
    what the driver described, one line naming this node, field and path where not; a process
    that passed does not describe again (reused actors, later trials)."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base/config.json").write_text("{}")
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    driver = described([("base", str(tmp_path / "base")), ("datasets[0].path", str(data)), ("world", str(tmp_path / "nope"))])  # fmt: skip
    assert [row[0] for row in driver] == ["base", "datasets[0].path"]  # missing here: not passed
    node_paths.check_here(driver)
    monkeypatch.setattr(node_paths, "describe", lambda p: pytest.fail("described again"))
    node_paths.check_here(driver)
    monkeypatch.undo()
    monkeypatch.setattr(node_paths, "_HERE_OK", set())  # another process: another node
    data.write_text("{}\n{}\n")  # what a node with another copy of the file would see
    with pytest.raises(NodePathError) as e:
        node_paths.check_here(driver)
    assert str(e.value) == f"node {node_paths.node_label()}: datasets[0].path {data}: 3 bytes here, 6 there; {FIX}"  # fmt: skip
    node_paths.check_here(None)  # a config from an older driver: nothing to check


def test_run_is_checked_as_this_commands_lock_compared_by_content(tmp_path):
    """RUN counts through the lock the command holds on its output there: a node that sees
    another command's lock of the same size (another RUN, an old copy) is named; with no lock
    held (a direct library call) RUN is left out."""
    out = tmp_path / "run/train/x"
    field, path = run_lock(out)
    assert (field, path) == (node_paths.RUN_FIELD, str(lock_path(out)))
    assert described([(field, path)]) == []  # not held: nothing to compare
    with writing(out):
        driver = described([(field, path)])
        node_paths.check_here(driver)
        mine = Path(path).read_text()
    other = mine.replace(mine[mine.index('"nonce": "') + 10], "z" if mine[mine.index('"nonce": "') + 10] != "z" else "y", 1)  # fmt: skip
    assert len(other) == len(mine) and other != mine
    there = {"kind": "file", "size": len(other), "text": other}
    assert difference(driver[0][2], there) == "another command's lock there (or another folder): not this RUN"  # fmt: skip
    assert difference(driver[0][2], {"kind": "missing"}) == "missing there"


def test_a_node_path_error_is_not_retried_by_ray_train():
    """A worker's NodePathError ends the run at once (trainables/train/ray_failures.py)."""
    from ray.train.v2.api.exceptions import WorkerGroupError

    from layerswap.trainables.train.ray_failures import deterministic

    err = WorkerGroupError("x", {0: NodePathError("node a (b): base /b: missing there")})
    assert deterministic(err)


# The driver-level check, run in a child joined to the hidden cluster: a pytest process that
# once joined a cluster with RAY_AUTH_MODE=disabled keeps that mode in Ray's process-wide auth
# state, and every later local ray.init in it failed ("Failed to start GCS ... InvalidAuthToken").
_DRIVER = """
import json, sys
import ray
from layerswap.spaces.local_inputs import search_inputs, train_inputs
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool
from layerswap.trainables.node_paths import NodePathError, check_node_paths
from tests.trainables.train.train_helpers import make_exp
from pathlib import Path

world, seen = Path(sys.argv[1]), sys.argv[2]
ray.init(address=sys.argv[3], log_to_driver=False)
out = {}
try:
    worker = next(n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))
    out["label"] = f"node {worker['NodeManagerAddress']} ({worker['NodeID'][:8]})"
    try:
        check_node_paths(train_inputs(make_exp(world, "full")))
    except NodePathError as e:
        out["train"] = str(e)
    exp = SearchExperiment(language="xa", base=str(world / "base"), task_experts=[str(world / "corpus")], language_experts=[str(world / "data")], world=str(world))
    pool = ExpertPool.from_paths(exp.task_experts, exp.language_experts, exp.base)
    try:
        check_node_paths(search_inputs(exp, pool))
    except NodePathError as e:
        out["search"] = str(e)
    check_node_paths([("datasets[0].path", seen)])  # raises (and the child fails) if refused
    out["seen"] = "passed"
finally:
    ray.shutdown()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_a_node_that_cannot_see_the_inputs_is_named_before_any_work(hidden_world_cluster, tmp_path):  # fmt: skip
    """Driver level: the train and search listings of inputs under the hidden world, checked
    on a real second node; a file every node sees passes."""
    world, node = hidden_world_cluster
    seen = tmp_path / "everywhere.jsonl"  # tmp_path is not hidden: the node sees it as is
    seen.write_text("{}\n")
    env = {**os.environ, **node.env}
    cmd = [sys.executable, "-c", _DRIVER, str(world), str(seen), node.address]
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    label = out["label"]
    data = world / "data/sft/math_en.jsonl"
    assert out["train"].split("\n  ") == [
        f"{label}: base {world / 'base'}: missing there; {FIX}",
        f"{label}: datasets[0].path {data}: missing there; {FIX}",
    ]
    text = out["search"]
    fields = [line.split(": ")[1].split(" /")[0] for line in text.split("\n  ")]
    assert fields == ["base", "task_experts[0]", "language_experts[0]", "world"]
    assert f"world {world}: 0 of its " not in text  # the world is there, empty
    assert f"): world {world}: " in text and "file(s) missing there (" in text
    assert out["seen"] == "passed"


def _train_command(world: Path, node, tmp_path: Path, name: str) -> tuple[list[str], dict, Path]:
    """`layerswap train` of a 2-step experiment `name` on the hidden world, joining `node`'s
    cluster: (argv, env, RUN)."""
    exp = make_exp(world, "full", name=name, hyper={"max_steps": 2})
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(exp.model_dump(mode="json")))
    run = tmp_path / "run"
    env = {**os.environ, **node.env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return [sys.executable, "-m", "layerswap.cli", "train", str(f), "--out", str(run)], env, run


def _assert_base_and_data_named(stderr: str, world: Path) -> None:
    """The one error: a line each for the base and the dataset, naming the hidden node."""
    label = r"node [\d.]+ \([0-9a-f]{8}\)"
    data = world / "data/sft/math_en.jsonl"
    fix = re.escape(FIX)
    assert re.search(
        rf"^layerswap: error: {label}: base {world / 'base'}: missing there; {fix}\n"
        rf"  {label}: datasets\[0\]\.path {data}: missing there; {fix}$",
        stderr,
        re.M,
    ), stderr[-3000:]
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_train_on_that_cluster_is_refused_in_one_line_per_problem_and_writes_nothing(hidden_world_cluster, tmp_path):  # fmt: skip
    """CLI level: `layerswap train` joining the cluster (RAY_ADDRESS) exits 2 naming the node
    and each path, before its run folder exists."""
    world, node = hidden_world_cluster
    cmd, env, run = _train_command(world, node, tmp_path, "hidden")
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    _assert_base_and_data_named(r.stderr, world)
    assert not run.exists()  # no run folder, marker or lock left


@pytest.mark.slow
def test_a_node_that_joins_after_the_check_is_named_by_its_training_worker(late_hidden_world_cluster, tmp_path):  # fmt: skip
    """The shipped cluster's case (min_workers: 0): `layerswap train` starts with the head alone,
    so its upfront check has no other node to ask; the worker node joins afterwards (an
    autoscaler's), and the Ray Train worker scheduled there checks before it loads anything:
    exit 2 in one line per problem naming that node, not retried, no checkpoint written."""
    world, node = late_hidden_world_cluster
    cmd, env, run = _train_command(world, node, tmp_path, "late")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        folder = run / "train" / "late"
        deadline = time.monotonic() + 90
        while not (folder / MARKER).exists():  # written once its upfront check has passed
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]  # fmt: skip
            time.sleep(0.2)
        node.join()  # the only node with a CPU: the training worker can run nowhere else
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-3000:]
    _assert_base_and_data_named(err, world)
    assert "Repo id" not in err
    assert not folder.exists() and not lock_path(folder).exists()  # nothing trained: nothing left
