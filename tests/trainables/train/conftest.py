"""Fixtures for the trainer tests (the tiny world comes from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every trainer test runs on one intra-op thread (tests/conftest.py `one_thread`)."""
    yield


@pytest.fixture(scope="session")
def bf16_world(tiny_world, tmp_path_factory) -> Path:
    """The tiny world with its base saved in bf16 (data shared by symlink)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("bf16_world")
    (root / "data").symlink_to(tiny_world / "data")
    model = AutoModelForCausalLM.from_pretrained(tiny_world / "base", dtype=torch.bfloat16)
    model.save_pretrained(root / "base")
    AutoTokenizer.from_pretrained(tiny_world / "base").save_pretrained(root / "base")
    return root
