"""mkdocs hook: fills the reference pages from the code at build time (placeholder, see issue 38).

Run by `make docs` (mkdocs build --strict); a page marker `<!-- layerswap:NAME -->` is replaced by
generated Markdown.
"""


def on_page_markdown(markdown, page, config, files):  # mkdocs hook signature
    return markdown
