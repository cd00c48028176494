"""`python -m cli ...` is `layerswap ...`."""

from cli import run

run()
