"""cluster.yaml invariants (it cannot be launched here): pinned image, no public Ray ports."""

from pathlib import Path

import ray
import yaml

CLUSTER = yaml.safe_load((Path(__file__).parents[1] / "cluster.yaml").read_text())


def test_image_pinned_to_installed_ray():
    image = CLUSTER["docker"]["image"]
    assert image.startswith(f"rayproject/ray:{ray.__version__}-py3"), image
    assert image.endswith("-gpu")


def test_only_ssh_is_open_and_dashboard_is_local():
    perms = CLUSTER["provider"]["security_group"]["IpPermissions"]
    assert [(p["FromPort"], p["ToPort"]) for p in perms] == [(22, 22)]
    assert all(r["CidrIp"] != "0.0.0.0/0" for p in perms for r in p["IpRanges"])
    head = " ".join(CLUSTER["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head
