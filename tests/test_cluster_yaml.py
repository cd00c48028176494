"""cluster.yaml, checked offline (it cannot be launched here): Ray's own autoscaler schema and
`ray up`'s config checks, the pinned image and Ray, only SSH open, shared storage, and node types
that fit the shipped real configs (their memory plans, trials, and the experts' object store)."""

import copy
import functools
import importlib.metadata
import importlib.resources
import json
import re
import types
from pathlib import Path
from unittest import mock

import jsonschema
import pytest
import ray
import yaml

from layerswap.spaces.search_experiment import load_search_experiment
from layerswap.spaces.train_experiment import load_train_experiment
from layerswap.trainables.train.memory_plan import GPU_MEMORY_GIB, plan_experiment
from layerswap.trainables.train.model_shape import load_model_config, model_shape

ROOT = Path(__file__).parents[1]
CLUSTER_TEXT = (ROOT / "cluster.yaml").read_text()
CLUSTER = yaml.safe_load(CLUSTER_TEXT)
EXAMPLES = ROOT / "spaces" / "examples"
TRAIN_CONFIGS = sorted(
    p for p in EXAMPLES.glob("real_*.yaml") if p.stem.endswith(("_full", "_lora"))
)
SEARCH_CONFIGS = sorted(EXAMPLES.glob("real_*_search.yaml"))
GIB = 2**30
PREFIX = "accelerator_type:"  # Ray's custom resource for a GPU type (checked below)

# The instance types cluster.yaml uses, as EC2's DescribeInstanceTypes describes them (the fields
# Ray's AWS node provider reads). From AWS's instance pages: https://aws.amazon.com/ec2/instance-types/p5/
# (p5.48xlarge: 8 H100 80 GB, 192 vCPU, 2048 GiB) and https://aws.amazon.com/ec2/instance-types/g6e/
# (g6e.12xlarge: 4 L40S 48 GB, 48 vCPU, 384 GiB).
EC2_INSTANCE_TYPES = [
    {
        "InstanceType": "p5.48xlarge",
        "VCpuInfo": {"DefaultVCpus": 192},
        "MemoryInfo": {"SizeInMiB": 2048 * 1024},
        "GpuInfo": {"Gpus": [{"Name": "H100", "Manufacturer": "NVIDIA", "Count": 8}]},
    },
    {
        "InstanceType": "g6e.12xlarge",
        "VCpuInfo": {"DefaultVCpus": 48},
        "MemoryInfo": {"SizeInMiB": 384 * 1024},
        "GpuInfo": {"Gpus": [{"Name": "L40S", "Manufacturer": "NVIDIA", "Count": 4}]},
    },
]
EC2 = {t["InstanceType"]: t for t in EC2_INSTANCE_TYPES}


# --- Ray's private APIs: reached only through these functions --------------------------------


@functools.cache
def _ray_private() -> types.SimpleNamespace:
    """PRIVATE Ray APIs this module uses (none is public; Ray may move them in any release).

    prepare_config/validate_config: the config checks `ray up` runs before it talks to AWS.
    AWSNodeProvider / list_ec2_instances: how `ray up` fills node resources from EC2.
    get_bin_pack_residual / get_nodes_for / _default_utilization_scorer: which node types the
    autoscaler starts.
    _create_default_ssh_inbound_rules: the SSH rule Ray adds to a security group it creates.
    ScalingConfig._resources_per_worker_not_none: what a Ray Train worker asks for.
    """
    try:
        from ray.autoscaler._private.aws import node_provider as aws_node_provider
        from ray.autoscaler._private.aws.config import _create_default_ssh_inbound_rules
        from ray.autoscaler._private.resource_demand_scheduler import (
            NodeAvailabilitySummary,
            _default_utilization_scorer,
            get_bin_pack_residual,
            get_nodes_for,
        )
        from ray.autoscaler._private.util import prepare_config, validate_config
        from ray.train import ScalingConfig

        aws_node_provider.list_ec2_instances  # noqa: B018 (patched below)
        aws_node_provider.AWSNodeProvider.fillout_available_node_types_resources  # noqa: B018
        ScalingConfig._resources_per_worker_not_none  # noqa: B018
    except (ImportError, AttributeError) as e:
        raise AssertionError(
            f"Ray {ray.__version__} moved a private autoscaler/train API that "
            f"tests/test_cluster_yaml.py uses ({e}); update _ray_private() there"
        ) from e
    return types.SimpleNamespace(
        prepare_config=prepare_config,
        validate_config=validate_config,
        aws_node_provider=aws_node_provider,
        get_nodes_for=get_nodes_for,
        get_bin_pack_residual=get_bin_pack_residual,
        _default_utilization_scorer=_default_utilization_scorer,
        NodeAvailabilitySummary=NodeAvailabilitySummary,
        _create_default_ssh_inbound_rules=_create_default_ssh_inbound_rules,
        ScalingConfig=ScalingConfig,
    )


