"""The embedded world (DESIGN.md §3): synthetic languages, real-schema datasets, a CPU-pretrained base.

Build with `build_world(Path("runs/world"))` or `layerswap world build --out runs/world`.
"""

from search.world.build import add_world_parser, build_world

__all__ = ["add_world_parser", "build_world"]
