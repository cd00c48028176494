"""The config reference is generated from the models and covers them: every field of every
config model has a description, appears in the reference under its dotted name, and a field
added without one is caught.

Run: .venv/bin/python -m pytest -q tests/spaces/test_config_reference.py
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from layerswap.spaces.base import StrictModel
from layerswap.spaces.reference import (
    KINDS,
    config_models,
    config_reference,
    default_text,
    kind_reference,
    models_of,
    type_text,
    undocumented,
)
from layerswap.spaces.search_space import ExpertPool, ExpertRef
from layerswap.spaces.train_experiment import TrainExperiment
from layerswap.spaces.train_settings import Hyper

# Built by the search from its experiment, never read from a file of their own.
NOT_IN_A_FILE = {ExpertPool, ExpertRef}


def test_every_config_field_has_a_description():
    models = config_models()
    assert len(models) >= 40 and TrainExperiment in models
    missing = undocumented(models)
    assert not missing, (
        "config fields without a description; add a docstring line under each field:\n  "
        + "\n  ".join(missing)
    )


def test_a_field_added_without_a_description_is_caught():
    class Sketch(StrictModel):
        documented: int = 0
        """Has one."""
        bare: int = 0
        blank: str = Field("", description="  ")

    assert undocumented([Sketch]) == [
        f"{Sketch.__module__}.{Sketch.__qualname__}.bare",
        f"{Sketch.__module__}.{Sketch.__qualname__}.blank",
    ]


def test_every_model_is_in_some_kind_of_file():
    reached = {m for kind in KINDS for m, _ in models_of(kind)}
    # a base class (the recipes' _RecipeBase) is documented through the models that inherit it
    bases = {m for m in config_models() if any(issubclass(r, m) for r in reached)}
    assert set(config_models()) - reached - bases == NOT_IN_A_FILE


def test_every_field_of_every_model_appears_under_its_dotted_name():
    page = config_reference()
    missing = []
    for kind in KINDS:
        section = kind_reference(kind)
        assert section in page
        for model, paths in models_of(kind):
            for name in model.model_fields:
                dotted = f"{paths[0]}.{name}" if paths[0] else name
                if f"| `{dotted}` |" not in section:
                    missing.append(f"{kind}: {dotted} ({model.__name__})")
    assert not missing, missing
    assert "| `hyper.lr` |" in kind_reference("train")
    assert "| `datasets[].path` |" in kind_reference("train")
    assert "| `sweep.params.<key>.low` |" in kind_reference("train")


def test_dotted_paths_follow_lists_maps_and_unions():
    paths = dict(models_of("train"))
    assert paths[Hyper] == ["hyper"]
    study = {m.__name__: p for m, p in models_of("study")}
    assert study["SweepConfig"] == ["experts[].sweep"]
    assert study["TaskShape"] == ["tasks.<key>"]
    recipe = {m.__name__: p for m, p in models_of("recipe")}
    assert recipe["LayerSwapRecipe"] == [""] and recipe["TiesRecipe"] == [""]
    assert recipe["Zones"] == ["attention", "mlp"]


def test_readable_types():
    linked = {Hyper}
    assert type_text(int, "train", linked) == "int"
    assert type_text(list[str], "train", linked) == "list[str]"
    assert type_text(dict[str, float] | None, "train", linked) == "dict[str, float] | null"
    assert type_text(Literal["a", "b"], "train", linked) == '"a" | "b"'
    assert type_text(Annotated[int, Field(ge=1)] | Literal["auto"], "t", set()) == 'int (≥ 1) | "auto"'  # fmt: skip
    assert type_text(list[Hyper], "train", linked) == "list[[Hyper](#train-hyper)]"
    assert type_text(Hyper, "train", set()) == "Hyper"


def test_defaults_as_a_file_writes_them():
    fields = TrainExperiment.model_fields
    assert default_text(fields["name"]) == "required"
    assert default_text(fields["storage_path"]) == '`"runs/train"`'
    assert default_text(fields["sweep"]) == "`null`"
    assert default_text(fields["scaling"]) == "its fields' defaults"
    assert default_text(Hyper.model_fields["grad_clip"]) == "`1.0`"
    lora = KINDS["train"].schema.model_fields["mode"]
    assert default_text(lora) == "required"


def test_a_pipe_in_a_type_or_description_does_not_split_the_table():
    section = kind_reference("world")
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = line.replace("\\|", "").split("|")
            assert len(cells) == 6, line  # 4 cells between 5 pipes
