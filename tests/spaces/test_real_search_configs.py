"""The shipped real-model merge searches (spaces/examples/real_*_search.yaml): they validate, name
lm-eval built-in tasks that the installed lm-eval indexes (offline: no dataset is built or read),
in the config's language, keep the proxies off the target's test split, ask for GPUs and use the
papers' few-shot counts; each model's layer ranges are the ICLR paper's Llama ranges scaled to its
depth. Run: .venv/bin/python -m pytest -q tests/spaces/test_real_search_configs.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from layerswap import spaces
from layerswap.spaces.search_experiment import SearchExperiment, load_search_experiment
from layerswap.spaces.search_space import SearchSpace, paper_default, warm_start
from layerswap.spaces.sweep import LANG_CODES, indicator_tasks
from layerswap.trainables.train.model_shape import KNOWN_CONFIGS

EXAMPLES = Path(spaces.__file__).parent / "examples"
CONFIGS = sorted(EXAMPLES.glob("real_*_search.yaml"))
# File tag -> (registry language code, Belebele FLORES code, MGSM code).
LANGS = {"sw": ("swh", "swh_Latn", "sw"), "bn": ("ben", "ben_Beng", "bn"), "te": ("tel", "tel_Telu", "te")}  # fmt: skip
# ICLR 2025 Table 5: Belebele 5-shot; Tables 1, 2, 5: MGSM 8-shot (the follow-up's 2-shot is the
# documented alternative).
SHOTS = {"belebele": 5, "mgsm": 8}
# The models the follow-up paper runs, each in all three of its target languages (§3).
MODELS = {m: set(LANGS) for m in ("llama31_8b", "qwen25_7b", "aya_expanse_8b", "falcon3_7b")}
ZONES = ("bottom", "top", "bottom_transition", "top_transition")


@pytest.fixture(scope="module")
def index():
    """lm-eval's task index over its installed YAMLs (tests/conftest.py keeps HF offline)."""
    from lm_eval.tasks import TaskManager

    return TaskManager().task_index


def _parts(path: Path) -> tuple[str, str]:
    """(model, language file tag) of real_{model}_{tag}_search.yaml."""
    model, tag = re.fullmatch(r"real_(\w+)_(\w+?)_search", path.stem).groups()
    return model, tag


def _tag(path: Path) -> str:
    return _parts(path)[1]


def _depth(exp: SearchExperiment) -> int:
    """The base's layer count, from load_model_config's built-in copy (no download)."""
    return KNOWN_CONFIGS[exp.base]["num_hidden_layers"]


def _split(cfg: dict, split: str) -> tuple:
    return (cfg["dataset_path"], cfg.get("dataset_name"), split)


def _fewshot(cfg: dict) -> tuple:
    """(dataset, subset, split) lm-eval draws a task's few-shot examples from."""
    split = cfg.get("fewshot_split") or cfg.get("training_split") or cfg.get("validation_split")
    return _split(cfg, split or cfg["test_split"])


def problems(exp: SearchExperiment, tag: str, index) -> list[str]:
    """Everything wrong with a real search config for language file tag `tag`."""
    out = []
    code, bele, mgsm = LANGS[tag]
    if exp.language != code:
        out.append(f"language {exp.language}, expected {code} (the expert configs' code)")
    names = [("target", exp.target_task)] + [(f"proxy {p.task}", p.task) for p in exp.proxy_list]
    for what, name in names:
        entry = index.get(name)
        if entry is None:
            out.append(f"{what}: {name} is not an lm-eval built-in task")
        elif entry.kind.name != "TASK":
            out.append(f"{what}: {name} is a {entry.kind.name}, not one task")
    if out:
        return out
    cfg = {name: index[name].cfg for _, name in names}
    target = cfg[exp.target_task]
    if (target["dataset_path"], target["dataset_name"]) != ("juletxara/mgsm", mgsm):
        out.append(f"target {exp.target_task}: not MGSM in {mgsm}")
    test = _split(target, target["test_split"])
    if exp.promote.num_fewshot and _fewshot(target) == test:
        out.append(f"target {exp.target_task}: few-shot examples come from its test split")
    kinds = {}
    for p in exp.proxy_list:
        if test in {_split(cfg[p.task], cfg[p.task]["test_split"]), _fewshot(cfg[p.task])}:
            out.append(f"proxy {p.task} reads the target's test split {test}")
        path, name = cfg[p.task]["dataset_path"], cfg[p.task].get("dataset_name")
        if path == "facebook/belebele":
            kinds["belebele"] = p
            if name != bele or p.chance != 0.25:
                out.append(f"proxy {p.task}: Belebele {name} chance {p.chance}, want {bele} 0.25")
        elif (path, name) == ("juletxara/mgsm", "en"):
            kinds["mgsm"] = p
        else:
            out.append(f"proxy {p.task}: neither target Belebele nor English MGSM")
    for kind, shots in SHOTS.items():
        if kind not in kinds:
            out.append(f"no {kind} proxy")
        elif kinds[kind].num_fewshot != shots:
            out.append(f"proxy {kinds[kind].task}: {kinds[kind].num_fewshot}-shot, want {shots}")
    if exp.promote.num_fewshot != SHOTS["mgsm"]:
        out.append(f"promote.num_fewshot {exp.promote.num_fewshot}, want {SHOTS['mgsm']}")
    # The registry's indicator columns are what real expert sweeps score (spaces/sweep.py).
    src = exp.experts
    if src is None or src.task_indicator != indicator_tasks("math", "en", world=False)[0]:
        out.append("experts.task_indicator: not the math sweeps' indicator")
    if src is None or src.language_indicator != indicator_tasks("language", code, world=False)[0]:
        out.append("experts.language_indicator: not the language sweeps' indicator")
    if src is not None and "belebele" in kinds and src.language_indicator != kinds["belebele"].task:
        out.append("experts.language_indicator is not the Belebele proxy")
    if not exp.search.gpus_per_trial > 0:
        out.append(f"search.gpus_per_trial {exp.search.gpus_per_trial}: an 8B model needs a GPU")
    if exp.promote.device == "cpu":
        out.append("promote.device cpu")
    return out


