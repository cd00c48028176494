"""One base for every config in spaces/: the strict model, the file readers, the path rule.

Every YAML layerswap reads (merge recipes, training and search experiments) goes through
`load_yaml` + `validate`, so a bad file always gets the same wording: the file, then one
`field.path: message` line per bad field. Text that is not UTF-8 or not valid YAML/JSON names
the file and line the same way wherever it is read (`read_text`, `load_yaml`, `load_json`,
`iter_jsonl`, `read_jsonl`, `check_jsonl`): "data.jsonl:17: not valid JSON (Expecting value at
column 1)". The relative-path rule (`resolve_local`) is the same for every file: a relative
path is taken against the file's own folder when something exists there; otherwise it is kept
as written (a Hub id such as `meta-llama/Llama-3.1-8B`, a cloud URI, or a path the command
resolves against the working directory).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from huggingface_hub.utils import HFValidationError, validate_repo_id
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

# Rows per forward pass in an evaluation: a number, or "auto" (the device's default; on a GPU
# the largest that fits, halved on out-of-memory as lm-eval's batch_size auto does).
BatchSize = Annotated[int, Field(ge=1)] | Literal["auto"]
# Where a model is evaluated; "auto" is the GPU when there is one
# (trainables.evaluate.harness.resolve_device).
Device = Literal["auto", "cpu", "cuda"]

T = TypeVar("T")

# Bounds a typo could pass by orders of magnitude (a search of 1e12 trials ran with an ETA of
# 2e8 hours): far above any real search or sweep, and any context a model generates into.
MAX_TRIALS = 100_000
MAX_GEN_TOKS = 131_072


# The opt-out of StrictModel's finite-number rule, for a field whose meaning needs NaN or an
# infinity: `x: float = Field(0.0, allow_inf_nan=True)`, or `x: MayBeNonFinite = 0.0`.
MayBeNonFinite = Annotated[float, Field(allow_inf_nan=True)]


class StrictModel(BaseModel):
    """Frozen pydantic model that refuses unknown keys (a typo is an error, never ignored) and
    non-finite numbers (NaN, Inf) in every float field, however nested, unless the field opts
    out (`MayBeNonFinite`). The finite check comes before a field's range check, so `.nan`
    reads "must be a finite number, got nan", never "should be greater than 0".

    Every field carries a one-line docstring under it (`use_attribute_docstrings`): it becomes
    the field's description, which the config reference (docs/reference/configs.md) and the JSON
    Schemas (`layerswap schema`) show; tests/spaces/test_config_reference.py fails on a field
    without one.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False
    )


def field_errors(e: ValidationError, top: str) -> str:
    """Indented `field.path: message` lines, one per error.

    Args:
        e: the pydantic error.
        top: what to call an error at the root (e.g. "<recipe>").
    Returns:
        the lines joined by newlines.
    """
    lines: list[str] = []
    for err in e.errors():
        loc, msg = err["loc"], err["msg"]
        if err["type"] == "finite_number":
            # pydantic's own text names neither the value nor which rule; a union field
            # (`int | float`) fails once per member, and says it once here.
            loc, msg = _field_loc(loc), f"must be a finite number, got {err['input']!r}"
        line = f"  {'.'.join(str(p) for p in loc) or top}: {msg}"
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


# The names pydantic gives the members of a union in an error's location.
_UNION_MEMBERS = {"int", "float", "constrained-int", "constrained-float"}


def _field_loc(loc: tuple) -> tuple:
    """`loc` without its trailing union-member names (("span", "low", "float") -> span.low)."""
    while loc and loc[-1] in _UNION_MEMBERS:
        loc = loc[:-1]
    return loc


