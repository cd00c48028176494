"""layerswap: cross-lingual transfer by layer swapping — train experts, search merges, analyse.

One import name for the whole project. The rooms live at the repository root (`search/`,
`trainables/`, `spaces/`, `analysis/`, `world/`, `cli/`) and pyproject.toml maps each into this
namespace (`layerswap.search`, ...), so an installed layerswap adds exactly one top-level package.
"""

import os as _os

__version__ = "0.1.0"

# A source checkout on sys.path without an install (PYTHONPATH=repo, as the lent GPU machine runs
# it, where the repository's folder comes before the installed copy): this package is then the
# bare `layerswap/` folder, and `layerswap.search` would not resolve. The repository root, which
# holds the rooms, joins the package's path, mapping them as pyproject's package-dir does. Only
# where the root is this project's checkout: an installed wheel's parent is site-packages.
_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "pyproject.toml")) and _os.path.isdir(
    _os.path.join(_ROOT, "trainables")
):
    __path__.append(_ROOT)
