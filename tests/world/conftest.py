"""Fixtures for the embedded-world tests (the tiny world comes from tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def jsonl():
    return read_jsonl