def _ray_up_checks(config: dict) -> dict:
    """`ray up`'s offline config checks via PRIVATE Ray APIs (see _ray_private): defaults merged
    as `ray up` merges them, then Ray's schema and cross-field checks. Returns the merged config."""
    r = _ray_private()
    prepared = r.prepare_config(copy.deepcopy(config))
    r.validate_config(prepared)
    return prepared


def _ray_aws_fillout(config: dict) -> dict:
    """The node resources `ray up` fills in from EC2 (PRIVATE Ray API, see _ray_private), with
    EC2's DescribeInstanceTypes answered by EC2_INSTANCE_TYPES instead of AWS."""
    r = _ray_private()
    with mock.patch.object(
        r.aws_node_provider, "list_ec2_instances", return_value=EC2_INSTANCE_TYPES
    ):
        fill = r.aws_node_provider.AWSNodeProvider.fillout_available_node_types_resources
        return fill(copy.deepcopy(config))


def _ray_nodes_to_add(demands: list[dict], node_types: dict | None = None) -> dict[str, int]:
    """Node types Ray's (v1, the VM clusters') autoscaler starts for pending resource `demands`
    on a cluster of the head alone: what the head cannot take, packed onto new nodes (PRIVATE
    Ray API, see _ray_private)."""
    r = _ray_private()
    node_types = node_types or CLUSTER["available_node_types"]
    scorer = functools.partial(
        r._default_utilization_scorer,
        node_availability_summary=r.NodeAvailabilitySummary(node_availabilities={}),
    )
    head = CLUSTER["head_node_type"]
    residual, _ = r.get_bin_pack_residual([dict(node_types[head]["resources"])], demands)
    add, left = r.get_nodes_for(node_types, {head: 1}, head, 10, residual, scorer)
    assert not left, f"no node type takes {left}"
    return dict(add)


def _ray_train_worker_resources(scaling) -> dict:
    """What one Ray Train worker asks for, as trainables/train/ray_train.py builds its
    ScalingConfig (PRIVATE Ray API, see _ray_private)."""
    r = _ray_private()
    cfg = r.ScalingConfig(
        num_workers=scaling.num_workers,
        use_gpu=scaling.use_gpu,
        resources_per_worker={"CPU": scaling.cpus_per_worker} | {"GPU": 1},
        accelerator_type=scaling.accelerator_type,
    )
    return dict(cfg._resources_per_worker_not_none)


def test_ray_private_apis_present():
    _ray_private()


# --- helpers ---------------------------------------------------------------------------------


def gpu_type(resources: dict) -> str | None:
    labels = [k.removeprefix(PREFIX) for k in resources if k.startswith(PREFIX)]
    assert len(labels) <= 1, resources
    return labels[0] if labels else None


def docker_options(name: str) -> list[str]:
    """The `docker run` options of node type `name`, merged as Ray merges them."""
    docker = CLUSTER["docker"]
    if name == CLUSTER["head_node_type"]:
        extra = docker.get("head_run_options", [])
    else:
        node = CLUSTER["available_node_types"][name].get("docker", {})
        extra = node.get("worker_run_options", docker.get("worker_run_options", []))
    return docker.get("run_options", []) + extra


