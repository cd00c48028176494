"""The project's own error for work that ran and failed as a whole (exit 1 from the CLI, one line).

Bad input is a ValueError (exit 2, raised before any work); `RunFailed` is for a run whose every
unit failed, e.g. a promotion in which no model could be evaluated (the reasons are in its
leaderboard), so a script running `layerswap search ... && next` stops there.
"""

from __future__ import annotations


class RunFailed(RuntimeError):
    """Work ran, and none of it succeeded; the message says why and where the details are."""
