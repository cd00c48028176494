"""Bad input to every command is refused cleanly: exit status 2, no traceback, a message naming
the offending file, field or value, and nothing written: every input and every folder that
existed before is hashed before and after, and no temporary sibling is left behind.

A case is a function that lays out what it needs under its own folder (the working directory
while it runs) and returns the command line and the substrings stderr must contain. Cases run
in-process through `cli.main`; `test_real_processes` runs one per heavy command as
`python -m layerswap.cli`. Nothing here may train, evaluate, merge or start Ray: tripwires fail any case
that gets that far.

Run: .venv/bin/python -m pytest -q tests/cli/test_bad_input.py   (about 60 s on 2 CPU cores,
half of it the subprocesses' imports)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from layerswap.cli import SUBCOMMANDS, main
from layerswap.trainables.outputs import write_marker

ROOT = Path(__file__).resolve().parents[2]
Case = Callable[["Env"], tuple[list[str], list[str]]]
CASES: list = []


def case(*marks) -> Callable[[Case], Case]:
    """Register a case; its name is COMMAND__what_the_user_did."""

    def add(fn: Case) -> Case:
        CASES.append(pytest.param(fn, id=fn.__name__, marks=marks))
        return fn

    return add


def case_list() -> tuple[list, Callable[[Case], Case]]:
    """A battery file's own case list and the decorator that registers into it (by name, as
    `case` does here), for the files that parametrize their own test over it."""
    cases: list = []

    def add(fn: Case) -> Case:
        cases.append(pytest.param(fn, id=fn.__name__))
        return fn

    return cases, add


@dataclass
class Env:
    """One case's folder and the session's shared inputs (which no case may change)."""

    tmp: Path
    world: Path
    family: dict[str, Path]
    experts: dict[str, Path]
    run: Path
    merged: Path

    def at(self, rel: str) -> str:
        return str(self.tmp / rel)

    def file(self, rel: str, content: str | bytes) -> str:
        p = self.tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
        return str(p)

    def yaml(self, rel: str, data: object) -> str:
        return self.file(rel, yaml.safe_dump(data, sort_keys=False))

    def folder(self, rel: str, kind: str | None = None) -> str:
        """A folder of the user's own (a notes file), or with `kind` a layerswap output of it."""
        p = self.tmp / rel
        p.mkdir(parents=True, exist_ok=True)
        (p / "notes.txt").write_text("my notes\n")
        if kind is not None:
            write_marker(p, kind, "an earlier run")
        return str(p)

    def copy(self, src: Path, rel: str) -> str:
        """A private copy, for cases that aim an output at an input (a bug would destroy it)."""
        shutil.copytree(src, self.tmp / rel)
        return str(self.tmp / rel)

    def read_only_parent(self) -> str:
        """A folder this process cannot create files in (root ignores modes: a read-only fs)."""
        p = self.tmp / "read_only"
        p.mkdir()
        p.chmod(0o555)
        if not os.access(p, os.W_OK):
            return str(p)
        if not os.access("/proc/sys", os.W_OK):
            return "/proc/sys"
        pytest.skip("no folder here refuses writes to this user")

    # ---- valid inputs to spoil

    def recipe(self, rel: str = "recipe.yaml", **over) -> str:
        data = {
            "method": "layer_swap",
            "task_expert": str(self.family["task"]),
            "language_expert": str(self.family["language"]),
            "bottom": 2,
            "top": 2,
            "bottom_transition": 1,
        }
        return self.yaml(rel, data | over)

    def train_data(self, **over) -> dict:
        data = {
            "name": "t",
            "base": str(self.world / "base"),
            "kind": "math",
            "language": "en",
            "datasets": [{"path": str(self.world / "data/sft/math_en.jsonl")}],
            "mode": "full",
            "hyper": {"lr": 3e-3, "batch_size": 8, "max_steps": 2, "seq_len": 96, "seed": 0},
        }
        return data | over

    def train_exp(self, rel: str = "exp.yaml", **over) -> str:
        return self.yaml(rel, self.train_data(**over))

    def train_run(self, out: str, exp_file: str, step: int | None = None) -> str:
        """RUN/train/t as `layerswap train` leaves it once started on `exp_file` (no checkpoint),
        or once it saved a checkpoint at `step` (its manifest only)."""
        from layerswap.spaces.train_experiment import (
            absolute_local_paths,
            experiment_identity,
            experiment_json,
            load_train_experiment,
        )
        from layerswap.trainables.train.state import MANIFEST

        run = self.tmp / out / "train" / "t"
        run.mkdir(parents=True)
        exp = absolute_local_paths(load_train_experiment(exp_file))
        write_marker(run, "train", experiment_identity(exp))
        if step is not None:
            ck = run / "checkpoints" / f"samples_{step * exp.hyper.batch_size:09d}"
            ck.mkdir(parents=True)
            manifest = {"step": step, "experiment": experiment_json(exp)}
            (ck / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        return str(run)

    def search_data(self, **over) -> dict:
        from tests.search.search_fixtures import experiment

        return experiment(self.world, self.experts).model_dump(mode="json") | over

    def search_exp(self, rel: str = "search.yaml", **over) -> str:
        return self.yaml(rel, self.search_data(**over))

    def earlier_search(self, out: str, data: dict) -> str:
        """RUN/search as a search of `data` leaves it once started: marker, experiment, study."""
        from layerswap.search.search_dir import search_identity
        from layerswap.spaces.search_experiment import SearchExperiment

        sdir = self.tmp / out / "search"
        sdir.mkdir(parents=True)
        exp = SearchExperiment.model_validate(data)
        write_marker(sdir, "search", search_identity(exp))
        (sdir / "experiment.json").write_text(exp.model_dump_json(indent=1))
        (sdir / "study.db").write_bytes(b"")  # its existence is what marks a started search
        return str(sdir)

    def corrupt_world(self, rel: str = "world") -> tuple[str, str]:
        """A copy of the world with one dev split edited after the build; (world, file)."""
        w = self.copy(self.world, rel)
        with open(Path(w) / "data/mgsm/xa/dev.jsonl", "a", encoding="utf-8") as f:
            f.write('{"question": "1+1?", "answer_number": 2}\n')
        return w, "data/mgsm/xa/dev.jsonl"


NOT_OURS = "was not written by layerswap"
ABSENT_FLAG = "pass --overwrite"

# ---------------------------------------------------------------------------------------- merge


@case()
def merge__out_is_an_input_expert(e: Env):
    task = e.copy(e.family["task"], "task")
    r = e.recipe(task_expert=task)
    return ["merge", r, "--out", task, "--overwrite", "-q"], [f"{task}: is the input {task}"]


@case()
def merge__out_contains_the_inputs(e: Env):
    task, lang = e.copy(e.family["task"], "models/task"), e.copy(e.family["language"], "models/lang")  # fmt: skip
    r = e.recipe(task_expert=task, language_expert=lang)
    out = e.at("models")
    return ["merge", r, "--out", out, "--overwrite", "-q"], [f"{out}: contains the input {task}"]


@case()
def merge__out_inside_an_input(e: Env):
    task = e.copy(e.family["task"], "task")
    out = f"{task}/merged"
    return ["merge", e.recipe(task_expert=task), "--out", out, "--overwrite", "-q"], [f"{out}: is inside the input {task}"]  # fmt: skip


@case()
def merge__out_is_a_world_overwrite(e: Env):
    w = e.copy(e.world, "world")
    return ["merge", e.recipe(), "--out", w, "--overwrite", "-q"], [f"{w}: holds an embedded world", "not a merged model"]  # fmt: skip


@case()
def merge__out_is_a_foreign_folder_overwrite(e: Env):
    out = e.folder("mine")
    return ["merge", e.recipe(), "--out", out, "--overwrite", "-q"], [f"{out}: exists and {NOT_OURS}"]  # fmt: skip


@case()
def merge__out_is_an_analysis_report_overwrite(e: Env):
    out = e.folder("report", kind="analysis")
    return ["merge", e.recipe(), "--out", out, "--overwrite", "-q"], [f"{out}: holds an analysis report"]  # fmt: skip


@case()
def merge__out_exists_without_overwrite(e: Env):
    out = e.copy(e.merged, "merged")
    return ["merge", e.recipe(), "--out", out, "-q"], [f"{out}: already exists; {ABSENT_FLAG}"]


@case()
def merge__refused_out_leaves_no_export(e: Env):
    out = e.copy(e.merged, "merged")
    argv = ["merge", e.recipe(), "--out", out, "--export-mergekit", e.at("mk.yaml"), "-q"]
    return argv, [f"{out}: already exists"]  # and mk.yaml is not written (the tree check)


@case()
def merge__export_onto_an_input_file(e: Env):
    task = e.copy(e.family["task"], "task")
    cfg = f"{task}/config.json"
    argv = ["merge", e.recipe(task_expert=task), "--export-mergekit", cfg, "--overwrite"]
    return argv, [f"{cfg}: is inside the input {task}"]


@case()
def merge__export_onto_the_recipe(e: Env):
    r = e.recipe()
    return ["merge", r, "--export-mergekit", r, "--overwrite"], [f"{r}: is the input {r}"]


@case()
def merge__export_onto_a_foreign_file_overwrite(e: Env):
    notes = e.file("notes.yaml", "todo: read the paper\n")
    argv = ["merge", e.recipe(), "--export-mergekit", notes, "--overwrite"]
    return argv, [f"{notes}: is not a mergekit config"]


@case()
def merge__recipe_missing(e: Env):
    r = e.at("recipe.yml")
    return ["merge", r, "--out", e.at("m")], [f"{r}: cannot read recipe"]


@case()
def merge__recipe_yaml_syntax_error(e: Env):
    r = e.file("recipe.yaml", "method: layer_swap\nbottom: 1\n  top: 2\n")
    return ["merge", r, "--out", e.at("m")], [f"{r}:3:", "not valid YAML"]


@case()
def merge__recipe_not_utf8(e: Env):
    r = e.file("recipe.yaml", "method: layer_swap\n# réglé\n".encode("latin-1"))
    return ["merge", r, "--out", e.at("m")], [f"{r}: not UTF-8", "0xe9"]


@case()
def merge__recipe_unknown_field(e: Env):
    r = e.recipe(bottm=2)
    return ["merge", r, "--out", e.at("m")], [f"{r}: invalid recipe", "bottm: Extra inputs"]


@case()
def merge__recipe_negative_bottom(e: Env):
    r = e.recipe(bottom=-1)
    return ["merge", r, "--out", e.at("m")], [f"{r}: invalid recipe", "bottom: Input should be greater than or equal to 0"]  # fmt: skip


@case()
def merge__recipe_unknown_method(e: Env):
    r = e.recipe(method="soupp")
    return ["merge", r, "--out", e.at("m")], [f"{r}: invalid recipe", "'soupp'", "'method'"]


@case()
def merge__recipe_zones_exceed_the_depth(e: Env):
    r = e.recipe(bottom=6, top=6)
    return ["merge", r, "--out", e.at("m")], ["bottom (6)", "top (6)", "exceeds the model's 12 layers"]  # fmt: skip


@case()
def merge__recipe_expert_missing(e: Env):
    gone = e.at("experts/task")
    r = e.recipe(task_expert=gone)
    return ["merge", r, "--out", e.at("m")], [f"{gone}: checkpoint folder not found"]


@case()
def merge__recipe_relative_expert_missing(e: Env):
    """Looked for beside the recipe, then in the working folder: the message says both."""
    r = e.recipe(task_expert="nothere")
    return ["merge", r, "--out", e.at("m")], ["nothere: checkpoint folder not found", "nor beside the config file that names it"]  # fmt: skip


@case()
def merge__recipe_expert_path_typo_taken_for_a_hub_id(e: Env):
    # `fam6/nope` looks like a Hub id; offline (tests), huggingface_hub's three lines of advice
    # used to be the whole message, and the folder looked for was never named.
    r = e.recipe(task_expert="fam6/nope")
    return ["merge", r, "--out", e.at("m")], [f"fam6/nope: no checkpoint folder at {e.at('fam6/nope')}, and not downloadable"]  # fmt: skip


def _edited_copy(e: Env, role: str, **config) -> str:
    """A copy of the family's `role` expert whose config.json has `config` over it."""
    dst = Path(e.copy(e.family[role], role))
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(cfg | config))
    return str(dst)