def shm_bytes(name: str) -> int:
    sizes = [o for o in docker_options(name) if o.startswith("--shm-size=")]
    assert len(sizes) == 1, f"{name}: one --shm-size, got {sizes}"
    n, unit = re.fullmatch(r"--shm-size=(\d+)([kmg])", sizes[0]).groups()
    return int(n) * {"k": 2**10, "m": 2**20, "g": 2**30}[unit]  # docker's units are binary


@functools.cache
def model_bytes(base: str) -> int:
    """One copy of `base`'s weights in its checkpoint dtype (bf16 for Llama 3.1)."""
    config, _ = load_model_config(base)
    shape = model_shape(config)
    return sum(shape.params.values()) * shape.dtype.itemsize


# --- pinned image and Ray --------------------------------------------------------------------


def test_image_pinned_to_installed_ray():
    image = CLUSTER["docker"]["image"]
    assert image.startswith(f"rayproject/ray:{ray.__version__}-py3"), image
    assert image.endswith("-gpu")


def test_setup_cannot_move_ray():
    pin = f"ray=={ray.__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"ray[tune,train]=={ray.__version__}"' in pyproject
    prepared = _ray_up_checks(CLUSTER)
    check = f"assert ray.__version__ == '{ray.__version__}'"
    constraints = "/home/ray/layerswap/cluster-constraints.txt"  # the synced project's
    assert pin in (ROOT / "cluster-constraints.txt").read_text().splitlines()
    for role in ("head_setup_commands", "worker_setup_commands"):
        cmds = prepared[role]  # setup_commands merged in, as `ray up` merges them
        pips = [c for c in cmds if c.startswith("pip install")]
        assert pips and all(f"-c {constraints}" in c for c in pips), (role, pips)
        install = cmds.index(f"pip install -q -c {constraints} -e /home/ray/layerswap")
        assert any(check in c for c in cmds[install + 1 :]), (role, cmds)


# --- Ray's autoscaler schema, offline --------------------------------------------------------


def ray_schema() -> dict:
    text = importlib.resources.files("ray.autoscaler").joinpath("ray-schema.json").read_text()
    return json.loads(text)


def test_jsonschema_comes_with_ray():
    requires = importlib.metadata.requires("ray") or []
    assert any(re.match(r"jsonschema\b", r) for r in requires), requires
    assert jsonschema.Draft7Validator  # importable


def test_cluster_yaml_matches_ray_autoscaler_schema():
    jsonschema.validate(CLUSTER, ray_schema())


def test_ray_up_config_checks_pass():
    prepared = _ray_up_checks(CLUSTER)
    assert prepared["available_node_types"].keys() == CLUSTER["available_node_types"].keys()


def _misspelled_top_key(c: dict) -> None:
    c["max_worker"] = c.pop("max_workers")


def _node_type_without_node_config(c: dict) -> None:
    del c["available_node_types"]["search_l40s"]["node_config"]


def _fractional_resource(c: dict) -> None:
    c["available_node_types"]["train_h100"]["resources"]["GPU"] = 7.5


def _unknown_node_type_key(c: dict) -> None:
    c["available_node_types"]["train_h100"]["min_worker"] = 0


@pytest.mark.parametrize(
    "break_it",
    [
        _misspelled_top_key,
        _node_type_without_node_config,
        _fractional_resource,
        _unknown_node_type_key,
    ],
)
def test_schema_check_is_not_vacuous(break_it):
    broken = copy.deepcopy(CLUSTER)
    break_it(broken)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, ray_schema())
    with pytest.raises(jsonschema.ValidationError):
        _ray_up_checks(broken)


# --- network: only SSH, from one CIDR --------------------------------------------------------


