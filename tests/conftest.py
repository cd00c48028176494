"""Shared fixtures: tiny Llama families built once per session, and checkpoint helpers.

Every family has a `base` and two perturbed experts (`task` noise 0.02, `language` noise 0.04)
written by `layerswap.world.tiny.make_tiny_family`. Tests read checkpoints back with the safetensors
library itself, never with the engine's own reader, so expectations stay independent.
"""

from __future__ import annotations

import os
import signal
import sys

# No network, ever: huggingface_hub / datasets read these when first imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

NUM_LAYERS = 12
# Everything a checkpoint folder carries besides its weights.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def load_dir(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder (all its .safetensors shards), via safetensors."""
    out: dict[str, torch.Tensor] = {}
    files = sorted(Path(folder).glob("*.safetensors"))
    assert files, f"no safetensors in {folder}"
    for f in files:
        part = load_file(f)
        assert not set(part) & set(out), f"tensor in two shards: {set(part) & set(out)}"
        out.update(part)
    return out


def write_checkpoint(
    dst: str | Path,
    state: dict[str, torch.Tensor],
    like: str | Path,
    config_updates: dict | None = None,
) -> Path:
    """A checkpoint folder at `dst`: `state` as one model.safetensors, side files of `like`."""
    dst = Path(dst)
    dst.mkdir(parents=True)
    for name in SIDE_FILES:
        if (Path(like) / name).exists():
            shutil.copyfile(Path(like) / name, dst / name)
    if config_updates:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config_updates)
        (dst / "config.json").write_text(json.dumps(cfg))
    save_file(
        {k: v.contiguous() for k, v in state.items()}, dst / "model.safetensors", {"format": "pt"}
    )
    return dst


