"""The config file kinds, generated into the config reference (Markdown) and JSON Schemas.

Everything here is read off the pydantic models: field names, types, defaults and the
descriptions (each field's docstring, spaces.base.StrictModel). `config_reference()` is the
Markdown of docs/reference/configs.md (filled in by the docs build hook), `json_schema(kind)` what
`layerswap schema KIND` prints and docs/schemas/KIND.schema.json holds. Pure data: no torch, no
ray. Run: `python -c "from layerswap.spaces.reference import config_reference as r; print(r())"`.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from layerswap.spaces.base import KIND_NAMERS, StrictModel
from layerswap.spaces.recipe import Recipe, load_recipe
from layerswap.spaces.search_experiment import SearchExperiment, load_search_experiment
from layerswap.spaces.study import Profiles, Study, load_profiles, load_study
from layerswap.spaces.train_experiment import TrainExperiment, load_train_experiment
from layerswap.spaces.world import FIXED, WorldConfig, load_variant

DRAFT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class ConfigKind:
    """One kind of config file: its model, the command that reads it and the loader."""

    name: str  # `layerswap schema NAME`, docs/schemas/NAME.schema.json
    title: str
    schema: Any  # a model class, or an annotated union of them (recipes)
    read_by: str  # the command line that reads such a file
    load: Callable[[Path], object]  # the loader that accepts such a file
    omit: tuple[str, ...] = ()  # top-level fields a file of this kind may not set


def _world_variant(path: Path) -> WorldConfig:
    """A world variant file, read as `world build --config` reads it (on the full preset)."""
    return load_variant(path, "full", 0)


_KINDS = (
    ConfigKind(
        "train",
        "Training experiment",
        TrainExperiment,
        "layerswap train FILE",
        load_train_experiment,
    ),
    ConfigKind(
        "search",
        "Merge-search experiment",
        SearchExperiment,
        "layerswap search FILE",
        load_search_experiment,
    ),
    ConfigKind("recipe", "Merge recipe", Recipe, "layerswap merge FILE", load_recipe),
    ConfigKind("study", "Study", Study, "layerswap plan FILE", load_study),
    # a variant replaces fields of a preset; seed, size and version come from the command line
    ConfigKind(
        "world",
        "World config variant",
        WorldConfig,
        "layerswap world build --config FILE",
        _world_variant,
        FIXED,
    ),
    ConfigKind(
        "profiles",
        "Throughput profiles",
        Profiles,
        "layerswap plan (as spaces/throughput.yaml)",
        load_profiles,
    ),
)
KINDS: dict[str, ConfigKind] = {k.name: k for k in _KINDS}


def other_kind(data: dict, schema: Any) -> ConfigKind | None:
    """The kind of config file `data` is, when it is not the one `schema` reads: a train config
    given to `plan`, a search config given to `merge` get one line saying so, not every field
    the expected kind rejects.

    Args:
        data: the parsed YAML mapping that failed `schema`.
        schema: what the command expected (a model class, an annotated union or a TypeAdapter).
    """
    expected = getattr(schema, "_type", schema)  # a TypeAdapter keeps its type there
    for k in _KINDS:
        if k.schema is expected or k.schema is schema or any(f in data for f in k.omit):
            continue
        try:
            TypeAdapter(k.schema).validate_python(data)
        except (ValidationError, ValueError, TypeError):
            continue
        return k
    return None


def _say_other_kind(data: dict, schema: Any) -> str | None:
    k = other_kind(data, schema)
    return None if k is None else f"it is a {k.title.lower()}, which `{k.read_by}` reads"


KIND_NAMERS.append(_say_other_kind)


# ------------------------------------------------------------------------------ JSON Schemas


def json_schema(kind: str) -> dict:
    """The JSON Schema (draft 2020-12) of a config file kind.

    Args:
        kind: a key of KINDS.
    Returns:
        the schema, with `$schema`, a title and the fields' descriptions.
    Raises:
        ValueError naming an unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown config kind {kind!r} (known: {', '.join(KINDS)})")
    k = KINDS[kind]
    schema = TypeAdapter(k.schema).json_schema(mode="validation")
    for name in k.omit:
        schema["properties"].pop(name, None)
    head = {"$schema": DRAFT, "title": f"layerswap {k.title.lower()}"}
    head["description"] = f"A layerswap {k.title.lower()}, read by `{k.read_by}`."
    return head | {key: v for key, v in schema.items() if key not in ("title", "description")}


