"""ray_session.WORKER_ENV names every variable the code it serves reads: what
trainables/storage.py reads and names in its errors, the Hub's and datasets' token, endpoint,
cache and offline variables (read from the installed libraries' sources), and every such
variable docs/guides/cluster.md tells users to set. A variable missing here reaches the driver
but no Ray worker on another node (e.g. AWS_ENDPOINT_URL_S3: trials read the real AWS instead
of the S3-compatible store, and the storage cache keys on the wrong endpoint).

Run: .venv/bin/python -m pytest -q tests/trainables/test_worker_env_names.py
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from layerswap.trainables.ray_session import WORKER_ENV

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = r"(?:HF|HUGGING_FACE|TRANSFORMERS|AWS|GOOGLE)_[A-Z0-9_]+"
# The libraries' variables named like a location, switch or credential that layerswap does not
# use, each with why (a new one in a library upgrade fails the test until it is sorted here).
NOT_FORWARDED = {
    "HF_ASSETS_CACHE": "huggingface_hub's cache for libraries' own assets: nothing here uses it",
    "HF_INFERENCE_ENDPOINT": "the Inference API: layerswap runs models itself",
    "HF_MODULES_CACHE": "downloaded Python modules: trust_remote_code stays off",
    "HF_DATASETS_DOWNLOADED_DATASETS_PATH": "a folder under HF_DATASETS_CACHE, which is passed",
    "HF_DATASETS_EXTRACTED_DATASETS_PATH": "a folder under HF_DATASETS_CACHE, which is passed",
}
ROLES = re.compile(r"_(?:HOME|CACHE|PATH|OFFLINE|TOKEN|ENDPOINT)$")


def source(module: str) -> str:
    return Path(importlib.util.find_spec(module).origin).read_text()


def library_variables() -> set[str]:
    """The Hub's and datasets' variables for a location, switch or credential."""
    text = source("huggingface_hub.constants") + source("datasets.config")
    return {v for v in re.findall(rf'"({VARIABLE})"', text) if ROLES.search(v)}


@pytest.mark.parametrize(
    "name", ["AWS_ENDPOINT_URL_S3", "GOOGLE_APPLICATION_CREDENTIALS", "HF_TOKEN", "HF_HOME"]
)
def test_storage_and_hub_settings_are_forwarded(name):
    assert name in WORKER_ENV


def test_what_storage_reads_or_asks_for_is_forwarded():
    text = (ROOT / "trainables" / "storage.py").read_text()
    read = set(re.findall(rf"environ\.get\(\"({VARIABLE})\"", text))
    asked = set(re.findall(rf"\b({VARIABLE})\b", text))  # its errors name the credentials
    assert "AWS_ENDPOINT_URL_S3" in read  # what its cache keys on (the check sees the file)
    assert (read | asked) - set(WORKER_ENV) == set()


def test_the_hub_and_datasets_variables_are_forwarded_or_excluded_with_a_reason():
    found = library_variables()
    assert {"HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE"} <= found
    missing = found - set(WORKER_ENV) - set(NOT_FORWARDED)
    assert missing == set(), f"add to WORKER_ENV or NOT_FORWARDED (with why): {sorted(missing)}"
    assert set(NOT_FORWARDED) <= found, "an exclusion the libraries no longer read"


def test_every_variable_the_cluster_guide_names_is_forwarded():
    guide = (ROOT / "docs" / "guides" / "cluster.md").read_text()
    named = set(re.findall(rf"`({VARIABLE})`", guide))
    assert {"AWS_ENDPOINT_URL_S3", "GOOGLE_APPLICATION_CREDENTIALS"} <= named
    assert named - set(WORKER_ENV) == set()