def test_only_ssh_is_open_and_dashboard_is_local():
    perms = CLUSTER["provider"]["security_group"]["IpPermissions"]
    assert [(p["FromPort"], p["ToPort"]) for p in perms] == [(22, 22)]
    assert all(r["CidrIp"] != "0.0.0.0/0" for p in perms for r in p["IpRanges"])
    head = " ".join(CLUSTER["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head
    for p in docker_options(CLUSTER["head_node_type"]):  # no published container ports
        assert not p.startswith(("-p ", "--publish", "--network=host", "--net=host")), p


def test_ray_own_ssh_rule_is_documented():
    """Ray adds SSH from anywhere to a group it creates: cluster.yaml says how to avoid it."""
    rules = _ray_private()._create_default_ssh_inbound_rules()
    if any(r["CidrIp"] == "0.0.0.0/0" for rule in rules for r in rule.get("IpRanges", [])):
        assert "revoke-security-group-ingress" in CLUSTER_TEXT
        assert "--port 22 --cidr 0.0.0.0/0" in CLUSTER_TEXT


# --- shared storage and placeholders ---------------------------------------------------------


def test_run_folders_on_efs_at_the_same_path_everywhere():
    region = CLUSTER["provider"]["region"]
    init = CLUSTER["initialization_commands"]  # on every host, before docker starts
    mount = next(c for c in init if "mount -t nfs4" in c)
    efs = re.search(r"(fs-[0-9a-f]{17})\.efs\.([a-z0-9-]+)\.amazonaws\.com:/ (\S+)$", mount)
    assert efs, mount
    assert efs[2] == region
    path = efs[3]
    assert path == "/mnt/layerswap"
    assert f"-v {path}:{path}" in CLUSTER["docker"]["run_options"]  # every node type
    assert f"--env AWS_REGION={region}" in CLUSTER["docker"]["run_options"]
    for name, node in CLUSTER["available_node_types"].items():
        # Worker roles come from node_config (Ray gives its default role to the head only).
        if name != CLUSTER["head_node_type"]:
            assert "instance-profile/" in node["node_config"]["IamInstanceProfile"]["Arn"], name


@pytest.mark.parametrize(
    "placeholder",
    ["192.0.2.0/32", "ami-00000000000000000", "fs-00000000000000000", "123456789012"],
)
def test_placeholders_are_listed_at_the_top(placeholder):
    header, body = CLUSTER_TEXT.split("\ncluster_name:", 1)
    assert placeholder in header
    assert placeholder in body


# --- node types: AWS facts and what Ray makes of them ----------------------------------------


@pytest.mark.parametrize("name", sorted(CLUSTER["available_node_types"]))
def test_node_type_resources_match_aws(name):
    node = CLUSTER["available_node_types"][name]
    res, cfg = node["resources"], node["node_config"]
    ec2 = EC2[cfg["InstanceType"]]
    [gpu] = ec2["GpuInfo"]["Gpus"]
    assert res["CPU"] == ec2["VCpuInfo"]["DefaultVCpus"]
    assert res["GPU"] == gpu["Count"]
    assert gpu_type(res) == gpu["Name"]
    assert res[PREFIX + gpu["Name"]] == 1
    assert cfg["ImageId"].startswith("ami-"), "not latest_dlami (an old Ubuntu 18.04 DLAMI)"
    ram = ec2["MemoryInfo"]["SizeInMiB"] * 2**20
    store = res["object_store_memory"]
    assert res["memory"] + store <= ram - 16 * GIB, "leave the OS, docker and Ray some RAM"
    assert store < shm_bytes(name) <= ram, "Ray's object store lives in the container's /dev/shm"
    assert "--gpus all" in docker_options(name)


def test_aws_fills_the_same_resources_and_accelerator_type():
    """`ray up` on AWS fills CPU, GPU and accelerator_type:<EC2 GPU name> itself; the declared
    values (which win) agree with it, and hold when that EC2 lookup fails."""
    bare = copy.deepcopy(CLUSTER)
    for node in bare["available_node_types"].values():
        node["resources"] = {}
    filled = _ray_aws_fillout(bare)["available_node_types"]
    for name, node in CLUSTER["available_node_types"].items():
        auto = filled[name]["resources"]
        assert PREFIX + gpu_type(node["resources"]) in auto, (name, auto)
        for key, value in auto.items():
            if key != "memory":  # Ray's guess (70 % of RAM) ignores our object store size
                assert node["resources"][key] == value, (name, key)
    declared = _ray_aws_fillout(CLUSTER)["available_node_types"]
    for name, node in CLUSTER["available_node_types"].items():
        assert declared[name]["resources"] == node["resources"]


# --- the shipped real configs fit ------------------------------------------------------------


def test_real_configs_are_found():
    # Llama 3.1: 4 full + 2 LoRA experts; Qwen2.5, Aya Expanse, Falcon 3: 4 full each (math and
    # the three languages); every model one search per language.
    assert len(TRAIN_CONFIGS) == 18, TRAIN_CONFIGS
    assert len(SEARCH_CONFIGS) == 12, SEARCH_CONFIGS


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: p.stem)
def test_training_config_fits_a_node_type(path):
    exp = load_train_experiment(path)
    s = exp.scaling
    assert s.use_gpu and s.accelerator_type, path
    plan = plan_experiment(exp)
    fits = []
    for name, node in CLUSTER["available_node_types"].items():
        res = node["resources"]
        if gpu_type(res) != s.accelerator_type or res["GPU"] < s.num_workers:
            continue
        assert res["CPU"] >= s.num_workers * s.cpus_per_worker, name
        assert plan.gpu_total <= GPU_MEMORY_GIB[gpu_type(res)] * GIB, (name, plan.gpu_total / GIB)
        ram = EC2[node["node_config"]["InstanceType"]]["MemoryInfo"]["SizeInMiB"] * 2**20
        assert plan.cpu_total <= res["memory"] <= ram, name  # offloaded state (cpu_offload)
        fits.append(name)
    assert fits, f"{path.name}: no node type with {s.num_workers} x {s.accelerator_type}"
    # What Ray Train asks for per worker, and what the autoscaler starts for the whole run.
    demand = _ray_train_worker_resources(s)
    assert demand == {"CPU": s.cpus_per_worker, "GPU": 1, PREFIX + s.accelerator_type: 0.001}
    started = _ray_nodes_to_add([demand] * s.num_workers)
    assert started and set(started) <= set(fits), started


@pytest.mark.parametrize("path", SEARCH_CONFIGS, ids=lambda p: p.stem)
def test_search_config_fits_a_node_type(path):
    exp = load_search_experiment(path)
    s = exp.search
    one = model_bytes(exp.base)
    experts = (2 * exp.experts.top_k + 1) * one  # task + language experts and the base
    hosts = {
        name: node["resources"]
        for name, node in CLUSTER["available_node_types"].items()
        if node["resources"].get("GPU", 0) >= s.gpus_per_trial
        and node["resources"]["CPU"] >= s.cpus_per_trial
    }
    assert hosts, f"{path.name}: no node type takes a trial"
    for name, res in hosts.items():
        gpu = GPU_MEMORY_GIB[gpu_type(res)] * GIB * s.gpus_per_trial
        assert gpu >= 1.5 * one, f"{name}: a merged model and its eval batches on one GPU"
        # The search compares the experts with the smallest object store of the live nodes.
        if s.expert_store != "process":
            assert res["object_store_memory"] >= 1.1 * experts, (name, experts / GIB)
    # the 7 x 15-16 GB the configs' comments count (Falcon 3 7B's are the smallest, 14.9 GB)
    assert experts > 7 * 14.5e9


def test_search_node_request_starts_only_search_nodes():
    """cluster.yaml's request_resources bundles start L40S nodes, never a p5."""
    bundle = {"GPU": 4, PREFIX + "L40S": 1}
    assert json.dumps(bundle).replace('"', '\\"') in CLUSTER_TEXT
    assert _ray_nodes_to_add([bundle] * 4) == {"search_l40s": 3}  # the head is the fourth


def test_waiting_trials_start_a_p5_as_documented():
    """Trials ask for {CPU, GPU} only; once 7 wait beyond the head, Ray's autoscaler starts a p5
    (the reason cluster.yaml says to start search nodes first). If this changes, update it."""
    exp = load_search_experiment(SEARCH_CONFIGS[0])
    trial = {"CPU": exp.search.cpus_per_trial, "GPU": exp.search.gpus_per_trial}
    head = CLUSTER["available_node_types"][CLUSTER["head_node_type"]]["resources"]["GPU"]
    assert set(_ray_nodes_to_add([trial] * (head + 6))) == {"search_l40s"}
    assert "train_h100" in _ray_nodes_to_add([trial] * (head + 7))
    assert "once 7 or more wait" in CLUSTER_TEXT
