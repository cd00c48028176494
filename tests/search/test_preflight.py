"""The search preflight: every problem found before Ray starts, each naming its field and value.

Run: .venv/bin/python -m pytest -q tests/search/test_preflight.py
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from search_fixtures import experiment, expert_registry, make_experts

from layerswap.search.pool import resolve_pool
from layerswap.search.preflight import check_search, preflight
from layerswap.spaces.search_experiment import SearchExperiment

ROOT = Path(__file__).resolve().parents[2]
INDEX = '{"weight_map": {"a": "m-1.safetensors"}}'  # names a shard that is not there


@pytest.fixture(scope="module")
def paths(tiny_world, tmp_path_factory) -> dict[str, Path]:
    return make_experts(tiny_world, tmp_path_factory.mktemp("preflight_experts"))


def _only(problems: list[str], *needles: str) -> str:
    """The one problem; assert it contains every needle."""
    assert len(problems) == 1, problems
    for n in needles:
        assert n in problems[0], (n, problems[0])
    return problems[0]


def _with(exp: SearchExperiment, **fields) -> SearchExperiment:
    """`exp` with top-level fields replaced (search_fixtures.experiment takes `world` positionally)."""
    return SearchExperiment.model_validate(exp.model_dump() | fields)


def _adapter(dst: Path) -> Path:
    """A folder that reads as a PEFT LoRA adapter (config and weights file present)."""
    dst.mkdir(parents=True)
    (dst / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    (dst / "adapter_model.safetensors").write_bytes(b"")
    return dst


def test_valid_experiment_gives_no_problems_quickly(tiny_world, paths):
    exp = experiment(tiny_world, paths)
    t0 = time.perf_counter()
    report = preflight(exp)
    took = time.perf_counter() - t0
    print(f"check_search on the tiny world: {took * 1000:.0f} ms")
    assert report.problems == [] and report.unchecked == []
    assert took < 5, took  # measured ~40 ms on 2 CPU cores: json reads and a few YAML writes


def test_valid_registry_experiment_gives_no_problems(tiny_world, paths, tmp_path):
    reg = expert_registry(paths, tmp_path)
    exp = experiment(tiny_world, paths, task_experts=[], language_experts=[], experts={"registry": str(reg), "top_k": 1})  # fmt: skip
    assert check_search(exp) == []
    pool = resolve_pool(exp)
    assert [r.path for r in pool.task] == [str(paths["task"].resolve())]


def test_missing_expert_folder(tiny_world, paths, tmp_path):
    gone = tmp_path / "runs/x/train/m/ckpt"
    exp = experiment(tiny_world, paths, task_experts=[str(paths["task"]), str(gone)])
    _only(check_search(exp), f"task_experts[1] {gone}: no such folder")


@pytest.mark.parametrize(
    "files, says",
    [
        ({"config.json": "{}"}, "no model.safetensors, adapter_model.safetensors or index"),
        ({"pytorch_model.bin": ""}, "only pickled weights (pytorch_model.bin)"),
        ({"model.safetensors.index.json": INDEX}, "missing shard(s) ['m-1.safetensors']"),
    ],
)
def test_expert_folder_without_safetensors(tiny_world, paths, tmp_path, files, says):
    bad = tmp_path / "lang"
    shutil.copytree(paths["language"], bad)
    (bad / "model.safetensors").unlink()
    for name, text in files.items():
        (bad / name).write_text(text)
    exp = experiment(tiny_world, paths, language_experts=[str(bad)])
    problems = check_search(exp)
    assert any(p.startswith(f"language_experts[0] {bad}: ") and says in p for p in problems), (
        problems
    )


def test_registry_missing_or_not_parquet(tiny_world, paths, tmp_path):
    reg = tmp_path / "experts" / "registry.parquet"
    exp = experiment(tiny_world, paths, task_experts=[], language_experts=[], experts={"registry": str(reg)})  # fmt: skip
    _only(check_search(exp), f"experts.registry {reg}: no such file")
    reg.parent.mkdir()
    reg.write_text("expert_id,kind\n")
    _only(check_search(exp), f"experts.registry {reg}: not a readable Parquet file")


def test_a_missing_registry_is_the_only_problem_of_a_hub_base(tiny_world, paths, tmp_path):
    # The shipped real searches before their sweeps ran: the depth is read from a task expert,
    # which the registry would give, so the Hub-id base is no problem; it was also said to be
    # ("the search reads the depth from config.json in a local folder ... a Hub id is not one").
    reg = tmp_path / "experts" / "registry.parquet"
    over = dict(task_experts=[], language_experts=[], experts={"registry": str(reg)})
    exp = experiment(tiny_world, paths, base="Qwen/Qwen2.5-7B-Instruct", **over)
    _only(check_search(exp), f"experts.registry {reg}: no such file")


def test_registry_of_the_wrong_schema(tiny_world, paths, tmp_path):
    reg = tmp_path / "registry.parquet"
    pq.write_table(pa.table({"expert_id": ["e0"], "language": ["en"], "mode": ["full"]}), reg)
    exp = experiment(tiny_world, paths, task_experts=[], language_experts=[], experts={"registry": str(reg)})  # fmt: skip
    want = f"experts.registry {reg}: missing columns ['kind', 'path'] (expected an expert registry"
    _only(check_search(exp), want)
    with pytest.raises(ValueError, match=re.escape(want)):  # no KeyError traceback any more
        resolve_pool(exp)


def test_registry_picks_are_checked(tiny_world, paths, tmp_path):
    gone = tmp_path / "deleted_task_expert"
    reg = expert_registry({**paths, "task": gone}, tmp_path)
    over = dict(task_experts=[], language_experts=[])
    exp = experiment(tiny_world, paths, **over, experts={"registry": str(reg), "top_k": 1})
    problems = check_search(exp)
    assert any(p.startswith(f"experts.registry {reg}: task expert ") and f"{gone}: no such folder" in p for p in problems), problems  # fmt: skip
    exp = experiment(tiny_world, paths, **over, experts={"registry": str(reg), "language": "xq", "task_indicator": "ind__nope"})  # fmt: skip
    problems = check_search(exp)
    assert (
        f"experts.registry {reg}: experts.task_indicator 'ind__nope' is not a column" in problems[0]
    )
    assert f"experts.registry {reg}: no language experts (language='xq')" in problems[1]
    with pytest.raises(ValueError, match="ind__nope"):
        resolve_pool(exp)


def test_a_registry_of_several_bases_is_narrowed_to_the_searchs(tiny_world, paths, tmp_path):
    """One run folder's registry may hold the experts of two models: the pool takes only the
    experts of the search's `base` (any spelling of it), and without a `base` asks for one."""
    from layerswap.experts.registry import append_rows, read_rows

    reg = expert_registry(paths, tmp_path)
    other_model = tmp_path / "qwen_base"
    # The other model's experts score better: top_k=1 would take them if the base were ignored.
    rows = [
        r
        | {"expert_id": f"q{i}", "base": str(other_model), "path": str(tmp_path / f"q{i}")}
        | {k: 0.99 for k in r if k.startswith("ind__")}
        for i, r in enumerate(read_rows(reg))
    ]
    append_rows(reg, rows)
    link = tmp_path / "base_link"
    link.symlink_to(paths["base"].resolve())
    over = dict(task_experts=[], language_experts=[], experts={"registry": str(reg), "top_k": 1})
    for spelling in (str(paths["base"]), str(link)):
        exp = experiment(tiny_world, paths, **over, base=spelling)
        assert check_search(exp) == []
        pool = resolve_pool(exp)
        assert [r.path for r in pool.task] == [str(paths["task"].resolve())]
        assert [r.path for r in pool.language] == [str(paths["language"].resolve())]
    uniform = {"weighting": ["uniform"]}  # magnitude weighting needs `base` on its own
    exp = experiment(tiny_world, paths, **over, base=None, space=uniform)
    _only(check_search(exp), f"experts.registry {reg}: its experts come from 2 bases (", str(other_model), "set `base`")  # fmt: skip
    with pytest.raises(ValueError, match="2 bases"):
        resolve_pool(exp)
    exp = experiment(tiny_world, paths, **over, base=str(tmp_path / "neither"))
    problems = check_search(exp)
    assert any(f"no math experts (language=None) of base {tmp_path / 'neither'} (theirs: " in p for p in problems), problems  # fmt: skip