def test_every_language_ships():
    shipped: dict[str, set] = {}
    for p in CONFIGS:
        model, tag = _parts(p)
        shipped.setdefault(model, set()).add(tag)
    assert shipped == MODELS and MODELS["llama31_8b"] == set(LANGS)


def _id(path: Path) -> str:
    return path.stem.removeprefix("real_").removesuffix("_search")


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_config_validates_and_matches_the_papers(path, index):
    exp = load_search_experiment(path)
    assert problems(exp, _tag(path), index) == []
    assert LANG_CODES[exp.language][0] == LANGS[_tag(path)][1]


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_space_is_the_iclr_ranges_scaled_to_depth(path):
    """The ICLR ranges (32-layer Llama 3.1: b 3..5, u, t_b, t_u 0..2) times depth / 32, rounded
    as fraction spans round (SearchSpace's defaults are exactly those fractions)."""
    exp = load_search_experiment(path)
    space, depth = exp.space, _depth(exp)
    got = {n: getattr(space, n).resolve(depth) for n in ZONES}
    assert got == {n: getattr(SearchSpace(), n).resolve(depth) for n in ZONES}
    if depth == 32:
        assert got == {"bottom": (3, 5), "top": (0, 2), "bottom_transition": (0, 2), "top_transition": (0, 2)}  # fmt: skip
    # Written in layers (what the search runs), and the comment says how they were scaled.
    assert all(getattr(space, n).unit == "layers" for n in ZONES)
    if depth != 32:
        prose = re.sub(r"\n#\s*", " ", path.read_text())  # comment lines joined
        assert f"scaled to this model's {depth} layers, x {depth}/32" in prose
    assert set(space.weighting) == {"uniform", "magnitude"} and space.non_layer == ["average"]
    # The warm start is the ICLR default (b=5, u=2, no transitions) scaled to depth.
    start = warm_start(space, depth)
    pd = paper_default(depth)
    assert (start["bottom"], start["top"], start["bottom_transition"], start["top_transition"]) == (pd.bottom, pd.top, 0, 0)  # fmt: skip
    assert (pd.bottom, pd.top) == (int(5 * depth / 32 + 0.5), int(2 * depth / 32 + 0.5))


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_fewshot_counts_are_documented(path):
    """Each `num_fewshot: N` line says `N-shot` and its source; the other paper's 2-shot is named."""
    lines = [ln for ln in path.read_text().splitlines() if re.match(r"\s*num_fewshot:", ln)]
    assert len(lines) == 3  # two proxies and the target
    for ln in lines:
        n = int(re.search(r"num_fewshot:\s*(\d+)", ln).group(1))
        assert f"{n}-shot" in ln and "ICLR 2025 Table" in ln, ln
        if n == SHOTS["mgsm"]:
            assert "follow-up §3.1: 2-shot" in ln, ln


def _mutate(data: dict, edit: str) -> dict:
    data = yaml.safe_load(yaml.safe_dump(data))
    if edit == "misspelled proxy":
        data["proxies"][0]["task"] = "belebele_swh_latn"
    elif edit == "misspelled target":
        data["target"] = "mgsm_direct_swh"
    elif edit == "group, not task":
        data["proxies"][0]["task"] = "belebele"
    elif edit == "other language":
        data["proxies"][0]["task"] = data["experts"]["language_indicator"] = "belebele_ben_Beng"
    elif edit == "proxy on target test":
        data["proxies"][1]["task"] = "mgsm_native_cot_sw"
    elif edit == "no gpu":
        data["search"]["gpus_per_trial"] = 0
    elif edit == "shots":
        data["proxies"][1]["num_fewshot"] = 2
    elif edit == "target shots":
        data["promote"]["num_fewshot"] = None
    elif edit == "indicator":
        # not the target (refused on load: tests/spaces/test_dev_only_rule.py), a wrong column
        data["experts"]["task_indicator"] = "belebele_swh_Latn"
    return data


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ("misspelled proxy", "belebele_swh_latn is not an lm-eval built-in task"),
        ("misspelled target", "mgsm_direct_swh is not an lm-eval built-in task"),
        ("group, not task", "belebele is a GROUP"),
        ("other language", "want swh_Latn"),
        ("proxy on target test", "mgsm_native_cot_sw reads the target's test split"),
        ("no gpu", "gpus_per_trial 0.0"),
        ("shots", "2-shot, want 8"),
        ("target shots", "promote.num_fewshot None"),
        ("indicator", "experts.task_indicator"),
    ],
)
def test_the_checks_catch_a_broken_config(edit, says, index, tmp_path):
    data = yaml.safe_load((EXAMPLES / "real_llama31_8b_sw_search.yaml").read_text())
    path = tmp_path / "real_llama31_8b_sw_search.yaml"
    path.write_text(yaml.safe_dump(_mutate(data, edit)))
    found = problems(load_search_experiment(path), "sw", index)
    assert any(says in p for p in found), found