def perturb(state: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """`state` plus seeded Gaussian noise (computed in float32, cast back)."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: (v.float() + scale * torch.randn(v.shape, generator=g)).to(v.dtype)
        for k, v in state.items()
    }


@dataclass
class Family:
    """Checkpoints of one tiny family: paths by role and their tensors (loaded once)."""

    root: Path
    paths: dict[str, Path]
    dtype: torch.dtype
    tie: bool
    num_layers: int = NUM_LAYERS
    _states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def ref(self, role: str) -> str:
        return str(self.paths[role])

    def state(self, role: str) -> dict[str, torch.Tensor]:
        if role not in self._states:
            self._states[role] = load_dir(self.paths[role])
        return self._states[role]

    @property
    def names(self) -> list[str]:
        return list(self.state("base"))


def _build(tmp_path_factory, label: str, **kw) -> Family:
    from layerswap.world.tiny import make_tiny_family

    root = tmp_path_factory.mktemp(label)
    paths = dict(make_tiny_family(root, num_layers=NUM_LAYERS, **kw))
    return Family(
        root=root,
        paths=paths,
        dtype=kw.get("dtype", torch.float32),
        tie=kw.get("tie", False),
    )


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_for_the_next_module(request):
    """A Ray left initialised by a test module is shut down and the module fails at teardown,
    naming itself: the suite runs in two processes (make test: pytest-xdist), and the next file
    on that process, in an order no one chose, failed in its own ray.init ("Maybe you called
    ray.init twice by accident?") far from the cause.

    os.environ is not put back here: a local ray.init also switches Ray's process-wide
    authentication to tokens and records RAY_AUTH_MODE=token there, and taking the variable away
    from under that state broke later multi-node tests on the same process (measured: workers
    without the driver's variables). A test that needs the mode unset removes it itself.
    """
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.module.__name__} left Ray initialised: shut it down in the test (or a fixture)")  # fmt: skip


@pytest.fixture(scope="session")
def family(tmp_path_factory) -> Family:
    """float32, 12 layers, untied; plus extra experts `task2` (noise 0.03), `lang2` (0.05)."""
    fam = _build(tmp_path_factory, "f32")
    base = fam.state("base")
    for role, scale, seed in (("task2", 0.03, 101), ("lang2", 0.05, 102)):
        fam.paths[role] = write_checkpoint(
            fam.root / role, perturb(base, scale, seed), like=fam.paths["task"]
        )
    return fam


@pytest.fixture(scope="session")
def bf16_family(tmp_path_factory) -> Family:
    return _build(tmp_path_factory, "bf16", dtype=torch.bfloat16)


@pytest.fixture(scope="session")
def tied_family(tmp_path_factory) -> Family:
    return _build(tmp_path_factory, "tied", tie=True)


@pytest.fixture(scope="session")
def sharded_family(tmp_path_factory) -> Family:
    """Same weights as `family` (same seed), saved by transformers in many small shards."""
    fam = _build(tmp_path_factory, "sharded", max_shard_size="20KB")
    shards = list(fam.paths["task"].glob("*.safetensors"))
    assert len(shards) > 2 and (fam.paths["task"] / "model.safetensors.index.json").exists()
    return fam


def assert_nothing_written(out: Path) -> None:
    """Neither the output folder nor a temporary sibling `.NAME.tmp-*` / `.NAME.old-*` exists."""
    out = Path(out)
    assert not out.exists(), f"{out} was written"
    leftovers = [p.name for p in out.parent.glob(f".{out.name}.*")]
    assert not leftovers, f"temporary folders left behind: {leftovers}"


@pytest.fixture
def nothing_written():
    return assert_nothing_written


@pytest.fixture
def ckpt():
    """Checkpoint helpers: load_dir, write_checkpoint, perturb."""

    class Helpers:
        load = staticmethod(load_dir)
        write = staticmethod(write_checkpoint)
        perturb = staticmethod(perturb)

    return Helpers


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    """The tiny world under the session's base temp (build_world is a no-op once complete)."""
    from layerswap.world import build_world

    return build_world(tmp_path_factory.getbasetemp() / "tiny_world", seed=0, size="tiny", progress=False)  # fmt: skip


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on shared cores: one intra-op thread is several times faster than two.

    Modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@contextmanager
def _local_ray(num_cpus: int = 2):
    """A one-node local Ray in its own short temp dir (Ray's socket paths are length-limited,
    and a shared /tmp/ray would mix sessions of concurrent runs)."""
    import tempfile

    import ray

    tmp = tempfile.mkdtemp(prefix="lsr", dir="/tmp")
    ray.init(num_cpus=num_cpus, _temp_dir=tmp, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_session():
    """A 2-CPU local Ray for one test module (see _local_ray)."""
    with _local_ray():
        yield


@pytest.fixture
def ray_one_node():
    """`with ray_one_node():` a 2-CPU one-node Ray for part of a test (see _local_ray)."""
    return _local_ray


@contextmanager
def _local_cluster(workers: int = 2, cpus: float = 1, gpus: float = 0, env: dict | None = None):
    """A multi-node Ray cluster on this machine (ray.cluster_utils.Cluster), connected.

    The head has no CPUs or GPUs: it is the driver's node, where Tune's and Train's controllers
    run, so every trial and training worker lands on a worker node. Worker node i (1-based) has
    `cpus` CPUs and `gpus` GPUs (fake where the machine has none) and its raylet, with every
    process it starts, sees LAYERSWAP_AUDIT_NODE=w<i> on top of `env` (the audit hook in
    tests/search/audit_hook records it). Ray's files go to a short temp dir of their own.

    Yields:
        (cluster, {"w1": node, "w2": node, ...}); `cluster.remove_node(node)` loses one.
    """
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="lsc", dir="/tmp")
    # Cluster writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster (/tmp/ray/... by
    # default) and fails where that folder does not exist, as on a machine that never ran Ray:
    # point it into this cluster's own folder
    os.makedirs(os.path.join(tmp, "ray"))
    old_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "num_gpus": 0,
                "temp_dir": tmp,
                "include_dashboard": False,
            },
        )
        nodes = {
            f"w{i}": cluster.add_node(
                num_cpus=cpus,
                num_gpus=gpus,
                # Fake GPUs are no CUDA: trials given one run on the CPU only with the opt-in.
                env_vars={**(env or {}), "LAYERSWAP_AUDIT_NODE": f"w{i}"}
                | ({"LAYERSWAP_ALLOW_CPU": "1"} if gpus else {}),
            )
            for i in range(1, workers + 1)
        }
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster, nodes
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        if old_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old_tmpdir
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def ray_cluster():
    """`with ray_cluster(workers=2, cpus=1, gpus=1) as (cluster, nodes):` a local multi-node
    Ray (see _local_cluster); a test may start several, one after another."""
    return _local_cluster


def snapshot_tree(*roots: str | Path) -> dict[str, str]:
    """Every file and folder under `roots`: relative path -> sha256 (files) or "dir".

    Compare before and after a command to prove it changed nothing there.
    """
    import hashlib

    state = {}
    for root in map(Path, roots):
        if not root.exists():
            state[str(root)] = "absent"
            continue
        for p in sorted([root, *root.rglob("*")]):
            key = f"{root}/{p.relative_to(root)}"
            state[key] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return state


@pytest.fixture
def ray_tmp():
    """A RAY_TMPDIR of a command's own (tests/cli/cli_process.RayTmp); at teardown whatever Ray
    left under it is killed (by pid)."""
    from tests.cli.cli_process import RayTmp

    r = RayTmp()
    yield r
    for pid in r.gone(timeout=5):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(r.dir, ignore_errors=True)


@pytest.fixture
def tree_state():
    """`snapshot_tree`, as a fixture: `before = tree_state(run_dir)`."""
    return snapshot_tree


def sessions_and_command_lines() -> dict[int, tuple[int, str]]:
    """{pid: (session id, command line)} of the live processes, zombies left out (read from
    /proc; the command name in /proc/PID/stat may hold spaces and parentheses)."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, sid
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(proc.name)] = (int(fields[3]), cmd)
    return out


def ray_pids(ray_tmp: str, sessions: set[int] | None = None) -> list[int]:
    """The live processes of the Ray started under RAY_TMPDIR `ray_tmp`: those naming it on their
    command line (GCS, raylet: each leads a session of its own, trainables/ray_session.py),
    everything in their sessions (the workers a raylet forks, titled `ray::...` by Ray), and
    every `ray::...` process started with RAY_TMPDIR=`ray_tmp` in its environment (a worker
    inherits the raylet's; the driver, with the same, is not Ray's): a busy worker outlives
    its raylet until its task ends when its driver is SIGKILLed, and a first look after the
    kill finds no raylet whose session would name it (CI: such a worker, still holding a run's
    lock, was missed and the next command was refused).

    Args:
        sessions: sessions seen before, updated in place: a worker may outlive its raylet.
    """
    sessions = set() if sessions is None else sessions
    procs = sessions_and_command_lines()
    sessions |= {sid for sid, cmd in procs.values() if ray_tmp in cmd}
    sessions.discard(os.getsid(0))  # never the tests' own
    titled = {p: v for p, v in procs.items() if v[1].startswith("ray::")}
    started_under = _environ_naming(f"RAY_TMPDIR={ray_tmp}", titled)
    return sorted(
        p
        for p, (sid, cmd) in procs.items()
        if sid in sessions or ray_tmp in cmd or p in started_under
    )


def _environ_naming(entry: str, procs: dict[int, tuple[int, str]]) -> set[int]:
    """Those of `procs` (not this process) whose initial environment holds `entry` (NAME=VALUE),
    read from /proc/PID/environ."""
    want = entry.encode() + b"\0"
    found = set()
    for pid in procs:
        if pid == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        if env.startswith(want) or b"\0" + want in env:
            found.add(pid)
    return found


def pids_naming(text: str) -> list[int]:
    """Pids of the live processes whose command line contains `text` (read from /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            pids.append(int(proc.name))
    return pids


# An Optuna study's writer SIGKILLed mid-commit: the uncommitted change is in the file (with
# cache_size=1 the rows written after it push its pages out) and the "hot" journal that undoes
# it beside it, which SQLite must roll back before anyone reads.
_KILLED_MID_COMMIT = """
import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size=1")
con.execute("BEGIN")
con.execute("DELETE FROM trial_values")
con.execute("UPDATE trials SET state = 'FAIL'")
con.execute("CREATE TABLE spill AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) SELECT i FROM n")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def kill_mid_commit():
    """`kill(db)`: a process SIGKILLed mid-commit on the Optuna study `db` (every trial turned
    FAIL, its values deleted, uncommitted), leaving db's hot journal."""
    import subprocess

    def kill(db: Path) -> None:
        p = subprocess.run([sys.executable, "-c", _KILLED_MID_COMMIT, str(db)], check=False)
        assert p.returncode == -signal.SIGKILL
        assert Path(f"{db}-journal").stat().st_size > 0  # hot: the kill left it

    return kill
