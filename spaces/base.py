"""One base for every config in spaces/: the strict model, the YAML loader, the path rule.

Every YAML layerswap reads (merge recipes, training and search experiments) goes through
`load_yaml` + `validate`, so a bad file always gets the same wording: the file, then one
`field.path: message` line per bad field. The relative-path rule (`resolve_local`) is the same
for every file: a relative path is taken against the file's own folder when something exists
there; otherwise it is kept as written (a Hub id such as `meta-llama/Llama-3.1-8B`, a cloud
URI, or a path the command resolves against the working directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

T = TypeVar("T")


class StrictModel(BaseModel):
    """Frozen pydantic model that refuses unknown keys (a typo is an error, never ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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


def load_yaml(path: Path, what: str, error: type[ValueError] = ValueError) -> Any:
    """The parsed YAML of `path`; unreadable or malformed files raise `error` naming the file.

    Args:
        path: the file.
        what: what the file should hold, for the message ("recipe", "experiment").
        error: the ValueError subclass to raise.
    """
    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None


def validate(
    schema: TypeAdapter[T] | type[T],
    data: object,
    *,
    source: str,
    what: str,
    top: str = "<root>",
    error: type[ValueError] = ValueError,
    not_a_mapping: str | None = None,
) -> T:
    """`data` validated into `schema`; errors name `source` and every offending field.

    Args:
        schema: a pydantic model class or a TypeAdapter (for discriminated unions).
        data: the parsed YAML; it must be a mapping.
        source: the file or other origin, first in every message.
        what: what `data` should be ("recipe", "experiment", "search experiment").
        top: the name of the root in field errors.
        error: the ValueError subclass to raise.
        not_a_mapping: the message when `data` is not a mapping (default: names its type).
    """
    if not isinstance(data, dict):
        raise error(not_a_mapping or f"{source}: expected a mapping, got {type(data).__name__}")
    adapter = schema if isinstance(schema, TypeAdapter) else TypeAdapter(schema)
    try:
        return adapter.validate_python(data)
    except ValidationError as e:
        raise error(f"{source}: invalid {what}\n" + field_errors(e, top)) from None


def resolve_local(value: object, root: Path) -> object:
    """The path rule: `value` made absolute against `root` if it names something there.

    Anything else (absolute paths, Hub ids, URIs, paths that do not exist under `root`, non-str
    values) is returned unchanged.
    """
    if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
        if (root / value).exists():
            return str((root / value).resolve())
    return value