@case()
def merge__experts_of_different_activations(e: Env):
    lang = _edited_copy(e, "language", hidden_act="gelu")
    r = e.recipe(language_expert=lang)
    return ["merge", r, "--out", e.at("m")], ["config.json field 'hidden_act' is 'silu' in", "but 'gelu' in", lang]  # fmt: skip


def _fake_adapter(e: Env, rel: str) -> str:
    """A folder that is a LoRA adapter by its adapter_config.json (its weights are never read)."""
    return e.file(f"{rel}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": 2}))[: -len("/adapter_config.json")]  # fmt: skip


@case()
def merge__full_task_expert_with_an_adapter_language_expert(e: Env):
    lang = _fake_adapter(e, "lora_lang")
    r = e.recipe(language_expert=lang)
    return ["merge", r, "--out", e.at("m")], [f"task_expert is a full checkpoint but language_expert is a LoRA adapter ({lang}); both must be one kind"]  # fmt: skip


@case()
def merge__adapter_task_expert_with_a_full_language_expert(e: Env):
    task = _fake_adapter(e, "lora_task")
    r = e.recipe(task_expert=task)
    return ["merge", r, "--out", e.at("m")], [f"language_expert is a full checkpoint but task_expert is a LoRA adapter ({task}); both must be one kind"]  # fmt: skip


@case()
def merge__soup_over_lora_adapters(e: Env):
    # soups and TIES of adapters are built in memory by the search only: refused in one line
    task, lang = _fake_adapter(e, "lora_task"), _fake_adapter(e, "lora_lang")
    r = e.yaml(
        "soup.yaml", {"method": "soup", "models": [task, lang], "base": str(e.family["base"])}
    )
    return ["merge", r, "--out", e.at("m")], [f"soup over LoRA adapters ({task}) is not supported by `layerswap merge`", "merge_and_unload()"]  # fmt: skip


@case()
def merge__fold_of_ties_over_lora_adapters(e: Env):
    task, lang = _fake_adapter(e, "lora_task"), _fake_adapter(e, "lora_lang")
    r = e.yaml(
        "ties.yaml", {"method": "ties", "models": [task, lang], "base": str(e.family["base"])}
    )
    return ["merge", r, "--out", e.at("m"), "--fold"], [f"ties over LoRA adapters ({task}) is not supported"]  # fmt: skip


@case()
def merge__recipe_not_a_mapping(e: Env):
    r = e.file("recipe.yaml", "- layer_swap\n- bottom: 2\n")
    return ["merge", r, "--out", e.at("m")], [f"{r}: expected a mapping with a `method` key"]


@case()
def merge__fold_on_full_experts(e: Env):
    return ["merge", e.recipe(), "--out", e.at("m"), "--fold", "-q"], ["--fold applies to LoRA"]


@case()
def merge__bad_shard_size(e: Env):
    return ["merge", e.recipe(), "--out", e.at("m"), "--max-shard-size", "lots"], ["--max-shard-size", "invalid size 'lots'"]  # fmt: skip


@case()
def merge__nothing_to_do(e: Env):
    return ["merge", e.recipe()], ["nothing to do: give --out DIR and/or --export-mergekit FILE"]


# ---------------------------------------------------------------------------------- world build


@case()
def world__out_is_a_foreign_folder_overwrite(e: Env):
    out = e.folder("mine")
    argv = ["world", "build", "--out", out, "--size", "tiny", "--overwrite"]
    return argv, [f"{out}: exists and {NOT_OURS}"]


@case()
def world__out_is_a_merged_model_overwrite(e: Env):
    out = e.copy(e.merged, "merged")
    argv = ["world", "build", "--out", out, "--size", "tiny", "--overwrite"]
    return argv, [f"{out}: holds a merged model", "not an embedded world"]