def test_a_registry_language_in_another_spelling_is_the_same_language(tiny_world, paths, tmp_path):  # fmt: skip
    """An expert trained with `language: sw` is the expert a search for `swh` wants."""
    from layerswap.experts.registry import read_rows
    from layerswap.search.pool import registry_picks

    reg = expert_registry(paths, tmp_path, language="sw")
    exp = experiment(tiny_world, paths, language="swh", task_experts=[], language_experts=[], experts={"registry": str(reg), "language_indicator": "world_belebele_sw_dev"})  # fmt: skip
    picks, problems = registry_picks(exp, read_rows(reg))
    assert problems == [] and [r["language"] for r in picks["language"]] == ["sw"]


def test_base_missing_or_without_config(tiny_world, paths, tmp_path):
    exp = experiment(tiny_world, paths, base=str(tmp_path / "runs/world/base"))
    _only(check_search(exp), f"base {tmp_path / 'runs/world/base'}: no such folder")
    base = tmp_path / "base"
    shutil.copytree(paths["base"], base)
    (base / "config.json").unlink()
    _only(
        check_search(experiment(tiny_world, paths, base=str(base))), f"base {base}: no config.json"
    )


def test_a_generation_config_that_is_not_json_is_named_before_the_search(tiny_world, paths, tmp_path):  # fmt: skip
    """Every trial on it failed with transformers' OSError; a resumed search saw 'unreadable'."""
    base = tmp_path / "base"
    shutil.copytree(paths["base"], base)
    (base / "generation_config.json").write_text("{not json")
    problems = check_search(experiment(tiny_world, paths, base=str(base)))
    _only(problems, f"base: {base / 'generation_config.json'}: not readable JSON")


