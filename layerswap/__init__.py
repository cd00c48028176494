"""layerswap: cross-lingual transfer by layer swapping — train experts, search merges, analyse.

One import name for the whole project. The rooms live at the repository root (`search/`,
`trainables/`, `spaces/`, `analysis/`, `world/`, `cli/`) and pyproject.toml maps each into this
namespace (`layerswap.search`, ...), so an installed layerswap adds exactly one top-level package.
"""

__version__ = "0.1.0"