@case()
def world__out_exists_without_overwrite(e: Env):
    out = e.folder("mine")
    return ["world", "build", "--out", out, "--size", "tiny"], [f"{out}: already exists; {ABSENT_FLAG}"]  # fmt: skip


@case()
def world__out_is_a_file(e: Env):
    out = e.file("world", "not a folder\n")
    return ["world", "build", "--out", out, "--size", "tiny"], [f"{out}: exists and is not a folder"]  # fmt: skip


@case()
def world__out_under_a_file(e: Env):
    f = e.file("notes.txt", "x\n")
    out = f"{f}/world"
    return ["world", "build", "--out", out, "--size", "tiny"], [f"{out}: cannot be created, {f} is not a folder"]  # fmt: skip


@case()
def world__config_unknown_field(e: Env):
    cfg = e.file("variant.yaml", "model:\n  stepz: 2000\n")
    argv = ["world", "build", "--out", e.at("w"), "--size", "tiny", "--config", cfg]
    return argv, [f"{cfg}: invalid world config", "model.stepz: Extra inputs are not permitted"]


@case()
def world__config_sets_the_seed(e: Env):
    cfg = e.file("variant.yaml", "seed: 3\ndigit_words: true\n")
    argv = ["world", "build", "--out", e.at("w"), "--size", "tiny", "--config", cfg]
    return argv, [f"{cfg}: seed cannot be overridden (use --seed/--size)"]


@case()
def world__corrupted_world(e: Env):
    w, bad = e.corrupt_world()
    argv = ["world", "build", "--out", w, "--size", "tiny"]
    return argv, [f"{w}: the world (seed 0, size tiny) is damaged", f"{bad}: sha256 differs", ABSENT_FLAG]  # fmt: skip


@case()
def world__world_file_missing(e: Env):
    w = e.copy(e.world, "world")
    (Path(w) / "data/belebele/xa/test.jsonl").unlink()
    argv = ["world", "build", "--out", w, "--size", "tiny"]
    return argv, [f"{w}: the world (seed 0, size tiny) is damaged", "data/belebele/xa/test.jsonl: missing"]  # fmt: skip


@case()
def world__another_seed_without_overwrite(e: Env):
    w = e.copy(e.world, "world")
    argv = ["world", "build", "--out", w, "--size", "tiny", "--seed", "1"]
    return argv, [f"{w}: holds another world (seed 0, not 1); pass --overwrite to replace it"]


@case()
def world__unknown_size(e: Env):
    return ["world", "build", "--out", e.at("w"), "--size", "huge"], ["--size", "invalid choice: 'huge'"]  # fmt: skip


@case()
def world__seed_not_a_number(e: Env):
    return ["world", "build", "--out", e.at("w"), "--seed", "x"], ["--seed", "invalid int value: 'x'"]  # fmt: skip


@case()
def world__out_not_given(e: Env):
    return ["world", "build", "--size", "tiny"], ["the following arguments are required: --out"]


@case()
def world__unknown_action(e: Env):
    return ["world", "biuld", "--out", e.at("w")], ["invalid choice: 'biuld'"]


# ---------------------------------------------------------------------------------------- train


@case()
def train__changed_config_without_overwrite(e: Env):
    run = e.train_run("run", e.train_exp("old/exp.yaml"), step=2)
    new = e.train_exp(hyper=e.train_data()["hyper"] | {"lr": 0.5})
    argv = ["train", new, "--out", e.at("run"), "--no-ray"]
    return argv, [f"{run}: holds a training run of a different experiment (config changed)", ABSENT_FLAG]  # fmt: skip


@case()
def train__changed_config_with_resume(e: Env):
    run = e.train_run("run", e.train_exp("old/exp.yaml"), step=2)
    new = e.train_exp(hyper=e.train_data()["hyper"] | {"lr": 0.5})
    argv = ["train", new, "--out", e.at("run"), "--no-ray", "--resume"]
    return argv, [f"{run}: holds a training run of a different experiment"]


@case()
def train__unfinished_run_without_resume(e: Env):
    f = e.train_exp()
    run = e.train_run("run", f)
    argv = ["train", f, "--out", e.at("run"), "--no-ray"]
    return argv, [f"{run}: an unfinished run of this experiment exists (no checkpoint yet); pass --resume"]  # fmt: skip


@case()
def train__resume_without_a_run(e: Env):
    argv = ["train", e.train_exp(), "--out", e.at("run"), "--no-ray", "--resume"]
    return argv, [f"{e.at('run/train/t')}: --resume, but there is no run to continue"]


@case()
def train__resume_and_overwrite(e: Env):
    f = e.train_exp()
    e.train_run("run", f)
    argv = ["train", f, "--out", e.at("run"), "--no-ray", "--resume", "--overwrite"]
    return argv, ["--resume and --overwrite: give one"]


@case()
def train__use_gpu_where_cuda_is_not_usable(e: Env):
    f = e.train_exp(scaling={"use_gpu": True})
    return ["train", f, "--out", e.at("run")], ["scaling.use_gpu asks for a GPU, but torch", "sees no usable CUDA GPU", "LAYERSWAP_ALLOW_CPU=1"]  # fmt: skip


@case()
def search__promote_device_cuda_where_cuda_is_not_usable(e: Env):
    data = e.search_data()
    f = e.yaml("search.yaml", data | {"promote": data["promote"] | {"device": "cuda"}})
    return ["search", f, "--out", e.at("run")], ["promote.device: device 'cuda': torch", "sees no usable CUDA GPU"]  # fmt: skip


@case()
def train__run_folder_is_foreign_overwrite(e: Env):
    run = e.folder("run/train/t")
    argv = ["train", e.train_exp(), "--out", e.at("run"), "--no-ray", "--overwrite"]
    return argv, [f"{run}: exists and {NOT_OURS}"]


@case()
def train__run_folder_of_another_kind_overwrite(e: Env):
    run = e.folder("run/train/t", kind="analysis")
    argv = ["train", e.train_exp(), "--out", e.at("run"), "--no-ray", "--overwrite"]
    return argv, [f"{run}: holds an analysis report", "not a training run"]


@case()
def train__out_is_the_base_model(e: Env):
    base = e.copy(e.world / "base", "base")
    argv = ["train", e.train_exp(base=base), "--out", base, "--no-ray"]
    return argv, [f"{base}/train/t: is inside the input {base}"]


@case()
def train__base_inside_the_run_overwrite(e: Env):
    # Continuing from a checkpoint of an earlier run of the same name: --overwrite would set
    # the base aside with the old run.
    old = e.train_exp("old/exp.yaml")
    run = e.train_run("run", old)
    base = e.copy(e.world / "base", "run/train/t/checkpoints/samples_000000016")
    argv = ["train", e.train_exp(base=base), "--out", e.at("run"), "--no-ray", "--overwrite"]
    return argv, [f"{run}: contains the input {base}"]


def _math_rows(e: Env, n: int) -> list[str]:
    lines = (e.world / "data/sft/math_en.jsonl").read_text(encoding="utf-8").splitlines()
    return lines[:n]


@case()
def train__dataset_malformed_jsonl_line(e: Env):
    rows = _math_rows(e, 4)
    rows[2] = rows[2][:-1]  # a line cut short
    data = e.file("math.jsonl", "\n".join(rows) + "\n")
    argv = ["train", e.train_exp(datasets=[{"path": data}]), "--out", e.at("run"), "--no-ray"]
    return argv, [f"{data}:3: not valid JSON"]


@case()
def train__dataset_not_utf8(e: Env):
    latin1 = '{"question": "Combien coûte 1+1?", "answer": "2"}\n'.encode("latin-1")
    data = e.file("math.jsonl", "".join(r + "\n" for r in _math_rows(e, 2)).encode() + latin1)
    argv = ["train", e.train_exp(datasets=[{"path": data}]), "--out", e.at("run"), "--no-ray"]
    return argv, [f"{data}:3: not UTF-8 text (byte 0xfb"]


