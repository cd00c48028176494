"""A study's experiments as the files its commands read: `layerswap plan STUDY --export DIR`.

A study names each expert's config with overrides and a `sweep:` block (spaces/study.py), which
`layerswap train` does not read from the study. Exporting writes each expert's experiment as the
study resolved it (overrides and sweep applied; local inputs that exist made absolute, as a
search file's are, outputs such as storage_path kept as written) to DIR/experts/NAME.yaml,
each search to DIR/searches/NAME.yaml, and DIR/commands.sh: the commands that run the study in
order (experts, searches, analyses), with each sweep's `--out` the run folder whose registry the
searches of its base read. Every command carries `--continue`, so the script can be run again
after an interruption: each step takes its output as it stands (HEADER says how).
Run: `layerswap plan spaces/examples/world_study.yaml --export DIR`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from layerswap.spaces.base import same_model
from layerswap.spaces.study import LoadedStudy, StudyExpert, StudySearch
from layerswap.spaces.train_experiment import resolve_input_paths

REGISTRY_TAIL = ("experts", "registry.parquet")  # RUN/experts/registry.parquet (experts.registry)


# What commands.sh says of itself: each line is what `--continue` does (`layerswap train|search|
# analyze --help`), the one promise a rerun of the script rests on.
HEADER = """\
Run in order. Every command carries --continue, so after an interruption run this script
again: a finished step says so and is skipped, an unfinished one continues (a training run
from its last checkpoint, a search from its finished trials, a promotion keeping the models
it evaluated, an expert sweep keeping its finished trials and their registry rows), the rest
run. Only an expert sweep cut before Ray Tune saved any state stops the script, saying so; run
its line with --overwrite instead of --continue (its trials and registry rows start over), then
this script again. A step that fails stops the script: fix the cause it names, then run the
script again; an expert sweep whose trials all failed (no expert registered) then retries them,
one of which only some failed is finished and not retried (--overwrite reruns it). A report is
rewritten when its run changed after it was written. Review every --out before running;
relative paths (runs/...) are relative to the folder this is run from, as the study's own are."""


def _yaml(data: dict, header: str) -> str:
    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def _run_of(search: StudySearch) -> Path | None:
    """The run folder whose registry a search reads (RUN of RUN/experts/registry.parquet)."""
    src = search.experiment.experts
    if src is None:
        return None
    reg = Path(src.registry)
    return reg.parent.parent if reg.parts[-2:] == REGISTRY_TAIL else None


def _expert_out(ex: StudyExpert, searches: list[StudySearch]) -> Path | None:
    """Where a sweep must write for the searches of its base to find its registry rows: the one
    run folder they read (None when none does, or they read several)."""
    runs = {
        run
        for s in searches
        if (run := _run_of(s)) is not None
        and (s.experiment.base is None or same_model(s.experiment.base, ex.experiment.base))
    }
    return runs.pop() if len(runs) == 1 else None


def export_files(loaded: LoadedStudy, folder: Path) -> dict[str, str]:
    """The exported files' text by path relative to the export folder.

    Args:
        loaded: the study, validated (spaces.study.load_study).
        folder: where the files will live (the commands name them there).
    Returns:
        {"experts/NAME.yaml": text, "searches/NAME.yaml": text, "commands.sh": text}.
    """
    files: dict[str, str] = {}
    cmds = [
        "#!/usr/bin/env bash",
        f"# The study {loaded.study.name} ({loaded.path}), exported by `layerswap plan --export`.",
        *(f"# {line}" for line in HEADER.splitlines()),
        "set -euo pipefail",
        "",
    ]
    for ex in loaded.experts:
        rel = f"experts/{ex.experiment.name}.yaml"
        out = _expert_out(ex, loaded.searches)
        where = f" --out {shlex.quote(str(out))}" if out is not None else ""
        note = "" if out is not None or ex.experiment.sweep is None else "  # a sweep: add --out RUN, the run folder whose registry your search reads"  # fmt: skip
        cmd = f"layerswap train {shlex.quote(str(folder / rel))}{where} --continue"
        # Inputs named from the working folder made absolute, as a search's are on loading
        # (resolve_paths against the cwd): the file then trains from any folder
        data = resolve_input_paths(ex.experiment.model_dump(mode="json", exclude_defaults=True), Path.cwd())  # fmt: skip
        files[rel] = _yaml(data, f"{ex.label} of the study {loaded.path}: {ex.config} with the study's overrides and sweep.\nRun: {cmd}")  # fmt: skip
        cmds.append(cmd + note)
    cmds.append("")
    taken: set[str] = set()
    for s in loaded.searches:
        stem, n = s.experiment.name, 1
        while stem in taken:  # two searches of one name: each its own file and run folder
            n += 1
            stem = f"{s.experiment.name}_{n}"
        taken.add(stem)
        rel = f"searches/{stem}.yaml"
        data = s.experiment.model_dump(mode="json", exclude_defaults=True)
        cmd = f"layerswap search {shlex.quote(str(folder / rel))} --out runs/{shlex.quote(stem)} --continue"  # fmt: skip
        files[rel] = _yaml(data, f"{s.label} of the study {loaded.path}.\nRun: {cmd}")
        cmds.append(cmd)
        cmds.append(f"layerswap analyze runs/{shlex.quote(stem)} --continue")
    files["commands.sh"] = "\n".join(cmds) + "\n"
    return files
