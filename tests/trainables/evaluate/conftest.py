"""Fixtures shared by the evaluator tests: the world tokenizer the tiny models use."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tok():
    from layerswap.world.tiny import tiny_tokenizer

    return tiny_tokenizer()
