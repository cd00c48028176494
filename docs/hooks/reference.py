"""mkdocs hook: fills the reference pages from the code at build time.

Run by `make docs` (mkdocs build --strict, mkdocs.yml `hooks:`). A page marker
`<!-- layerswap:NAME -->` is replaced by generated Markdown: `configs` (every config field, from
the pydantic models: layerswap.spaces.reference), `cli` (every command and argument, from the
argparse parsers: layerswap.cli.reference), `schemas` (the JSON Schema files). An unknown NAME
fails the build. Text between `<!-- github-only -->` and `<!-- /github-only -->` is dropped: it
tells a reader of the Markdown source (on GitHub) where the generated tables are.
"""

from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"<!-- layerswap:([\w-]+) -->")
# A note for the unbuilt page only: on the built one the tables it points to are right there.
GITHUB_ONLY = re.compile(r"<!-- github-only -->.*?<!-- /github-only -->\n?", re.S)


def _generated(name: str) -> str:
    if name == "configs":
        from layerswap.spaces.reference import config_reference

        return config_reference()
    if name == "cli":
        from layerswap.cli.reference import cli_reference

        return cli_reference()
    if name == "schemas":
        from layerswap.spaces.reference import schema_index

        return schema_index()
    raise PluginError(f"unknown reference marker <!-- layerswap:{name} --> (configs, cli, schemas)")


def on_page_markdown(markdown, page, config, files):  # mkdocs hook signature
    return MARKER.sub(lambda m: _generated(m.group(1)), GITHUB_ONLY.sub("", markdown))