@case()
def train__experiment_not_utf8(e: Env):
    f = e.file("exp.yaml", yaml.safe_dump(e.train_data()).encode() + "# déjà\n".encode("cp1252"))  # fmt: skip
    return ["train", f, "--no-ray"], [f"{f}: not UTF-8 text"]


@case()
def train__experiment_yaml_syntax_error(e: Env):
    text = yaml.safe_dump(e.train_data(), sort_keys=False)
    f = e.file("exp.yaml", text + "hyper: {lr: 3e-4\n")
    line = text.count("\n") + 2  # the flow mapping is still open when the file ends
    return ["train", f, "--no-ray"], [f"{f}:{line}:", "not valid YAML"]


@case()
def train__unknown_field(e: Env):
    f = e.train_exp(hyper=e.train_data()["hyper"] | {"learning_rate": 1e-3})
    return ["train", f, "--no-ray"], [f"{f}: invalid experiment", "hyper.learning_rate: Extra inputs"]  # fmt: skip


@case()
def train__zero_learning_rate(e: Env):
    f = e.train_exp(hyper=e.train_data()["hyper"] | {"lr": 0})
    return ["train", f, "--no-ray"], [f"{f}: invalid experiment", "hyper.lr: Input should be greater than 0"]  # fmt: skip


@case()
def train__unknown_mode(e: Env):
    f = e.train_exp(mode="fancy")
    return ["train", f, "--no-ray"], [f"{f}: invalid experiment", "mode: Input tag 'fancy'"]


@case()
def train__mix_with_one_dataset(e: Env):
    f = e.train_exp(mode="mix")
    return ["train", f, "--no-ray"], [f"{f}: invalid experiment", "mode mix: needs exactly 2 datasets"]  # fmt: skip


@case()
def train__dataset_missing(e: Env):
    gone = e.at("data/math.jsonl")
    f = e.train_exp(datasets=[{"path": gone}])
    return ["train", f, "--no-ray"], [f"datasets[0].path: {gone} does not exist"]


@case()
def train__dataset_is_a_folder(e: Env):
    data = e.folder("data")
    f = e.train_exp(datasets=[{"path": data}])
    return ["train", f, "--no-ray"], [f"datasets[0].path: {data} is a folder, not a data file"]


@case()
def train__unknown_data_source(e: Env):
    f = e.train_exp(datasets=[{"source": "orca_maths"}])
    return ["train", f, "--no-ray"], ["datasets[0].source: unknown source 'orca_maths'"]


@case()
def train__base_is_not_a_model(e: Env):
    base = e.folder("models/base")
    return ["train", e.train_exp(base=base), "--no-ray"], [f"base: {base} is not a model folder (no config.json)"]  # fmt: skip


@case()
def train__base_of_a_family_the_merge_refuses(e: Env):
    """Refused before any training: a Gemma2 expert was trained (partial modes split its norms
    wrongly) and only its merge said the family is unsupported (a red-team)."""
    base = Path(e.copy(e.world / "base", "models/gemma2"))
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps(config | {"model_type": "gemma2"}))
    argv = ["train", e.train_exp(base=str(base)), "--out", e.at("run")]
    return argv, [f"base: {base / 'config.json'}: model_type 'gemma2' is not supported; supported: llama"]  # fmt: skip


@case()
def train__base_is_a_mistyped_relative_path(e: Env):
    """Refused before the run folder is marked: it used to fail after, with the Hub's "Repo id
    must be in the form ...", leaving a marked folder that blocked the corrected rerun."""
    argv = ["train", e.train_exp(base="runs/world/bsae"), "--out", e.at("run")]
    return argv, ["base: runs/world/bsae: no such folder, and not a Hub id (owner/name)"]


@case()
def train__base_hub_id_not_cached_offline(e: Env):
    """The tests run with HF_HUB_OFFLINE=1 (tests/conftest.py), as a cluster node does."""
    argv = ["train", e.train_exp(base="acme/no-such-model"), "--out", e.at("run")]
    return argv, ["base: acme/no-such-model: not a folder here, and not in the Hugging Face cache"]


@case()
def train__base_bare_hub_name_not_cached_offline(e: Env):
    """A Hub name without an owner (gpt2) is a Hub id to train, as to from_pretrained."""
    argv = ["train", e.train_exp(base="gpt2"), "--out", e.at("run")]
    return argv, ["base: gpt2: not a folder here, and not in the Hugging Face cache"]


@case()
def train__experiment_missing(e: Env):
    f = e.at("exp.yml")
    return ["train", f, "--no-ray"], [f"{f}: cannot read experiment"]


@case()
def train__resume_checkpoint_with_ray(e: Env):
    argv = ["train", e.train_exp(), "--out", e.at("run"), "--resume", e.at("run/ckpt")]
    return argv, ["--resume CKPT is for --no-ray"]


SWEEP = {"num_samples": 2, "params": {"hyper.lr": {"low": 1e-4, "high": 1e-2, "log": True}}}


@case()
def train__sweep_with_resume(e: Env):
    argv = ["train", e.train_exp(sweep=SWEEP), "--out", e.at("run"), "--resume"]
    return argv, ["--resume: an expert sweep is resumed with --continue"]


@case()
def train__sweep_exists_without_overwrite(e: Env):
    run = e.folder("run/train/t", kind="train")
    argv = ["train", e.train_exp(sweep=SWEEP), "--out", e.at("run")]
    return argv, [f"{run}: an expert sweep of t exists; {ABSENT_FLAG}"]


@case()
def train__old_search_key(e: Env):
    """Configs from before the rename say `search:` for the expert sweep: told what to change."""
    f = e.train_exp(search=SWEEP)
    return ["train", f, "--no-ray"], [f"{f}: invalid experiment", "search: the expert-sweep block is now called `sweep:`"]  # fmt: skip


@case()
def train__misspelt_flag(e: Env):
    return ["train", e.train_exp(), "--no-rays"], ["unrecognized arguments: --no-rays"]


# ----------------------------------------------------------------------------------------- eval

WORLD_TASK = "world_mgsm_direct_xa_dev"


def _eval(e: Env, *extra: str, model: str | None = None) -> list[str]:
    return ["eval", model or str(e.family["task"]), "--tasks", WORLD_TASK, "--world", str(e.world), *extra]  # fmt: skip


@case()
def eval__out_is_a_folder(e: Env):
    out = e.folder("results")
    return _eval(e, "--out", out), [f"{out}: is a folder; give a file name"]


@case()
def eval__out_exists_without_overwrite(e: Env):
    out = e.file("raw.json", json.dumps({"results": {}, "configs": {}}))
    return _eval(e, "--out", out), [f"{out}: already exists; {ABSENT_FLAG}"]


@case()
def eval__out_is_not_a_result_overwrite(e: Env):
    out = e.file("notes.json", json.dumps({"todo": ["read the paper"]}))
    return _eval(e, "--out", out, "--overwrite"), [f"{out}: is not an lm-eval result JSON"]


@case()
def eval__out_inside_the_model(e: Env):
    model = e.copy(e.family["task"], "model")
    out = f"{model}/raw.json"
    return _eval(e, "--out", out, model=model), [f"{out}: is inside the input {model}"]


@case()
def eval__out_inside_the_world_overwrite(e: Env):
    w = e.copy(e.world, "world")
    out = f"{w}/world.json"
    argv = ["eval", str(e.family["task"]), "--tasks", WORLD_TASK, "--world", w, "--out", out, "--overwrite"]  # fmt: skip
    return argv, [f"{out}: is inside the input {w}"]


@case()
def eval__out_parent_not_writable(e: Env):
    out = f"{e.read_only_parent()}/raw.json"
    return _eval(e, "--out", out), [f"{out}: cannot be created", "is not writable"]


@case()
def eval__out_parent_is_a_file(e: Env):
    f = e.file("notes.txt", "x\n")
    out = f"{f}/raw.json"
    return _eval(e, "--out", out), [f"{out}: cannot be created, {f} is not a folder"]


