"""Fixtures for the embedded-world tests: tiny worlds built once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    """A tiny world, seed 0."""
    from search.world import build_world

    return build_world(tmp_path_factory.mktemp("w0") / "world", seed=0, size="tiny", progress=False)


@pytest.fixture
def jsonl():
    return read_jsonl