def decode_utf8(
    data: bytes, where: str, error: type[ValueError] = ValueError, offset: int = 0
) -> str:
    """`data` decoded as UTF-8; anything else raises `error` naming `where` and the bad byte.

    Args:
        data: the bytes.
        where: the file (or "file:line") for the message.
        error: the ValueError subclass to raise.
        offset: where `data` starts in the file, so the message gives a file offset.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        at = offset + e.start
        raise error(
            f"{where}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {at})"
        ) from None


def read_text(path: Path, what: str, error: type[ValueError] = ValueError) -> str:
    """The UTF-8 text of `path` (a leading byte-order mark dropped), whatever the locale.

    Args:
        path: the file.
        what: what the file should hold, for the message ("recipe", "dataset").
        error: the ValueError subclass to raise when it cannot be read or is not UTF-8.
    """
    try:
        data = _read_bytes(Path(path))
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror}") from None
    if data is None:
        raise error(f"{path}: cannot read {what}: not a file (more than {_STREAM_MAX >> 20} MiB from a pipe or device)")  # fmt: skip
    return decode_utf8(data, str(path), error).removeprefix("\ufeff")


_STREAM_MAX = 64 << 20  # what a config read from a pipe or device may hold


def _read_bytes(path: Path) -> bytes | None:
    """A file's bytes; from a pipe or device (`<(...)`, /dev/stdin) at most _STREAM_MAX of them
    (None beyond: /dev/zero filled memory). Opened without blocking, so a FIFO nobody writes
    reads as empty instead of hanging the command."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, "rb") as f:
        os.set_blocking(fd, True)  # a writer that is there: wait for what it writes
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return f.read()
        data = f.read(_STREAM_MAX + 1)
    return data if len(data) <= _STREAM_MAX else None


def _yaml_message(path: Path, text: str, e: yaml.YAMLError) -> str:
    """`file:line:column: not valid YAML (problem)`, or without the place when PyYAML gives none."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        problem = ", ".join(x for x in (e.context, e.problem) if x)
        return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML ({problem})"
    if isinstance(e, yaml.reader.ReaderError):  # a control character; it has a position only
        line = text.count("\n", 0, e.position) + 1
        return f"{path}:{line}: not valid YAML ({e.reason}: #x{e.character:04x})"
    return f"{path}: not valid YAML ({' '.join(str(e).split())})"


class _NoDuplicateKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last
    one silently, so `num_samples: 2` ... `num_samples: 500` ran 500 trials (a red-team found
    it). Keys brought in by a `<<` merge may still be overridden, as YAML intends."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if first is not key_node:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} given twice (first on line {first.start_mark.line + 1})",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


_NoDuplicateKeys.add_constructor("tag:yaml.org,2002:map", _NoDuplicateKeys.construct_yaml_map)


def parse_yaml(text: str) -> Any:
    """YAML text parsed like PyYAML's safe_load, but refusing a mapping key given twice."""
    return yaml.load(text, Loader=_NoDuplicateKeys)  # a SafeLoader: builds no Python objects


def load_yaml(path: Path, what: str, error: type[ValueError] = ValueError) -> Any:
    """The parsed YAML of `path`; unreadable, non-UTF-8 or malformed files raise `error`.

    Every message names the file; syntax errors also the line and column.

    Args:
        path: the file.
        what: what the file should hold, for the message ("recipe", "experiment").
        error: the ValueError subclass to raise.
    """
    text = read_text(path, what, error)
    try:
        return parse_yaml(text)
    except yaml.YAMLError as e:
        raise error(_yaml_message(path, text, e)) from None


def _json_error(where: str, e: json.JSONDecodeError) -> str:
    return f"{where}: not valid JSON ({e.msg} at column {e.colno})"