@case()
def eval__world_corrupted(e: Env):
    w, bad = e.corrupt_world()
    argv = ["eval", str(e.family["task"]), "--tasks", WORLD_TASK, "--world", w]
    return argv, [f"--world {w}: {bad}: sha256 differs from world.json"]


@case()
def eval__world_file_missing(e: Env):
    w = e.copy(e.world, "world")
    (Path(w) / "data/mgsm/xa/dev.jsonl").unlink()
    argv = ["eval", str(e.family["task"]), "--tasks", WORLD_TASK, "--world", w]
    return argv, [f"--world {w}: data/mgsm/xa/dev.jsonl: missing"]


@case()
def eval__world_is_not_a_world(e: Env):
    w = e.folder("world")
    argv = ["eval", str(e.family["task"]), "--tasks", WORLD_TASK, "--world", w]
    return argv, [f"--world {w}: not a world (no world.json, no data/)"]


@case()
def eval__model_missing(e: Env):
    m = e.at("models/task")
    return _eval(e, model=m), [f"model folder {m} does not exist"]


@case()
def eval__model_is_the_world(e: Env):
    return _eval(e, model=str(e.world)), [f"{e.world}/config.json missing"]


@case()
def eval__model_with_pickled_weights_only(e: Env):
    m = e.folder("model")
    shutil.copyfile(e.family["task"] / "config.json", Path(m) / "config.json")
    e.file("model/pytorch_model.bin", b"\x80\x02}q\x00.")
    return _eval(e, model=m), [f"{m}: only pickled weights (pytorch_model.bin)"]


@case()
def eval__no_task_names(e: Env):
    return ["eval", str(e.family["task"]), "--tasks", " , "], ["--tasks: give at least one task name"]  # fmt: skip


@case()
def eval__world_task_without_world(e: Env):
    return ["eval", str(e.family["task"]), "--tasks", WORLD_TASK], [f"--tasks {WORLD_TASK}: world tasks need --world DIR"]  # fmt: skip


@case()
def eval__unknown_world_task(e: Env):
    argv = ["eval", str(e.family["task"]), "--tasks", "world_mgsm_direct_xq_dev", "--world", str(e.world)]  # fmt: skip
    return argv, [f"--tasks world_mgsm_direct_xq_dev: not a task of the world {e.world}", WORLD_TASK]  # fmt: skip


@case()
def eval__zero_limit(e: Env):
    return _eval(e, "--limit", "0"), ["--limit must be positive, got '0'"]


@case()
def eval__limit_not_a_whole_count(e: Env):
    # lm-eval reads a limit >= 1 as int(limit): 1.5 used to mean 1 doc, silently
    return _eval(e, "--limit", "1.5"), ["--limit '1.5': a count of docs must be a whole number"]


@case()
def eval__model_world_tasks_and_out_all_wrong(e: Env):
    # the red-team's case: each check raised in turn, so only the model was named
    m, w, out = e.at("nowhere/model"), e.folder("world"), e.folder("results")
    argv = ["eval", m, "--tasks", " , ", "--world", w, "--out", out, "--device", "tpu"]
    return argv, [
        f"model folder {m} does not exist",
        "--tasks: give at least one task name",
        f"--world {w}: not a world (no world.json, no data/)",
        f"{out}: is a folder; give a file name",
        "--device: device 'tpu'",
    ]


@case()
def eval__model_and_an_unknown_world_task(e: Env):
    m, out = e.at("nowhere/model"), e.folder("results")
    argv = ["eval", m, "--tasks", "world_mgsm_direct_xq_dev", "--world", str(e.world), "--out", out]  # fmt: skip
    return argv, [
        f"model folder {m} does not exist",
        f"--tasks world_mgsm_direct_xq_dev: not a task of the world {e.world}",
        f"{out}: is a folder; give a file name",
    ]


@case()
def eval__tasks_not_given(e: Env):
    return ["eval", str(e.family["task"])], ["the following arguments are required: --tasks"]


@case()
def eval__batch_size_not_a_number(e: Env):
    return _eval(e, "--batch-size", "big"), ["--batch-size", "invalid --batch-size 'big'", "auto"]


@case()
def eval__batch_size_zero(e: Env):
    return _eval(e, "--batch-size", "0"), ["invalid --batch-size '0' (a positive int or auto)"]


@case()
def eval__device_unknown(e: Env):
    return _eval(e, "--device", "gpu"), ["--device: device 'gpu': expected auto, cpu, cuda"]


# --------------------------------------------------------------------------------------- search


@case()
def search__expert_folder_missing(e: Env):
    gone = e.at("experts/task")
    f = e.search_exp(task_experts=[gone])
    return ["search", f, "--out", e.at("run")], [f"task_experts[0] {gone}: no such folder"]


@case()
def search__unknown_proxy_task(e: Env):
    f = e.search_exp(proxies=[{"task": "world_belebele_xq_dev"}])
    return ["search", f, "--out", e.at("run")], ["proxies[0].task world_belebele_xq_dev: unknown task", "did you mean"]  # fmt: skip


@case()
def search__proxy_chance_outside_its_scale(e: Env):
    f = e.search_exp(proxies=[{"task": "world_belebele_brier_xa_dev", "chance": 1.5}])
    return ["search", f, "--out", e.at("run")], ["proxy world_belebele_brier_xa_dev: chance 1.5 must lie between worst 0.0 and best 1.0"]  # fmt: skip


@case()
def search__lower_is_better_proxy_scaled_as_accuracy(e: Env):
    # Brier's chance (0.75) lies inside accuracy's default scale; only the metric's direction
    # tells the mistake, and the search refuses it before Ray starts or anything is written.
    f = e.search_exp(proxies=[{"task": "world_belebele_brier_xa_dev", "chance": 0.75}])
    return ["search", f, "--out", e.at("run")], ["proxy world_belebele_brier_xa_dev: lm-eval's brier_score is lower-is-better, but the proxy has best 1.0 and worst 0.0"]  # fmt: skip


@case()
def search__unknown_target_task(e: Env):
    f = e.search_exp(target="world_mgsm_direct_xq")
    return ["search", f, "--out", e.at("run")], ["target world_mgsm_direct_xq: unknown task"]


@case()
def search__registry_of_the_wrong_schema(e: Env):
    reg = e.at("experts/registry.parquet")
    Path(reg).parent.mkdir()
    pq.write_table(pa.table({"expert_id": ["e0"], "language": ["en"], "mode": ["full"]}), reg)
    f = e.search_exp(task_experts=[], language_experts=[], experts={"registry": reg})
    return ["search", f, "--out", e.at("run")], [f"experts.registry {reg}: missing columns ['kind', 'path']"]  # fmt: skip


@case()
def search__registry_not_parquet(e: Env):
    reg = e.file("experts/registry.csv", "expert_id,kind,path\ne0,math,/x\n")
    f = e.search_exp(task_experts=[], language_experts=[], experts={"registry": reg})
    return ["search", f, "--out", e.at("run")], [f"experts.registry {reg}: not a readable Parquet file"]  # fmt: skip


@case()
def search__changed_experiment_without_overwrite(e: Env):
    sdir = e.earlier_search("run", e.search_data(language_experts=[str(e.experts["language2"])]))
    f = e.search_exp()
    return ["search", f, "--out", e.at("run")], [f"{sdir}: a search of a different experiment exists; {ABSENT_FLAG}"]  # fmt: skip


@case()
def search__same_experiment_without_resume(e: Env):
    sdir = e.earlier_search("run", e.search_data())
    return ["search", e.search_exp(), "--out", e.at("run")], [f"{sdir}: a search of this experiment exists; pass --resume"]  # fmt: skip


@case()
def search__changed_experiment_with_resume(e: Env):
    sdir = e.earlier_search("run", e.search_data(language_experts=[str(e.experts["language2"])]))
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--resume"]
    return argv, [f"--resume: the experiment differs from {sdir}/experiment.json"]


