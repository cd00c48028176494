"""The embedded world (docs/world/index.md): synthetic languages, real-schema datasets, a
CPU-pretrained base.

A data generator, not a search driver: `build_world(Path("runs/world"))` or `layerswap world
build --out runs/world`; `layerswap.world.tiny` makes the tiny generated model family the tests and the
merge-only demo use.
"""

from layerswap.world.build import build_world

__all__ = ["build_world"]
