"""`python -m layerswap.cli ...` is `layerswap ...`."""

from layerswap.cli import run

run()