@case()
def search__resume_and_overwrite(e: Env):
    e.earlier_search("run", e.search_data())
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--resume", "--overwrite"]
    return argv, ["--resume and --overwrite: give one"]


@case()
def search__search_folder_is_foreign_overwrite(e: Env):
    sdir = e.folder("run/search")
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--overwrite"]
    return argv, [f"{sdir}: exists and {NOT_OURS}"]


@case()
def search__search_folder_of_another_kind_overwrite(e: Env):
    sdir = e.folder("run/search", kind="merge")
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--overwrite"]
    return argv, [f"{sdir}: holds a merged model", "not a merge search"]


@case()
def search__out_is_an_input_expert_overwrite(e: Env):
    task = e.copy(e.experts["task"], "experts/task")
    argv = ["search", e.search_exp(task_experts=[task]), "--out", task, "--overwrite"]
    return argv, [f"{task}/search: is inside the input {task}"]


@case()
def search__out_is_the_world(e: Env):
    w = e.copy(e.world, "world")
    argv = ["search", e.search_exp(world=w), "--out", w]
    return argv, [f"{w}/search: is inside the input {w}"]


@case()
def search__best_is_foreign_overwrite(e: Env):
    best = e.folder("run/best")
    argv = ["search", e.search_exp(), "--out", e.at("run"), "--overwrite"]
    return argv, [f"{best}: exists and {NOT_OURS}"]


@case()
def search__best_is_an_input_expert_overwrite(e: Env):
    # The best model of an earlier search, used as the task expert of the next one.
    best = e.copy(e.experts["task"], "run/best")
    write_marker(Path(best), "merge", "an earlier search")
    argv = ["search", e.search_exp(task_experts=[best]), "--out", e.at("run"), "--overwrite"]
    return argv, [f"{best}: is the input {best}"]


@case()
def search__unknown_field(e: Env):
    f = e.search_exp(proxy_evaluation={"limit": 8})
    return ["search", f, "--out", e.at("run")], [f"{f}: invalid search experiment", "proxy_evaluation: Extra inputs"]  # fmt: skip


@case()
def search__zero_trials(e: Env):
    f = e.search_exp(search={"num_samples": 0})
    return ["search", f, "--out", e.at("run")], [f"{f}: invalid search experiment", "search.num_samples"]  # fmt: skip


@case()
def search__yaml_syntax_error(e: Env):
    text = yaml.safe_dump(e.search_data(), sort_keys=False)
    f = e.file("search.yaml", text + "name: [xa\n")
    line = text.count("\n") + 2  # the flow sequence is still open when the file ends
    return ["search", f, "--out", e.at("run")], [f"{f}:{line}:", "not valid YAML"]


@case()
def search__not_utf8(e: Env):
    f = e.file("search.yaml", yaml.safe_dump(e.search_data()).encode() + "# à faire\n".encode("latin-1"))  # fmt: skip
    return ["search", f, "--out", e.at("run")], [f"{f}: not UTF-8 text"]


@case()
def search__world_missing(e: Env):
    gone = e.at("runs/world")
    f = e.search_exp(world=gone)
    return ["search", f, "--out", e.at("run")], [f"world {gone}: no such folder"]


@case()
def search__world_corrupted(e: Env):
    w, bad = e.corrupt_world()
    f = e.search_exp(world=w)
    return ["search", f, "--out", e.at("run")], [f"world {w}: {bad}: sha256 differs"]


@case()
def search__experiment_missing(e: Env):
    f = e.at("search.yml")
    return ["search", f], [f"{f}: cannot read experiment"]


# -------------------------------------------------------------------------------------- analyze


@case()
def analyze__out_is_the_run_overwrite(e: Env):
    run = e.copy(e.run, "run")
    return ["analyze", run, "--out", run, "--overwrite"], [f"{run}: contains the input {run}/search"]  # fmt: skip


@case()
def analyze__out_is_a_folder_of_the_run_overwrite(e: Env):
    run = e.copy(e.run, "run")
    out = f"{run}/search"
    return ["analyze", run, "--out", out, "--overwrite"], [f"{out}: is the input {out}"]


@case()
def analyze__out_contains_the_run_overwrite(e: Env):
    run = e.copy(e.run, "runs/xa")
    out = e.at("runs")
    return ["analyze", run, "--out", out, "--overwrite"], [f"{out}: contains the input {run}/experts"]  # fmt: skip


@case()
def analyze__out_is_a_world_overwrite(e: Env):
    w = e.copy(e.world, "world")
    return ["analyze", str(e.run), "--out", w, "--overwrite"], [f"{w}: holds an embedded world", "not an analysis report"]  # fmt: skip


@case()
def analyze__out_is_a_foreign_folder_overwrite(e: Env):
    out = e.folder("mine")
    return ["analyze", str(e.run), "--out", out, "--overwrite"], [f"{out}: exists and {NOT_OURS}"]  # fmt: skip


@case()
def analyze__report_exists_without_overwrite(e: Env):
    out = e.folder("report", kind="analysis")
    return ["analyze", str(e.run), "--out", out], [f"{out}: already exists; {ABSENT_FLAG}"]


@case()
def analyze__run_missing(e: Env):
    run = e.at("runs/xa")
    return ["analyze", run], [f"{run}: run directory does not exist"]


@case()
def analyze__trials_not_parquet(e: Env):
    run = e.copy(e.run, "run")
    (Path(run) / "search/trials.parquet").write_text("trial_id,objective\nt0,0.5\n")
    argv = ["analyze", run, "--out", e.at("report")]
    return argv, [f"{run}/search/trials.parquet: not a readable Parquet file"]


@case()
def analyze__promotion_results_missing_columns(e: Env):
    run = e.copy(e.run, "run")
    pq.write_table(pa.table({"name": ["base"], "score": [0.1]}), f"{run}/promotion/results.parquet")  # fmt: skip
    argv = ["analyze", run, "--out", e.at("report")]
    return argv, [f"{run}/promotion/results.parquet: missing required column(s) ['model', 'task', 'value']"]  # fmt: skip


@case()
def analyze__demo_recipe_yaml_syntax_error(e: Env):
    r = e.file("run/recipe.yaml", "method: layer_swap\nbottom: 1\n  top: 2\n")
    return ["analyze", e.at("run"), "--out", e.at("report")], [f"{r}:3:", "not valid YAML"]


@case()
def analyze__demo_recipe_not_utf8(e: Env):
    r = e.file("run/recipe.yaml", "method: layer_swap\n# réglé\n".encode("latin-1"))
    return ["analyze", e.at("run"), "--out", e.at("report")], [f"{r}: not UTF-8 text"]


@case()
def analyze__zero_resamples(e: Env):
    return ["analyze", str(e.run), "--resamples", "0"], ["--resamples", "expected a positive integer, got '0'"]  # fmt: skip


@case()
def analyze__negative_delta_threshold(e: Env):
    return ["analyze", str(e.run), "--delta-threshold", "-1"], ["--delta-threshold", "expected a number >= 0, got '-1'"]  # fmt: skip


@case()
def analyze__delta_quantile_of_one(e: Env):
    return ["analyze", str(e.run), "--delta-quantile", "1"], ["--delta-quantile", "expected a number between 0 and 1 (exclusive), got '1'"]  # fmt: skip


@case()
def analyze__delta_threshold_and_quantile(e: Env):
    return ["analyze", str(e.run), "--delta-threshold", "0.1", "--delta-quantile", "0.5"], ["--delta-quantile", "not allowed with argument --delta-threshold"]  # fmt: skip


# ----------------------------------------------------------------------------------------- demo


@case()
def demo__out_is_a_foreign_folder_overwrite(e: Env):
    out = e.folder("mine")
    return ["demo", "--out", out, "--overwrite", "--world-size", "tiny"], [f"{out}: exists and {NOT_OURS}"]  # fmt: skip


@case()
def demo__out_is_a_foreign_folder(e: Env):
    out = e.folder("mine")
    return ["demo", "--out", out, "--world-size", "tiny"], [f"{out}: exists and {NOT_OURS}"]