def test_lora_experts_need_a_base(tiny_world, paths, tmp_path):
    lora = _adapter(tmp_path / "lora_lang")
    space = {"weighting": ["uniform"]}  # magnitude weights need a base anyway
    exp = experiment(tiny_world, paths, base=None, language_experts=[str(lora)], space=space)
    _only(check_search(exp), "base: not given", f"language_experts[0] {lora}")
    exp = experiment(tiny_world, paths, language_experts=[str(lora)], space=space)
    assert check_search(exp) == []


def test_experts_disagree_with_base(tiny_world, paths, tmp_path):
    deep = tmp_path / "task_deep"
    shutil.copytree(paths["task"], deep)
    cfg = json.loads((deep / "config.json").read_text())
    (deep / "config.json").write_text(json.dumps(cfg | {"num_hidden_layers": 2, "hidden_size": 64}))
    exp = experiment(tiny_world, paths, task_experts=[str(deep)])
    _only(
        check_search(exp),
        f"experts disagree with base {paths['base']}",
        "num_hidden_layers 2 vs 4",
        "hidden_size 64 vs 32",
        f"(task_experts[0] {deep})",
    )


def test_experts_that_compute_differently_disagree_with_base(tiny_world, paths, tmp_path):
    # The merge engine's comparison: same shapes, another activation and RoPE base (written
    # the transformers 4 way, which the engine reads as rope_parameters.rope_theta).
    other = tmp_path / "task_gelu"
    shutil.copytree(paths["task"], other)
    cfg = json.loads((other / "config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    (other / "config.json").write_text(json.dumps(cfg | {"hidden_act": "gelu", "rope_theta": 1e6}))
    exp = experiment(tiny_world, paths, task_experts=[str(other)])
    _only(
        check_search(exp),
        f"experts disagree with base {paths['base']}",
        "hidden_act 'gelu' vs 'silu'",
        "rope_parameters.rope_theta 1000000.0 vs 10000.0",
        f"(task_experts[0] {other})",
    )


def test_world_folder_missing(tiny_world, paths, tmp_path):
    exp = _with(experiment(tiny_world, paths), world=str(tmp_path / "no_world"))
    report = preflight(exp)
    _only(report.problems, f"world {tmp_path / 'no_world'}: no such folder")
    assert any("not checked, a task source is missing" in n for n in report.unchecked)


def test_unknown_proxy_and_target_tasks(tiny_world, paths):
    exp = experiment(
        tiny_world,
        paths,
        proxies=[{"task": "world_mgsm_direct_en_dev"}, {"task": "world_mgsm_direct_xq_dev"}],
        target="world_mgsm_direct_xq",
    )
    proxy, target = check_search(exp)
    assert proxy.startswith("proxies[1].task world_mgsm_direct_xq_dev: unknown task (known world tasks: world_belebele_brier_en, ")  # fmt: skip
    assert "world_mgsm_direct_xa_dev" in proxy
    assert target.startswith("target world_mgsm_direct_xq: unknown task")


def test_builtin_tasks_as_proxies_and_target(tiny_world, paths):
    """The papers' setting: built-in Belebele and English MGSM proxies, no world at all."""
    proxies = [{"task": "belebele_swh_Latn", "chance": 0.25}, {"task": "mgsm_direct_en"}]
    exp = experiment(tiny_world, paths, proxies=proxies, target="mgsm_direct_sw")
    report = preflight(_with(exp, world=None))
    assert report.problems == []
    for name in ("belebele_swh_Latn", "mgsm_direct_en", "mgsm_direct_sw"):
        assert any(name in n and "text search" in n for n in report.unchecked), name
    typo = [{"task": "belebele_swh_Latm"}, {"task": "mgsm_direct_en"}]
    exp = experiment(tiny_world, paths, proxies=typo, target="mgsm_direct_sw")
    _only(check_search(_with(exp, world=None)), "proxies[0].task belebele_swh_Latm: unknown task")


def test_proxy_without_a_test_variant(tiny_world, paths, tmp_path):
    world = tmp_path / "world"
    for data in ("belebele", "mgsm"):  # what world tasks are made of
        shutil.copytree(tiny_world / "data" / data, world / "data" / data)
    (world / "data" / "belebele" / "xa" / "test.jsonl").unlink()
    exp = _with(experiment(tiny_world, paths, target="world_belebele_en"), world=str(world))
    _only(
        check_search(exp),
        "proxies[0].task (default) world_belebele_brier_xa_dev: promotion also evaluates its "
        "test variant world_belebele_brier_xa: unknown task",
    )


def test_include_path_tasks(tiny_world, paths, tmp_path):
    inc = tmp_path / "tasks"
    inc.mkdir()
    for name in ("my_nlu_dev", "my_nlu"):
        (inc / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\n")
    proxies = [{"task": "my_nlu_dev"}, {"task": "world_mgsm_direct_en_dev"}]
    exp = experiment(tiny_world, paths, include_path=[str(inc)], proxies=proxies)
    assert check_search(exp) == []
    exp = experiment(tiny_world, paths, include_path=[str(inc), str(tmp_path / "gone")], proxies=proxies)  # fmt: skip
    _only(check_search(exp), f"include_path[1] {tmp_path / 'gone'}: no such folder")
    exp = _with(experiment(tiny_world, paths, proxies=[{"task": "my_nlu_dev"}], target="my_nlu"), world=None)  # fmt: skip
    assert check_search(exp)[0].startswith("proxies[0].task my_nlu_dev: unknown task")


def test_first_task_expert_needs_a_tokenizer_and_a_config(tiny_world, paths, tmp_path):
    bare = tmp_path / "task_bare"
    shutil.copytree(paths["task"], bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink(missing_ok=True)
    _only(check_search(experiment(tiny_world, paths, task_experts=[str(bare)])), f"task_experts[0] {bare}: no tokenizer")  # fmt: skip
    lora = _adapter(tmp_path / "lora_task")
    shutil.copyfile(paths["task"] / "tokenizer.json", lora / "tokenizer.json")
    # an adapter first: the depth comes from the base (a full expert would do too)
    exp = experiment(tiny_world, paths, task_experts=[str(lora), str(paths["task"])])
    assert check_search(exp) == []


def test_three_problems_are_all_reported(tiny_world, paths, tmp_path):
    exp = experiment(
        tiny_world,
        paths,
        base=str(tmp_path / "base_gone"),
        language_experts=[str(tmp_path / "lang_gone")],
        proxies=[{"task": "world_belebele_xq_dev"}],
    )
    problems = check_search(exp)
    assert len(problems) == 3, problems
    assert problems[0] == f"language_experts[0] {tmp_path / 'lang_gone'}: no such folder"
    assert problems[1] == f"base {tmp_path / 'base_gone'}: no such folder"
    assert problems[2].startswith("proxies[0].task world_belebele_xq_dev: unknown task")


def test_experts_of_another_vocabulary_are_refused_before_the_search(tiny_world, paths, tmp_path):
    """The disk merge's tokenizer rule, at the preflight: the live trials do not check it, so
    the search ran to its end and was refused only when writing RUN/best."""
    lang = Path(shutil.copytree(paths["language"], tmp_path / "lang_other_vocab"))
    tj = json.loads((lang / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    tj["model"]["vocab"] = dict(zip(vocab, reversed(list(vocab.values())), strict=True))
    (lang / "tokenizer.json").write_text(json.dumps(tj))
    exp = experiment(tiny_world, paths, language_experts=[str(lang)])
    _only(check_search(exp), "different tokenizers: tokenizer.json", str(lang))


def test_torch_free_mirrors_agree_with_the_engine(paths, tmp_path):
    from layerswap.search import preflight_folders as pf
    from layerswap.trainables.merge import checkpoint

    assert pf.WEIGHT_FILES == checkpoint.WEIGHT_FILES
    assert pf.PICKLE_SUFFIXES == checkpoint.PICKLE_SUFFIXES
    (empty := tmp_path / "empty").mkdir()
    (pickled := tmp_path / "pickled").mkdir()
    (pickled / "model.pt").write_bytes(b"")
    both = Path(shutil.copytree(paths["task"], tmp_path / "both"))
    (both / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model.safetensors"}}')
    for folder in (paths["task"], _adapter(tmp_path / "adapter"), empty, pickled, both):
        try:
            checkpoint.find_weights(folder)
            engine_ok = True
        except checkpoint.CheckpointError:
            engine_ok = False
        assert (pf._weights_problem(folder) is None) == engine_ok, folder


def test_preflight_imports_no_torch_ray_or_lm_eval(tiny_world, paths):
    exp = experiment(tiny_world, paths)
    code = (
        "import sys\n"
        "from layerswap.spaces.search_experiment import SearchExperiment\n"
        "from layerswap.search.preflight import check_search\n"
        "assert check_search(SearchExperiment.model_validate_json(sys.argv[1])) == []\n"
        "print(sorted({'torch', 'ray', 'lm_eval', 'transformers'} & set(sys.modules)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, exp.model_dump_json()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
