"""trainables/merge/adapter_kind.py: an expert is typed "full" only when it has no adapter config,
never because reading that config failed (an S3 credentials or network error).

Run: .venv/bin/python -m pytest -q tests/trainables/merge/test_adapter_kind.py
"""

from __future__ import annotations

import json

import pytest

from layerswap.trainables.merge import adapter_kind
from layerswap.trainables.merge.adapter_kind import expert_kind, is_lora_adapter
from layerswap.trainables.storage import (
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
)


def test_local_folders_are_typed_by_their_config(tmp_path):
    lora, full, odd = tmp_path / "lora", tmp_path / "full", tmp_path / "odd"
    for d in (lora, full, odd):
        d.mkdir()
    (lora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    (odd / "adapter_config.json").write_text("[1, 2]")  # JSON, but not PEFT's object
    (tmp_path / "file").write_text("x")
    assert is_lora_adapter(lora) and expert_kind(lora) == "lora"
    assert expert_kind(full) == "full" and expert_kind(odd) == "full"
    assert not is_lora_adapter(tmp_path / "missing") and not is_lora_adapter(tmp_path / "file")


@pytest.mark.parametrize(
    "error", [StoragePermissionError("s3://b/x: access denied"), StorageError("s3://b/x: timeout")]
)
def test_a_failed_read_is_raised_not_typed_full(monkeypatch, error):
    def fail(path):
        raise error

    monkeypatch.setattr(adapter_kind, "read_text", fail)
    with pytest.raises(type(error), match="s3://b/x"):
        expert_kind("s3://b/x")


def test_a_missing_object_is_no_adapter(monkeypatch):
    def missing(path):
        raise StorageNotFoundError(f"{path}: no such object or folder")

    monkeypatch.setattr(adapter_kind, "read_text", missing)
    assert expert_kind("s3://b/x") == "full"