@case()
def demo__out_is_a_world_overwrite(e: Env):
    w = e.copy(e.world, "world")
    return ["demo", "--out", w, "--overwrite", "--world-size", "tiny"], [f"{w}: holds an embedded world", "not a demo run"]  # fmt: skip


@case()
def demo__out_is_a_merge_only_demo_overwrite(e: Env):
    out = e.folder("demo", kind="merge-demo")
    return ["demo", "--out", out, "--overwrite"], [f"{out}: holds a merge-only demo", "not a demo run"]  # fmt: skip


@case()
def demo__out_is_a_file(e: Env):
    out = e.file("demo", "x\n")
    return ["demo", "--out", out], [f"{out}: exists and is not a folder"]


@case()
def demo__earlier_run_without_overwrite(e: Env):
    out = e.folder("runs/demo", kind="demo")
    e.file("runs/demo/leaderboard.md", "# Leaderboard\n")
    return ["demo", "--world-size", "tiny"], [f"{out}: a demo run exists; pass --resume to continue it or --overwrite"]  # fmt: skip


@case()
def demo__resume_and_overwrite(e: Env):
    out = e.folder("demo", kind="demo")
    return ["demo", "--out", out, "--resume", "--overwrite"], ["--resume and --overwrite: give one"]  # fmt: skip


@case()
def demo__resume_a_run_of_another_world(e: Env):
    out = e.folder("demo", kind="demo")  # its identity is not "seed=0 size=tiny"
    return ["demo", "--out", out, "--world-size", "tiny", "--resume"], [f"{out}: --resume, but this demo run has an earlier run", "seed=0 size=tiny"]  # fmt: skip


@case()
def demo__merge_only_resume(e: Env):
    return ["demo", "--merge-only", "--out", e.at("demo"), "--resume"], ["--merge-only has nothing to resume"]  # fmt: skip


@case()
def demo__merge_only_with_pipeline_flags(e: Env):
    """--seed and --trials were ignored without a word under --merge-only."""
    argv = ["demo", "--merge-only", "--out", e.at("demo"), "--seed", "3", "--trials", "4"]
    return argv, ["--seed, --trials: the pipeline's settings; --merge-only merges a generated tiny family only"]  # fmt: skip


@case()
def demo__merge_only_out_is_a_foreign_folder_overwrite(e: Env):
    out = e.folder("mine")
    return ["demo", "--merge-only", "--out", out, "--overwrite"], [f"{out}: exists and {NOT_OURS}"]  # fmt: skip


@case()
def demo__merge_only_holds_the_users_own_merge_overwrite(e: Env):
    """A merge the user wrote inside a merge-only demo (`merge --out mo/my_swap`, allowed) is
    theirs: --overwrite deleted it with the demo's own merged/ (a red-team)."""
    out = Path(e.at("mo"))
    for rel, kind in (("merged", "merge"), ("my_swap", "merge")):
        e.file(f"mo/{rel}/model.safetensors", b"weights")
        write_marker(out / rel, kind, "a merge", files=["model.safetensors"])
    e.file("mo/recipe.yaml", "method: layer_swap\n")
    write_marker(out, "merge-demo", "an earlier run", files=["recipe.yaml"])
    argv = ["demo", "--merge-only", "--out", str(out), "--overwrite"]
    return argv, [f"{out}: holds what layerswap did not write there (my_swap/)"]


@case()
def demo__merge_only_out_is_a_demo_run_overwrite(e: Env):
    out = e.folder("demo", kind="demo")
    return ["demo", "--merge-only", "--out", out, "--overwrite"], [f"{out}: holds a demo run", "not a merge-only demo"]  # fmt: skip


@case()
def demo__merge_only_exists_without_overwrite(e: Env):
    out = e.folder("demo", kind="merge-demo")
    return ["demo", "--merge-only", "--out", out], [f"{out}: already exists; {ABSENT_FLAG}"]


@case()
def demo__zero_trials(e: Env):
    return ["demo", "--out", e.at("demo"), "--trials", "0"], ["--trials", "expected a positive integer, got '0'"]  # fmt: skip


@case()
def demo__negative_train_steps(e: Env):
    return ["demo", "--out", e.at("demo"), "--train-steps", "-5"], ["--train-steps", "expected a positive integer, got '-5'"]  # fmt: skip


@case()
def demo__unknown_world_size(e: Env):
    return ["demo", "--out", e.at("demo"), "--world-size", "small"], ["--world-size", "invalid choice: 'small'"]  # fmt: skip


# ---------------------------------------------------------------------------------------- tests


@pytest.fixture
def env(tmp_path, monkeypatch, tiny_world, family, expert_pair, analysis_run, merged_model) -> Env:
    """A case's folder, also the working directory (default outputs such as runs/ land in it)."""
    monkeypatch.chdir(tmp_path)
    return Env(tmp_path, tiny_world, family.paths, expert_pair, analysis_run, merged_model)


def _roots(e: Env) -> list[Path]:
    """Every folder a case may not change: its own and each shared input."""
    shared = {e.world, e.family["task"].parent, e.experts["task"].parent, e.run, e.merged.parent}
    return [e.tmp, *sorted(shared)]


@pytest.fixture(autouse=True)
def bases_in_tmp(monkeypatch, tmp_path):
    """Shipped world bases under the case's folder, so no case can touch world/bases/."""
    monkeypatch.setattr("layerswap.world.prebuilt.BASES_DIR", tmp_path / "bases")


# The first step of real work of each command (the other batteries trip the same places).
TRIPPED = (
    "layerswap.world.build.make_datasets",
    "layerswap.trainables.merge.engine.write_assembly",
    "layerswap.trainables.train.run._train",
    "layerswap.experts.sweep.run_sweep",
    "layerswap.trainables.evaluate.harness.evaluate",
    "layerswap.search.search.resolve_pool",
    "layerswap.analysis.report.render_html",
    "ray.init",
)


@pytest.fixture(autouse=True)
def tripwires(monkeypatch):
    """The first step of real work in each command fails the case at once: bad input must be
    refused before training, evaluation, merging, building or Ray start."""

    def trip(where: str):
        def tripped(*args, **kwargs):
            pytest.fail(f"bad input got past the checks into {where}")

        return tripped

    for target in TRIPPED:
        monkeypatch.setattr(target, trip(target))


def _changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def _leftovers(roots: list[Path]) -> list[str]:
    """Temporary siblings of the atomic writers (.NAME.tmp-*, .NAME.old-*, .NAME.replaced-*)."""
    return [str(p) for r in roots for p in r.parent.glob(f".{r.name}.*")]


@pytest.mark.parametrize("make", CASES)
def test_bad_input_is_refused_and_changes_nothing(make: Case, env: Env, tree_state, capsys):
    argv, expected = make(env)
    roots = _roots(env)
    before = tree_state(*roots)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: usage errors exit 2 from parse_args
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    missing = [s for s in expected if s not in err]
    assert not missing, f"stderr lacks {missing}:\n{err}"
    assert not _changes(before, tree_state(*roots))
    assert not _leftovers(roots)


# --------------------------------------------------------------------------- world export-base


@case()
def world__export_base_of_a_damaged_world(e: Env):
    w, bad = e.corrupt_world()
    return ["world", "export-base", w, "--name", "b"], [f"{w}: not an intact world", f"{bad}: sha256 differs"]  # fmt: skip


@case()
def world__export_base_of_a_folder_without_world_json(e: Env):
    w = e.folder("mine")
    return ["world", "export-base", w, "--name", "b"], [f"{w}: not an intact world: world.json: missing"]  # fmt: skip


@case()
def world__export_base_name_is_a_path(e: Env):
    return ["world", "export-base", str(e.world), "--name", "../b"], ["base name '../b': expected a plain folder name"]  # fmt: skip


@case()
def world__export_base_too_large(e: Env):
    argv = ["world", "export-base", str(e.world), "--name", "b", "--max-mb", "0.001"]
    return argv, ["base: the base is 0.3 MB, over the 0.001 MB a shipped base may take"]


