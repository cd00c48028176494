"""mergekit export: mergekit 0.1.5 run on `to_mergekit(recipe)` must build the recipe's model.

The expectation is computed here from the two checkpoints and the zone table of docs/method.md,
independently of spaces.zones and the merge engine. `run_mergekit` is reusable by other tests.
"""

from __future__ import annotations

import os

# No network: huggingface_hub reads this when first imported, so set it before transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import re
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file

from layerswap.spaces.recipe import LayerSwapRecipe, RecipeError
from layerswap.trainables.merge.mergekit_export import mergekit_yaml, to_mergekit

pytest.importorskip("mergekit")  # an optional test dependency (pyproject [test])

NUM_LAYERS = 8
LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def run_mergekit(config: dict, out_dir: Path) -> None:
    """Run a mergekit config through mergekit's public Python API on CPU.

    Args:
        config: a mergekit config dict, e.g. from `to_mergekit`.
        out_dir: where mergekit writes the merged checkpoint (safetensors + config.json).
    """
    from mergekit.config import MergeConfiguration
    from mergekit.io.tasks import LoaderCache
    from mergekit.merge import MergeOptions, run_merge

    # mergekit keeps one process-wide loader (with the file's tensor index) per model path; drop
    # them so a checkpoint rewritten at the same path is read afresh.
    LoaderCache().loaders.clear()
    options = MergeOptions(
        device="cpu", copy_tokenizer=False, write_model_card=False, quiet=True, num_threads=1
    )
    run_merge(MergeConfiguration.model_validate(config), str(out_dir), options=options)
    LoaderCache().loaders.clear()


