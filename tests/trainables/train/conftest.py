"""Fixtures for the trainer tests (the tiny world comes from tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every trainer test runs on one intra-op thread (tests/conftest.py `one_thread`)."""
    yield
