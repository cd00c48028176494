"""Wiring and the `layerswap` command line."""