def _state(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def experts(tmp_path_factory) -> tuple[Path, Path]:
    """(task, language): one tiny random Llama base perturbed with two different noises."""
    root = tmp_path_factory.mktemp("experts")
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(cfg).to(torch.float32).state_dict()
    paths = []
    for k, name in enumerate(("task", "language")):
        gen = torch.Generator().manual_seed(100 + k)
        model = transformers.LlamaForCausalLM(cfg).to(torch.float32)
        noisy = {n: t + 0.01 * torch.randn(t.shape, generator=gen) for n, t in base.items()}
        model.load_state_dict(noisy)
        model.save_pretrained(root / name)
        paths.append(root / name)
    return paths[0], paths[1]


def _expected_source(layer: int, r: dict) -> str:
    """Zone table of docs/method.md, written out independently of spaces.zones."""
    b, u, tb, tu, n = r["bottom"], r["top"], r["bottom_transition"], r["top_transition"], NUM_LAYERS
    if layer < b:
        return "language"
    if layer < b + tb:
        return "transition"
    if layer < n - u - tu:
        return "task"
    if layer < n - u:
        return "transition"
    return "language"


def _expected(task: dict, lang: dict, r: dict) -> dict[str, tuple[torch.Tensor, bool]]:
    """{name: (expected tensor, is it a whole expert tensor)} for recipe fields `r`."""
    wt, wl = r["transition_weights"]["task"], r["transition_weights"]["language"]
    out = {}
    for name, t in task.items():
        m = LAYER.match(name)
        source = _expected_source(int(m.group(1)), r) if m else r["non_layer"]
        if source in ("transition", "average"):
            avg = (wt * t.double() + wl * lang[name].double()) / (wt + wl)
            out[name] = (avg.to(t.dtype), False)
        else:
            out[name] = ((t if source == "task" else lang[name]), True)
    return out


CASES = {
    "paper_uniform_avg": dict(
        bottom=2,
        top=1,
        bottom_transition=1,
        top_transition=1,
        transition_weights={"task": 1.0, "language": 1.0},
        non_layer="average",
    ),
    "unequal_language_nonlayer": dict(
        bottom=2,
        top=1,
        bottom_transition=1,
        top_transition=1,
        transition_weights={"task": 0.7, "language": 0.3},
        non_layer="language",
    ),
    # No language layers at the bottom and a 2-layer transition: the first slice is a transition,
    # and the task expert supplies the non-layer tensors.
    "bottom0_task_nonlayer": dict(
        bottom=0,
        top=2,
        bottom_transition=2,
        top_transition=0,
        transition_weights={"task": 0.7, "language": 0.3},
        non_layer="task",
    ),
    "unequal_avg": dict(
        bottom=1,
        top=0,
        bottom_transition=0,
        top_transition=2,
        transition_weights={"task": 0.7, "language": 0.3},
        non_layer="average",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mergekit_builds_the_recipe_model(case, experts, tmp_path):
    task_dir, lang_dir = experts
    fields = CASES[case]
    recipe = LayerSwapRecipe(
        method="layer_swap", task_expert=str(task_dir), language_expert=str(lang_dir), **fields
    )
    config = to_mergekit(recipe, NUM_LAYERS)
    assert config["dtype"] == "float32"  # read from the experts' config.json
    # The YAML text is the same config.
    assert yaml.safe_load(mergekit_yaml(recipe, NUM_LAYERS)) == config

    out = tmp_path / "merged"
    run_mergekit(config, out)

    task, lang = _state(task_dir), _state(lang_dir)
    merged = _state(out)
    assert sorted(merged) == sorted(task)
    expected = _expected(task, lang, fields)
    for name, (want, whole) in expected.items():
        got = merged[name]
        assert got.dtype == want.dtype, name
        if whole:
            assert torch.equal(got, want), name
        else:
            assert torch.allclose(got, want, rtol=0, atol=1e-6), name
            # ... and it is not just one of the experts.
            assert not torch.equal(got, task[name]) and not torch.equal(got, lang[name]), name
    assert transformers.AutoConfig.from_pretrained(out).num_hidden_layers == NUM_LAYERS


@pytest.mark.parametrize("case", list(CASES))
def test_engine_equals_mergekit(case, experts, tmp_path):
    """layerswap's own streaming engine and mergekit build the same model from one recipe."""
    from layerswap.trainables.merge.engine import merge_to_disk

    task_dir, lang_dir = experts
    recipe = LayerSwapRecipe(
        method="layer_swap", task_expert=str(task_dir), language_expert=str(lang_dir), **CASES[case]
    )
    run_mergekit(to_mergekit(recipe, NUM_LAYERS), tmp_path / "mergekit")
    merge_to_disk(recipe, tmp_path / "ours")
    theirs, ours = _state(tmp_path / "mergekit"), _state(tmp_path / "ours")
    task, lang = _state(task_dir), _state(lang_dir)
    assert sorted(ours) == sorted(theirs)
    averaged = 0
    for name, t in theirs.items():
        if torch.equal(ours[name], task[name]) or torch.equal(ours[name], lang[name]):
            assert torch.equal(ours[name], t), name  # whole tensors: bit-identical
        else:
            averaged += 1
            # Both average in float32; the weight order of operations differs by <= 1 ulp.
            assert torch.allclose(ours[name], t, rtol=0, atol=1e-6), name
    assert averaged > 0


def _recipe(**over) -> LayerSwapRecipe:
    fields = dict(
        method="layer_swap", task_expert="/m/task", language_expert="/m/lang", bottom=2, top=1
    )
    fields.update(over)
    return LayerSwapRecipe.model_validate(fields)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"task_expert": {"soup": ["/m/a", "/m/b"]}}, "task_expert is a soup"),
        ({"language_expert": {"soup": ["/m/a"]}}, "language_expert is a soup"),
        ({"attention": "language"}, "attention"),
        ({"mlp": {"bottom": 1, "top": 1}}, "mlp"),
        ({"partition": "A", "bottom": 6, "top": 2}, "attention"),
        ({"base": "/m/base", "revert": [{"layers": [0]}]}, "revert"),
        ({"base": "/m/base", "transition_weights": "magnitude"}, "magnitude"),
        ({"language_expert": "/m/task"}, "same checkpoint"),
        ({"bottom": 6, "top": 3}, "exceeds"),
    ],
)
def test_unsupported_recipes_are_rejected(over, match):
    with pytest.raises(RecipeError, match=match):
        to_mergekit(_recipe(**over), NUM_LAYERS)


def test_magnitude_weights_with_numbers():
    mavs = {"/m/task": 0.02, "/m/lang": 0.05}
    recipe = _recipe(base="/m/base", transition_weights="magnitude", bottom_transition=1)
    config = to_mergekit(recipe, NUM_LAYERS, mav=lambda terms: mavs[terms[0][0]], dtype="bfloat16")
    transition = config["slices"][1]["sources"]
    assert [s["layer_range"] for s in transition] == [[2, 3], [2, 3]]
    assert [s["parameters"]["weight"] for s in transition] == [pytest.approx(50.0), 20.0]
    assert config["dtype"] == "bfloat16"


def test_config_shape_and_model_refs():
    """Layer filter only in the edge slices; odd paths use mergekit's literal mapping form."""
    recipe = _recipe(language_expert="/m/lang@v2+x", bottom_transition=1, top_transition=1)
    config = to_mergekit(recipe, NUM_LAYERS)
    ranges = [s["sources"][0]["layer_range"] for s in config["slices"]]
    assert ranges == [[0, 2], [2, 3], [3, 6], [6, 7], [7, 8]]
    assert [len(s["sources"]) for s in config["slices"]] == [2, 2, 1, 2, 2]
    first_task = config["slices"][0]["sources"][0]["parameters"]["weight"]
    assert first_task == [{"filter": "layers.", "value": 0.0}, {"value": 1.0}]
    assert config["slices"][0]["sources"][1]["model"] == {"model": {"path": "/m/lang@v2+x"}}
    assert "dtype" not in config  # no config.json to read it from
