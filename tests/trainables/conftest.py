"""Fixtures for trainables tests: a real S3-compatible server (moto) on loopback, and a two-node
Ray cluster whose worker node cannot see one folder.

`s3` starts one `moto.server.ThreadedMotoServer` per module, points the AWS variables at it
(credentials, region, AWS_ENDPOINT_URL) and the download cache at a temp folder, and yields an
`S3` with the endpoint and a fresh bucket maker. Nothing is mocked: pyarrow talks HTTP to it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import pids_naming

IN_CI = bool(os.environ.get("CI"))


@dataclass
class S3:
    """The running server: its endpoint URL, and `bucket()` to create a fresh bucket."""

    endpoint: str
    _n: itertools.count = field(default_factory=itertools.count)

    def bucket(self, prefix: str = "lsw") -> str:
        """Create a new bucket; returns its s3:// URI."""
        import boto3

        name = f"{prefix}-{next(self._n)}"
        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return f"s3://{name}"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 and the environment that points pyarrow and boto3 at it.

    Module-scoped so a Ray started after it (its raylet and workers inherit the environment
    at start) writes to the same server.
    """
    moto_server = pytest.importorskip("moto.server", reason="pip install 'moto[server]'")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    cache = tmp_path_factory.mktemp("storage-cache")
    with pytest.MonkeyPatch.context() as mp:
        for var, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata probing for credentials
            "AWS_CONFIG_FILE": str(cache / "no-aws-config"),  # the user's ~/.aws is not read
            "AWS_SHARED_CREDENTIALS_FILE": str(cache / "no-aws-credentials"),
            "LAYERSWAP_CACHE": str(cache / "cache"),
        }.items():
            mp.setenv(var, value)
        for var in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(var, raising=False)
        yield S3(endpoint)
    server.stop()


def _can_hide() -> str | None:
    """Why a folder cannot be hidden from one process here (`unshare -m` + a tmpfs), or None."""
    probe = tempfile.mkdtemp(prefix="lsu", dir="/tmp")
    try:
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", f"mount -t tmpfs none {probe}"]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    finally:
        os.rmdir(probe)


@dataclass
class HiddenNode:
    """A running Ray: `address` (host:port), `env` (what a driver joining it needs), and `join()`,
    which starts the worker node that cannot see the folder (at once unless `late`)."""

    address: str
    env: dict[str, str]
    join: object = None


@contextmanager
def _hidden_node_cluster(hidden: Path, late: bool = False):
    """A head with no CPUs (`ray start --head`) and one 1-CPU worker node started under
    `unshare -m` with a tmpfs over `hidden`: that node alone sees the folder empty (what a `ray up`
    worker sees of a folder only the head has). `late`: the worker node starts only when the test
    calls `node.join()` (an autoscaler's node, started after a command's upfront check). Every
    process is started here and killed at the end, by pid (those naming the cluster's own temp
    dir, and the worker's `ray start`).

    Skips where `unshare`/`mount` is not permitted, except under CI=1, where it fails.
    """
    if (why := _can_hide()) is not None:
        if IN_CI:
            pytest.fail(f"CI is set and a folder cannot be hidden from one Ray node ({why}); run as root or with CAP_SYS_ADMIN")  # fmt: skip
        pytest.skip(f"cannot hide a folder from one process: {why}")
    tmp = Path(tempfile.mkdtemp(prefix="lsn", dir="/tmp"))  # short: Ray's socket paths
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    # Token authentication is on wherever ~/.ray/auth_token exists: off for this cluster alone.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": str(tmp)}
    ray_cli = str(Path(sys.executable).parent / "ray")
    common = ["--node-ip-address=127.0.0.1", f"--temp-dir={tmp / 'ray'}", "--disable-usage-stats"]  # fmt: skip
    workers: list[subprocess.Popen] = []

    def join() -> None:
        start = " ".join([ray_cli, "start", f"--address={address}", "--num-cpus=1", "--num-gpus=0", *common, "--block"])  # fmt: skip
        log = tmp / "worker.log"
        hide = ["unshare", "-m", "--propagation", "private", "sh", "-c", f"mount -t tmpfs none '{hidden}' && exec {start}"]  # fmt: skip
        with open(log, "w") as out:
            workers.append(subprocess.Popen(hide, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + 60
        while "Ray runtime started" not in log.read_text():  # printed once the node registered
            if workers[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the hidden-folder worker node did not start: {log.read_text()[-2000:]}")  # fmt: skip
            time.sleep(0.2)

    try:
        head = [ray_cli, "start", "--head", f"--port={port}", "--num-cpus=0", "--num-gpus=0", "--include-dashboard=false", *common]  # fmt: skip
        subprocess.run(head, env=env, check=True, capture_output=True, timeout=60)
        if not late:
            join()
        yield HiddenNode(address, {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled"}, join)
    finally:
        pids = set(pids_naming(str(tmp)))
        pids |= {w.pid for w in workers}
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for w in workers:
            w.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def hidden_world_cluster(tiny_world):
    """The tiny world, and a two-node Ray whose only worker node does not see it (see
    _hidden_node_cluster): yields (world, HiddenNode)."""
    with _hidden_node_cluster(tiny_world) as node:
        yield tiny_world, node


@pytest.fixture
def late_hidden_world_cluster(tiny_world):
    """As hidden_world_cluster, but only the head (no CPUs) runs until the test calls
    `node.join()`: yields (world, HiddenNode)."""
    with _hidden_node_cluster(tiny_world, late=True) as node:
        yield tiny_world, node
