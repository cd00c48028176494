"""Every cluster node reads one Hugging Face cache on the shared EFS mount (cluster.yaml's docker
options), so what `layerswap prefetch` downloads on the head (runbook step 3) is there for the
search and training nodes the autoscaler starts later: they run offline by layerswap's default,
and before, each had its own empty cache in its container (no base model, no Belebele or MGSM).

Run: .venv/bin/python -m pytest -q tests/test_cluster_hf_cache.py
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = yaml.safe_load((ROOT / "cluster.yaml").read_text())


def run_options(node_type: str) -> list[str]:
    """`docker run` options of a node type, merged as Ray merges them (common + head/worker)."""
    docker = CLUSTER["docker"]
    if node_type == CLUSTER["head_node_type"]:
        extra = docker.get("head_run_options", [])
    else:
        node = CLUSTER["available_node_types"][node_type].get("docker", {})
        extra = node.get("worker_run_options", docker.get("worker_run_options", []))
    return docker.get("run_options", []) + extra


def efs_mount() -> str:
    mount = next(c for c in CLUSTER["initialization_commands"] if "mount -t nfs4" in c)
    return mount.split()[-1]


def test_every_node_has_hf_home_on_the_shared_mount():
    shared = efs_mount()
    homes = set()
    for name in CLUSTER["available_node_types"]:
        opts = run_options(name)
        assert f"-v {shared}:{shared}" in opts, name
        found = [m[1] for o in opts if (m := re.fullmatch(r"--env HF_HOME=(\S+)", o))]
        assert len(found) == 1, (name, opts)
        assert Path(found[0]).is_relative_to(shared), (name, found[0])
        homes |= set(found)
    assert len(homes) == 1, homes


def test_the_runbook_prefetches_once_into_the_shared_cache():
    guide = (ROOT / "docs" / "guides" / "cluster.md").read_text()
    home = next(o for o in CLUSTER["docker"]["run_options"] if o.startswith("--env HF_HOME="))
    step = guide[guide.index("**Prefetch**") : guide.index("**Plan**")]
    assert f"`{home.split('=', 1)[1]}`" in step  # the runbook says where the cache is
    assert "once per node" not in step and "every node reads" in step