def schema_text(kind: str) -> str:
    """`json_schema(kind)` as the text `layerswap schema` prints and docs/schemas/ holds."""
    return json.dumps(json_schema(kind), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------- the models


def models_of(kind: str) -> list[tuple[type[BaseModel], list[str]]]:
    """Every model a kind's files contain, in reading order, each with the dotted paths it is at.

    The root is at "" (a recipe method's fields are top-level keys); a list item adds `[]`, a
    mapping's value `.<key>`.
    """
    seen: dict[type[BaseModel], list[str]] = {}
    queue = [(m, "") for m in _models_in(KINDS[kind].schema)]
    while queue:
        model, path = queue.pop(0)
        if model in seen:
            if path not in seen[model]:
                seen[model].append(path)
            continue
        seen[model] = [path]
        for name, field in model.model_fields.items():
            for child, suffix in _children(field.annotation):
                queue.append((child, f"{path}.{name}{suffix}".lstrip(".")))
    return list(seen.items())


def _models_in(tp: Any) -> list[type[BaseModel]]:
    return [m for m, _ in _children(tp)]


def _children(tp: Any, suffix: str = "") -> Iterator[tuple[type[BaseModel], str]]:
    """(model, path suffix) for every model inside a type annotation."""
    origin = get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        yield tp, suffix
    elif origin is Annotated:
        yield from _children(get_args(tp)[0], suffix)
    elif origin in (Union, types.UnionType, tuple):
        for a in get_args(tp):
            yield from _children(a, suffix)
    elif origin is list:
        yield from _children(get_args(tp)[0], suffix + "[]")
    elif origin is dict:
        yield from _children(get_args(tp)[1], suffix + ".<key>")


def config_models() -> list[type[StrictModel]]:
    """Every config model of spaces/ (each StrictModel subclass defined in layerswap.spaces)."""
    out, todo = [], list(StrictModel.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo += cls.__subclasses__()
        if cls.__module__.startswith("layerswap.spaces.") and cls not in out:
            out.append(cls)
    return sorted(out, key=lambda c: (c.__module__, c.__qualname__))


def undocumented(models: Iterable[type[BaseModel]]) -> list[str]:
    """`Model.field` for every field without a description (a docstring under the field)."""
    return [
        f"{m.__module__}.{m.__qualname__}.{name}"
        for m in models
        for name, f in m.model_fields.items()
        if not (f.description or "").strip()
    ]


# --------------------------------------------------------------------------------- Markdown


def _anchor(kind: str, model: type) -> str:
    return f"{kind}-{model.__name__.lower()}"


def _escape(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped, `<` kept visible outside code spans."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts).replace("|", "\\|")


def _value(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return repr(v)


def _constraints(metadata: Iterable[Any]) -> list[str]:
    """The field's limits in words (≥ 0, at least 1 item, pattern)."""
    words = []
    for m in metadata:
        if isinstance(m, FieldInfo):  # Annotated[int, Field(ge=1)]
            words += _constraints(m.metadata)
            continue
        for attr, fmt in (("ge", "≥ {}"), ("gt", "> {}"), ("le", "≤ {}"), ("lt", "< {}")):
            if getattr(m, attr, None) is not None:
                words.append(fmt.format(getattr(m, attr)))
        if getattr(m, "min_length", None):
            words.append(f"at least {m.min_length}")
        if getattr(m, "max_length", None):
            words.append(f"at most {m.max_length}")
        if getattr(m, "pattern", None):
            words.append(f"matches `{m.pattern}`")
    return words


def type_text(tp: Any, kind: str, models: set[type]) -> str:
    """A readable type: `int`, `list[str]`, `"a" | "b"`, model names linked to their section.

    Args:
        tp: the annotation.
        kind: the config kind (anchors are per kind).
        models: the models that have a section to link to.
    """
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        name = tp.__name__
        return f"[{name}](#{_anchor(kind, tp)})" if tp in models else name
    if isinstance(tp, type) and origin is None:
        return tp.__name__
    if origin is Literal:
        return " | ".join(_value(a) for a in args)
    if origin is Annotated:
        limits = _constraints(args[1:])
        inner = type_text(args[0], kind, models)
        return f"{inner} ({', '.join(limits)})" if limits else inner
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(a, kind, models) for a in args)
    inner = ", ".join(type_text(a, kind, models) for a in args)
    return f"{getattr(origin, '__name__', str(origin))}[{inner}]"


def default_text(field: FieldInfo) -> str:
    """The field's default as YAML would write it, or "required"."""
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel) and value == type(value).model_construct():
        return "its fields' defaults"
    dumped = TypeAdapter(Any).dump_python(value, mode="json")
    return f"`{json.dumps(dumped, separators=(', ', ': '))}`"


def _row(path: str, name: str, field: FieldInfo, kind: str, models: set[type]) -> str:
    tp = type_text(field.annotation, kind, models)
    limits = _constraints(field.metadata)
    if limits:
        tp += f" ({', '.join(limits)})"
    dotted = f"{path}.{name}" if path else name
    cells = (f"`{dotted}`", _escape(tp), _escape(default_text(field)), _escape(field.description))
    return "| " + " | ".join(cells) + " |"


def _fields(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    """The model's fields in declaration order, a selector (`method: soup`, `type: lora`) first."""

    def selector(item: tuple[str, FieldInfo]) -> bool:
        tp = item[1].annotation
        return get_origin(tp) is Literal and len(get_args(tp)) == 1

    return sorted(model.model_fields.items(), key=lambda item: not selector(item))


def kind_reference(kind: str, level: int = 2) -> str:
    """The Markdown section of one config kind: every model it contains, one table each."""
    k = KINDS[kind]
    found = models_of(kind)
    models = {m for m, _ in found}
    h = "#" * level
    out = [f"{h} {k.title} {{ #{kind} }}", ""]
    out += [f"Read by `{k.read_by}`. JSON Schema: `docs/schemas/{kind}.schema.json`.", ""]
    if k.omit:
        fixed = ", ".join(f"`{o}`" for o in k.omit)
        out += [f"A file of this kind may not set {fixed}: the command sets them.", ""]
    for model, paths in found:
        out += [f"{h}# {model.__name__} {{ #{_anchor(kind, model)} }}", ""]
        where = ", ".join(f"`{p}`" for p in paths if p) or "the top level"
        out += [f"At {where}.", ""]
        if model.__doc__:
            out += [" ".join(model.__doc__.split()), ""]
        out += ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
        for name, field in _fields(model):
            out.append(_row(paths[0], name, field, kind, models))
        out.append("")
    return "\n".join(out)


def config_reference() -> str:
    """The whole config reference (docs/reference/configs.md's generated part)."""
    out = ["Generated from the pydantic models in `spaces/` (the field docstrings); every kind "]
    out[0] += "of config file, every field. Dotted names are paths into the YAML file; `[]` marks "
    out[0] += "a list item, `<key>` a key of your choosing."
    out += [""] + [f"- [{k.title}](#{k.name}) — `{k.read_by}`" for k in KINDS.values()] + [""]
    return "\n".join(out + [kind_reference(k) for k in KINDS])


def schema_index(href: str = "../schemas/{kind}.schema.json") -> str:
    """A Markdown table of the JSON Schemas: kind, file (linked by `href`) and the command.

    Args:
        href: the link to a schema file, `{kind}` replaced by its kind.
    """
    out = ["| Kind | Schema | Files of this kind are read by |", "| --- | --- | --- |"]
    for k in KINDS.values():
        link = f"[`{k.name}.schema.json`]({href.format(kind=k.name)})"
        out.append(f"| {k.title} (`layerswap schema {k.name}`) | {link} | `{k.read_by}` |")
    return "\n".join(out) + "\n"