def load_json(path: Path, what: str, error: type[ValueError] = ValueError) -> Any:
    """The parsed JSON document in `path`; errors name the file and, for syntax, the line.

    Args:
        path: the file.
        what: what the file should hold, for the message.
        error: the ValueError subclass to raise.
    """
    text = read_text(path, what, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(_json_error(f"{path}:{e.lineno}", e)) from None


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def iter_jsonl(
    path: Path, error: type[ValueError] = ValueError, *, objects: bool = False
) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for every non-blank line of a JSON-lines file.

    Reads one line at a time, so a large file is never held whole. A line that is not UTF-8,
    not JSON or (with `objects`) not a JSON object raises `error` naming "file:line".

    Args:
        path: the file.
        error: the ValueError subclass to raise.
        objects: every line must be a JSON object (a row).
    """
    try:
        f = open(path, "rb")  # not in the with: only an open error gets this message
    except OSError as e:
        raise error(f"{path}: cannot read JSON lines: {e.strerror}") from None
    with f:
        offset = 0
        for n, raw in enumerate(f, 1):  # split on b"\n" only: JSON strings may hold U+2028
            line = decode_utf8(raw, f"{path}:{n}", error, offset)
            offset += len(raw)
            if n == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))  # error columns stay on this line
            except json.JSONDecodeError as e:
                raise error(_json_error(f"{path}:{n}", e)) from None
            if objects and not isinstance(value, dict):
                got = _JSON_TYPES.get(type(value), "number")
                raise error(f"{path}:{n}: expected a JSON object, got a JSON {got}")
            yield n, value


def check_jsonl(path: Path, error: type[ValueError] = ValueError) -> int:
    """Check that `path` is JSON lines of objects without keeping the rows (any size of file).

    Returns:
        the number of rows.
    """
    return sum(1 for _ in iter_jsonl(path, error, objects=True))


def read_jsonl(path: Path, error: type[ValueError] = ValueError) -> list[dict]:
    """The rows of a JSON-lines file; every non-blank line must be a JSON object.

    Args:
        path: the file.
        error: the ValueError subclass to raise (messages name "file:line").
    Returns:
        the rows, in file order.
    """
    return [row for _, row in iter_jsonl(path, error, objects=True)]


# Who can say which other kind of config a mapping is, when it fails the kind expected: a train
# config given to `plan` is then one line naming its command, not every field a study rejects.
# spaces/reference.py registers itself (it imports every config model, which import this
# module); the CLI imports it.
KIND_NAMERS: list[Callable[[dict, Any], str | None]] = []


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
        for name_kind in KIND_NAMERS:  # a file given to the command of another kind
            if (said := name_kind(data, schema)) is not None:
                a = "an" if what[:1] in "aeiou" else "a"
                raise error(f"{source}: not {a} {what}: {said}") from None
        raise error(f"{source}: invalid {what}\n" + field_errors(e, top)) from None


def uri_scheme(path: object) -> str | None:
    """The URI scheme of `path` ("s3", "gs", "file"), or None for a plain local path.

    The one definition of what a URI is; reading and writing them is trainables/storage.py's.
    """
    head, sep, _ = str(path).partition("://")
    return head.lower() if sep and head.isidentifier() else None


def is_uri(path: object) -> bool:
    """Whether `path` is a URI (`scheme://...`, file:// included) rather than a plain path."""
    return path is not None and uri_scheme(path) is not None


def is_hub_id(ref: str) -> bool:
    """Whether a model reference names a Hugging Face Hub repository rather than a local folder.

    The one rule (the merge engine downloads by it, the preflight and `plan` leave such a model
    unchecked, a model card's `base_model` carries only such an id): `owner/name` (a bare name
    is as likely a folder here), valid by huggingface_hub's own rule, no leading `.`, `/` or
    `~`, not a URI, and nothing of that name on disk (a folder `org/model` here is that folder).
    """
    if not isinstance(ref, str) or is_uri(ref) or ref.count("/") != 1:
        return False
    if ref.startswith((".", "/", "~")) or Path(ref).expanduser().exists():
        return False
    try:
        validate_repo_id(ref)
    except HFValidationError:
        return False
    return True


def same_model(a: str, b: str) -> bool:
    """Whether two model references name one model: equal strings; two spellings of one local
    folder (relative, `..`, symlinks); or a local folder and a copy of it elsewhere (a Hub id or a
    cloud URI), known as one by its name: the folder is named as the Hub repo or the URI's last
    part (`huggingface-cli download --local-dir` copies, an upload to a bucket), or is the HF
    cache's `models--ORG--NAME`. Two Hub ids, two URIs, or a Hub id and a URI compare as written.

    Args:
        a, b: checkpoint folders, Hub ids or URIs (e.g. a registry row's `base` and a search's).
    """
    if a == b:
        return True
    remote = [x for x in (a, b) if is_uri(x) or is_hub_id(x)]
    if not remote:
        return os.path.realpath(a) == os.path.realpath(b)
    if len(remote) == 2:
        return False
    # Experts trained from the Hub id or a bucket's copy, searched with a local copy (or the
    # reverse): one model in two places.
    other = remote[0]
    local = Path(os.path.realpath(b if other == a else a))
    name = other.rstrip("/").rsplit("/", 1)[-1]
    if is_hub_id(other):
        org = other.split("/")[0]
        if f"models--{org}--{name}" in local.parts:
            return True
    return local.name == name


def resolve_local(value: object, root: Path) -> object:
    """The path rule: `value` made absolute against `root` if it names something there.

    Anything else (absolute paths, Hub ids, URIs, paths that do not exist under `root`, non-str
    values) is returned unchanged.
    """
    if isinstance(value, str) and not is_uri(value) and not Path(value).is_absolute():
        if (root / value).exists():
            return str((root / value).resolve())
    return value
