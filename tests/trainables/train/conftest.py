"""Fixtures for the trainer tests: the tiny embedded world, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    """The tiny world under the session's base temp (build_world is a no-op once complete)."""
    from search.world import build_world

    return build_world(tmp_path_factory.getbasetemp() / "tiny_world", seed=0, size="tiny", progress=False)  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared 2-core box: one intra-op thread is ~10x faster than spinning two."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
