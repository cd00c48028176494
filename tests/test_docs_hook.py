"""The docs build hook (docs/hooks/reference.py) replaces each reference marker with the
generated Markdown and fails the build on a marker it does not know.

Run: .venv/bin/python -m pytest -q tests/test_docs_hook.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("docs_hook", ROOT / "docs/hooks/reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_markers_become_the_generated_reference(hook):
    from layerswap.cli.reference import cli_reference
    from layerswap.spaces.reference import config_reference, schema_index

    page = "# Ref\n\n<!-- layerswap:{} -->\n\nafter\n"
    for name, text in (("configs", config_reference()), ("cli", cli_reference()), ("schemas", schema_index())):  # fmt: skip
        assert hook.on_page_markdown(page.format(name), None, None, None) == page.replace("<!-- layerswap:{} -->", text)  # fmt: skip


def test_the_reference_pages_hold_their_markers(hook):
    for name in ("configs", "cli", "schemas"):
        assert f"<!-- layerswap:{name} -->" in (ROOT / f"docs/reference/{name}.md").read_text()


def test_an_unknown_marker_fails_the_build(hook):
    from mkdocs.exceptions import PluginError

    with pytest.raises(PluginError, match="configz"):
        hook.on_page_markdown("<!-- layerswap:configz -->", None, None, None)


def test_the_github_only_note_is_on_the_source_page_and_not_the_built_one(hook):
    # A reader of the Markdown on GitHub sees where the tables are; the built page has them.
    for name in ("configs", "cli"):
        source = (ROOT / f"docs/reference/{name}.md").read_text()
        assert "`make docs` generates them" in source, name
        built = hook.on_page_markdown(source, None, None, None)
        assert "make docs" not in built and "github-only" not in built, name
