"""One wording for invalid configs: a pydantic ValidationError as lines naming each bad field.

Used by every loader in spaces/ (recipes, training experiments, search experiments).
"""

from __future__ import annotations

from pydantic import ValidationError


def field_errors(e: ValidationError, top: str) -> str:
    """Indented `field.path: message` lines, one per error.

    Args:
        e: the pydantic error.
        top: what to call an error at the root (e.g. "<recipe>").
    Returns:
        the lines joined by newlines.
    """
    return "\n".join(
        f"  {'.'.join(str(p) for p in err['loc']) or top}: {err['msg']}" for err in e.errors()
    )