@case()
def world__export_base_name_taken_by_a_folder_of_mine(e: Env):
    dest = e.folder("bases/b")  # world.prebuilt.BASES_DIR is tmp/bases here (bases_in_tmp)
    return ["world", "export-base", str(e.world), "--name", "b", "--overwrite"], [f"{dest}: exists and {NOT_OURS}"]  # fmt: skip


@case()
def world__config_names_a_base_not_shipped(e: Env):
    entry = {"name": "nope", "files": dict.fromkeys(["config.json", "generation_config.json", "model.safetensors", "world_config.json"], "0" * 64), "tokenizer_files": {"tokenizer.json": "0" * 64}, "corpus_sha256": "0" * 64, "final_pretrain_loss": 1.0}  # fmt: skip
    cfg = e.yaml("variant.yaml", {"model": {"prebuilt": entry}})
    argv = ["world", "build", "--out", e.at("w"), "--size", "tiny", "--config", cfg]
    return argv, [f"model.prebuilt: no shipped base {e.at('bases/nope')}"]


# ----------------------------------------------------------------------------------------- plan

_PLAN_SEARCH = {
    "language": "swh",
    "base": "meta-llama/Llama-3.1-8B-Instruct",
    "task_experts": ["t"],
    "language_experts": ["l"],
    "proxies": [{"task": "belebele_swh_Latn", "chance": 0.25}, {"task": "mgsm_direct_en"}],
    "target": "mgsm_direct_sw",
}


def _plan_study(e: Env, **search) -> str:
    return e.yaml("study.yaml", {"name": "s", "searches": [{"experiment": {**_PLAN_SEARCH, **search}}]})  # fmt: skip


@case()
def plan__study_missing(e: Env):
    s = e.at("none.yaml")
    return ["plan", s], [f"{s}: cannot read study"]


@case()
def plan__unknown_key(e: Env):
    study = e.yaml("study.yaml", {"name": "s", "experts": [{"config": "x.yaml", "bogus": 1}]})
    return ["plan", study], ["experts.0.bogus"]


@case()
def plan__config_missing(e: Env):
    study = e.yaml("study.yaml", {"name": "s", "experts": [{"config": "missing.yaml"}]})
    return ["plan", study], ["experts[0] (missing.yaml)", "missing.yaml: cannot read"]


@case()
def plan__unknown_profile(e: Env):
    return ["plan", _plan_study(e), "--profile", "tpu"], ["profile 'tpu': unknown (known: cpu, h100, h200)"]  # fmt: skip


@case()
def plan__unknown_target_task(e: Env):
    return ["plan", _plan_study(e, target="mgsm_direct_zz"), "--json", e.at("plan.json")], ["unknown task mgsm_direct_zz"]  # fmt: skip


@case()
def plan__json_exists_without_overwrite(e: Env):
    out = e.file("plan.json", "{}")
    return ["plan", _plan_study(e), "--json", out], [f"{out}: already exists; {ABSENT_FLAG}"]


@case()
def plan__json_is_the_study_overwrite(e: Env):
    s = _plan_study(e)
    return ["plan", s, "--json", s, "--overwrite"], [f"{s}: is the input {s}"]


@case()
def plan__cluster_missing(e: Env):
    f = e.at("cluster.yaml")
    return ["plan", _plan_study(e), "--cluster", f], [f"{f}: cannot read cluster config"]


@case()
def plan__cluster_is_not_a_cluster_config(e: Env):
    """A study file given as --cluster was accepted (exit 0, a note under the plan)."""
    s = _plan_study(e)
    return ["plan", s, "--cluster", s], [f"--cluster {s}: not a Ray cluster config (no available_node_types)"]  # fmt: skip


# ------------------------------------------------------------------------------------ prefetch


@case()
def prefetch__config_missing(e: Env):
    f = e.at("none.yaml")
    return ["prefetch", f, "--dry-run"], [f"{f}: cannot read config"]


@case()
def prefetch__not_a_layerswap_config(e: Env):
    f = e.yaml("cluster.yaml", {"cluster_name": "x", "max_workers": 2})
    return ["prefetch", f, "--dry-run"], [f"{f}: not a study (experts/searches), training (datasets) or search (proxies) config"]  # fmt: skip


@case()
def prefetch__yaml_syntax_error(e: Env):
    f = e.file("bad.yaml", "datasets: [unclosed\n")
    return ["prefetch", f, "--dry-run"], [f"{f}"]


@case()
def prefetch__invalid_training_config(e: Env):
    f = e.train_exp(hyper=e.train_data()["hyper"] | {"lr": -1})
    return ["prefetch", f], ["hyper.lr"]


@case()
def prefetch__study_names_a_missing_config(e: Env):
    study = e.yaml("study.yaml", {"name": "s", "experts": [{"config": "missing.yaml"}]})
    return ["prefetch", study], ["experts[0] (missing.yaml)", "missing.yaml: cannot read"]


@case()
def prefetch__no_config_given(e: Env):
    return ["prefetch"], ["the following arguments are required: configs"]


def test_every_command_has_a_battery():
    per_command = Counter(p.id.split("__")[0] for p in CASES)
    assert set(per_command) == set(SUBCOMMANDS), per_command
    assert min(per_command.values()) >= 5 and sum(per_command.values()) >= 60, per_command


# One case per heavy command, run as `python -m layerswap.cli` (real stderr, real exit status).
REAL = (
    merge__out_is_an_input_expert,
    train__changed_config_without_overwrite,
    eval__world_corrupted,
    search__changed_experiment_without_overwrite,
    analyze__out_is_the_run_overwrite,
    demo__out_is_a_world_overwrite,
)


def test_real_processes(tmp_path, tiny_world, family, expert_pair, analysis_run, merged_model, tree_state):  # fmt: skip
    """The cases of REAL as subprocesses, all at once (each pays the imports of its command)."""
    envs, argvs, expects = [], [], []
    for make in REAL:
        e = Env(tmp_path / make.__name__, tiny_world, family.paths, expert_pair, analysis_run, merged_model)  # fmt: skip
        e.tmp.mkdir()
        argv, expected = make(e)  # REAL cases name every path absolutely
        envs.append(e)
        argvs.append(argv)
        expects.append(expected)
    roots = sorted({r for e in envs for r in _roots(e)})
    before = tree_state(*roots)
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "layerswap.cli", *argv],
            cwd=e.tmp,
            env=os.environ | {"PYTHONPATH": pythonpath},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for e, argv in zip(envs, argvs, strict=True)
    ]
    problems = []
    for make, proc, expected in zip(REAL, procs, expects, strict=True):
        _, err = proc.communicate(timeout=300)
        missing = [s for s in expected if s not in err]
        if proc.returncode != 2 or "Traceback" in err or missing:
            problems.append(f"{make.__name__}: exit {proc.returncode}, lacks {missing}:\n{err}")
    assert not problems, "\n".join(problems)
    assert not _changes(before, tree_state(*roots))
    assert not _leftovers(roots)


# ---------------------------------------------------------------------------------------- schema


@case()
def schema__unknown_kind(e: Env):
    return ["schema", "experiment"], ["invalid choice: 'experiment'"]


@case()
def schema__out_exists_without_overwrite(e: Env):
    out = e.file("train.schema.json", "{}")
    return ["schema", "train", "--out", out], [f"{out}: already exists; {ABSENT_FLAG}"]


@case()
def schema__out_is_a_foreign_json_overwrite(e: Env):
    out = e.file("settings.json", '{"editor.tabSize": 4}')
    return ["schema", "train", "--out", out, "--overwrite"], [f"{out}: is not a layerswap JSON Schema; refusing to replace it"]  # fmt: skip


@case()
def schema__out_is_a_folder(e: Env):
    out = e.folder("schemas")
    return ["schema", "recipe", "--out", out], [f"{out}: is a folder; give a file name"]


@case()
def schema__out_in_a_read_only_folder(e: Env):
    out = f"{e.read_only_parent()}/study.schema.json"
    return ["schema", "study", "--out", out], [f"{out}: cannot be created"]
