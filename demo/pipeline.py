"""`layerswap demo --out DIR`: the whole pipeline on the embedded world, on CPU, in minutes.

Builds the world, trains an English-math expert and an xa language expert with Ray Train (the
shipped example configs), scores them on their merging indicators into the expert registry,
runs the Ray Tune + Optuna merge search on the proxies' dev splits, promotes the best recipes
to the full lm-eval evaluation beside the baselines, and writes the leaderboard and best model.
Prints one "[demo] stage k/5: ..." line per stage, the search's "[search] trial k/N ..." lines and
promotion's per-model lines; Ray's, Tune's and Optuna's notices and lm-eval's own bars and log
only with `verbose` (`--verbose`).
Run `layerswap demo --world-size tiny --trials 3 --out runs/demo-tiny` (a few minutes on CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import ray
import yaml

from layerswap.experts.registry import append_rows, expert_row, read_rows, registry_path
from layerswap.search.progress import Stages, duration
from layerswap.search.promote import promote
from layerswap.search.search import lost_line, run_search
from layerswap.spaces.errors import RunFailed
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.task_families import family
from layerswap.spaces.train_experiment import experiment_json, parse_train_experiment
from layerswap.trainables.evaluate.indicators import IndicatorScorer, load_tokenizer
from layerswap.trainables.evaluate.lm_eval_api import lm_eval_output, offline_defaults
from layerswap.trainables.evaluate.tasks import write_world_tasks
from layerswap.trainables.outputs import (
    OutputError,
    check_output,
    read_marker,
    replacing,
    write_marker,
    writing,
)
from layerswap.trainables.ray_session import init_ray
from layerswap.trainables.train import find_checkpoints, read_manifest
from layerswap.trainables.train.run import train_expert
from layerswap.world import build_world
from layerswap.world.build import MANIFEST, verify_world

LANGUAGE = "xa"  # the world's higher-resource synthetic target language
EXAMPLES = {"math": "world_math_full.yaml", "language": f"world_lang_{LANGUAGE}_full.yaml"}
# the merging indicators of both kinds of expert (the follow-up paper's): English MGSM, target Belebele
INDICATORS = (
    family("mgsm").world_task("en", "dev"),
    family("belebele").world_task(LANGUAGE, "dev"),
)


@dataclass
class DemoSettings:
    """Knobs of the demo; the defaults fit 2 shared CPU cores in 4-8 minutes (4 min 14 s to 7 min 56 s measured)."""

    world_size: str = "full"
    seed: int = 0
    train_steps: int | None = None  # None: the example configs' own max_steps
    trials: int = 16
    proxy_limit: int | None = None  # dev items per proxy during the search (None: all 100)
    promote_top_k: int = 3
    promote_limit: int | None = None  # test items per task in promotion (None: all, 250 for MGSM)
    max_gen_toks: int = 24  # a worked answer and "The answer is 12" end near token 20
    # Rows per forward pass when scoring the experts' indicators: "auto" (16 on a CPU, 64 on a
    # GPU), as the search's proxies. At 1 a checkpoint took 13 s on 2 cores and 45 s on an H100
    # machine's GPU (1.8 s / 1.2 s at auto), and every checkpoint of both shipped seeds reads the
    # same at either (benchmarks/logs/world_v4/gpu_h100/README.md).
    indicator_batch_size: int | str = "auto"


@dataclass
class DemoResult:
    run_dir: Path
    leaderboard: Path
    best_dir: Path | None
    experts: dict[str, Path]
    seconds: dict[str, float] = field(default_factory=dict)


def example_experiment(kind: str, world: Path, run_dir: Path, steps: int | None):
    """The shipped example training config for `kind`, pointed at `world` and `run_dir`.

    Args:
        kind: "math" or "language".
        world: the embedded world folder (base/, data/).
        run_dir: RUN; checkpoints go to RUN/train/<name>/.
        steps: override of hyper.max_steps (None keeps the example's).
    Returns:
        the validated spaces.train_experiment.TrainExperiment.
    """

    name = EXAMPLES[kind]
    text = (resources.files("layerswap.spaces") / "examples" / name).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    # The examples name the world as runs/world (their documented build location).
    data["base"] = str((world / "base").resolve())
    for ds in data["datasets"]:
        ds["path"] = str((world / Path(ds["path"]).relative_to("runs/world")).resolve())
    data["storage_path"] = str((run_dir / "train").resolve())
    if steps is not None:
        data["hyper"]["max_steps"] = steps
        samples = steps * data["hyper"]["batch_size"]
        data["checkpoint_every_samples"] = max(1, samples // 2)  # a mid-run and a final one
    return parse_train_experiment(data, source=f"spaces/examples/{name}")


def indicator_scorer(world: Path, tasks_dir: Path, st: DemoSettings, device: str = "auto"):
    """The demo's scorer of INDICATORS on the world's dev splits, as `st` sets it up.

    Args:
        world: the world folder (its base's tokenizer).
        tasks_dir: where the world's task YAMLs were written (`write_world_tasks`).
        st: the demo's settings (items, generation budget, batch size).
        device: "auto", "cpu" or "cuda".
    Returns:
        a trainables.evaluate.indicators.IndicatorScorer.
    """

    return IndicatorScorer(list(INDICATORS), load_tokenizer(world / "base"), include_path=str(tasks_dir), limit=st.proxy_limit, max_gen_toks=st.max_gen_toks, batch_size=st.indicator_batch_size, device=device)  # fmt: skip


def _score_experts(run_dir: Path, world: Path, trained: dict, st: DemoSettings, stages: Stages) -> None:  # fmt: skip
    """Score each expert's checkpoints on both kinds' indicators -> RUN/experts/registry.parquet."""

    tasks_dir = run_dir / "experts" / "tasks"
    write_world_tasks(world, tasks_dir)
    scorer = indicator_scorer(world, tasks_dir, st)
    base = scorer.score_checkpoint(world / "base").scores
    stages.note("base          " + "  ".join(f"{t} {base[t]:.3f}" for t in INDICATORS))
    rows = []
    for kind, (exp, run, _) in trained.items():
        for ck in find_checkpoints(run):
            s = scorer.score_checkpoint(ck)
            man = read_manifest(ck)
            rows.append(expert_row(experiment_json(exp), ck, man, exp.name, s.columns()))
            stages.note(
                f"{kind:<8} step {man['step']:>4}  "
                + "  ".join(f"{t} {s.scores[t]:.3f}" for t in INDICATORS)
            )
    append_rows(registry_path(run_dir), rows)


def run_demo(out: Path, *, overwrite: bool = False, resume: bool = False, settings: DemoSettings | None = None, verbose: bool = False) -> DemoResult:  # fmt: skip
    """Run the pipeline into `out` (reuses a finished world under out/world).

    Args:
        out: the run folder (RUN of the run-directory layout).
        overwrite: replace an existing run (the world is kept; it is cached by seed and size).
        resume: continue an interrupted run in `out`: finished stages are kept (trained experts,
            their registry rows, finished search trials), unfinished ones go on from where they
            stopped (training from its last checkpoint, the search from its table).
        settings: sizes and budgets (DemoSettings()).
        verbose: also Ray's, Tune's and Optuna's notices and lm-eval's progress bars and INFO
            log (off: the demo's own lines only).
    Returns:
        DemoResult with the leaderboard, the best model and the wall time per stage.
    """

    offline_defaults()
    # lm-eval's warnings (e.g. about loading its tasks) would bury the demo's own lines; each
    # evaluation sets the same again (harness.evaluate).
    lm_eval_output(verbose)
    st = settings or DemoSettings()
    out = Path(out).resolve()
    replace = _check_previous_run(out, overwrite, resume, _identity(st))
    # one writer per demo run: a second demo into it (or a --resume of it) is refused, naming it
    with writing(out), replacing([out] if replace else []) as aside:
        out.mkdir(parents=True, exist_ok=True)
        write_marker(out, "demo", _identity(st))
        if out in aside:
            _reuse_world(aside[out] / "world", out / "world", st)
        return _run_stages(out, st, verbose, resume)


def _identity(st: DemoSettings) -> str:
    """What makes two demo runs the same run (its marker): the world's seed and size."""
    return f"seed={st.seed} size={st.world_size}"


def _run_stages(out: Path, st: DemoSettings, verbose: bool, resume: bool) -> DemoResult:
    """World, experts, indicators, search and promotion into the run folder `out`."""

    stages = Stages("demo", 5)
    stages.start("world", f"world ({st.world_size}, seed {st.seed}) -> {out / 'world'}")
    # The run owns its world: one of another seed or size is replaced.
    world = build_world(out / "world", seed=st.seed, size=st.world_size, overwrite=True, progress=True)  # fmt: skip

    exps = {k: example_experiment(k, world, out, st.train_steps) for k in ("math", "language")}
    stages.start(
        "train",
        "Ray Train, both at once: "
        + ", ".join(f"{k} expert {e.name} ({e.hyper.max_steps} steps)" for k, e in exps.items()),
    )
    started_ray = not ray.is_initialized()
    if started_ray:
        init_ray(verbose=verbose, include_dashboard=False, log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        trained = _train_experts(exps, out)

        stages.start(
            "indicators",
            "merging indicators of the experts (dev splits) -> experts/registry.parquet",
        )
        if resume and _scored(out, trained):
            stages.note("every checkpoint is in experts/registry.parquet already: kept")
        else:
            _score_experts(out, world, trained, st, stages)

        exp = _search_experiment(world, out, st)
        stages.start(
            "search", f"merge search: {st.trials} trials, Ray Tune + Optuna (TPE), dev splits"
        )
        searched = run_search(exp, out, resume=resume, verbose=verbose)
    finally:
        if started_ray:
            ray.shutdown()

    stages.start(
        "promotion",
        f"promotion: top {st.promote_top_k} recipes + baselines, lm-eval on test splits",
    )
    prom = promote(exp, out, verbose=verbose)
    seconds = stages.end()
    _print_summary(out, Path(prom.leaderboard), seconds)
    if searched.lost:  # as `layerswap search`: promoted, but unfinished (--resume runs them)
        raise RunFailed(lost_line(searched.lost))
    return DemoResult(
        out,
        Path(prom.leaderboard),
        Path(prom.best_dir) if prom.best_dir else None,
        {k: checkpoint for k, (_, _, checkpoint) in trained.items()},
        seconds,
    )


STAGES = ("train", "experts", "search", "promotion", "leaderboard.md", "best")


def _check_previous_run(out: Path, overwrite: bool, resume: bool, identity: str) -> bool:
    """Whether `out` holds a demo run to replace; refuse one without `overwrite` or `resume`.

    A folder with only a world in it (an earlier demo stopped after stage 1/5) is continued.
    `resume` on a missing or empty `out` starts a new run, saying so on stderr.
    Raises:
        OutputError: a run exists and neither flag says what to do, both flags are given, or
            `resume` meets a run of another world seed or size.
    """

    if overwrite and resume:
        raise OutputError("--resume and --overwrite: give one (continue the run, or start over)")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        check_output(out, "demo", allow_existing=True)  # a parent that is a file, not writable
        if resume:  # as `search --resume`: start one, but say so before the minutes of work
            print(f"layerswap: {out}: no demo run to resume; starting a new one", file=sys.stderr)
        return False
    check_output(out, "demo", overwrite=True)  # a demo run of layerswap's, or refuse
    if resume:
        theirs = (read_marker(out) or {}).get("identity")
        if theirs != identity:
            raise OutputError(
                f"{out}: --resume, but this demo run has {theirs} and you asked for {identity}; "
                "give the same --seed and --world-size, or --overwrite to start over"
            )
        return False
    if not any((out / s).exists() for s in STAGES):
        return False
    if not overwrite:
        raise OutputError(
            f"{out}: a demo run exists; pass --resume to continue it or --overwrite to replace it"
        )
    return True


def _reuse_world(old: Path, new: Path, st: DemoSettings) -> None:
    """Hard-link the replaced run's world into the new run when it is the one asked for."""

    try:
        m = json.loads((old / MANIFEST).read_text())
    except (OSError, ValueError):
        return
    if (m.get("seed"), m.get("size")) != (st.seed, st.world_size) or verify_world(old):
        return  # build_world makes the right one; the old stays with the old run

    def link(src, dst):
        try:
            os.link(src, dst)  # world files are never written in place: sharing is safe
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(old, new, copy_function=link)


def _train_experts(exps: dict, out: Path) -> dict:
    """Train the math and the language expert with Ray Train, both at once.

    A run folder this demo already holds is continued: a finished expert is kept as it is, an
    unfinished one resumes from its last checkpoint (trainables.train.run.train_expert).

    Args:
        exps: kind -> its TrainExperiment (`example_experiment`).
        out: RUN; each expert trains into RUN/train/<name>/.
    Returns:
        kind -> (its TrainExperiment, its run folder, its last checkpoint); raises if either
        run failed.
    """

    # The two experts are independent runs: each TorchTrainer is driven from its own Ray
    # task (a driver needs no CPU of its own), so both train at once on a 2-core machine.
    fit = ray.remote(num_cpus=0, max_retries=0)(train_expert)
    runs = {k: Path(e.storage_path) / e.name for k, e in exps.items()}
    futures = {
        k: fit.remote(e, e.storage_path, resume=runs[k].is_dir() and any(runs[k].iterdir()))
        for k, e in exps.items()
    }
    trained = {}
    for kind, fut in futures.items():
        checkpoint = ray.get(fut)  # train_expert raises when the run failed for good
        if checkpoint is None:
            raise RuntimeError(f"training {exps[kind].name} wrote no checkpoint")
        trained[kind] = (exps[kind], runs[kind], Path(checkpoint))
    return trained


def _scored(out: Path, trained: dict) -> bool:
    """Whether the registry holds a row for every checkpoint of the trained experts."""

    have = {str(Path(r["path"]).resolve()) for r in read_rows(registry_path(out))}
    want = {str(c.resolve()) for _, run, _ in trained.values() for c in find_checkpoints(run)}
    return bool(want) and want <= have


def _search_experiment(world: Path, out: Path, st: DemoSettings):
    """The demo's merge-search experiment: the registry's best expert of each kind, on `world`.

    Returns:
        the validated spaces.search_experiment.SearchExperiment.
    """

    return SearchExperiment.model_validate(
        {
            "name": "demo",
            "language": LANGUAGE,
            "base": str(world / "base"),
            "experts": {"registry": str(out / "experts" / "registry.parquet"), "top_k": 1},
            "world": str(world),
            "proxy_eval": {"limit": st.proxy_limit, "max_gen_toks": st.max_gen_toks},
            "search": {"num_samples": st.trials, "seed": st.seed},
            "promote": {
                "top_k": st.promote_top_k,
                "limit": st.promote_limit,
                "max_gen_toks": st.max_gen_toks,
            },
        }
    )


def _print_summary(out: Path, leaderboard: Path, seconds: dict[str, float]) -> None:
    """The leaderboard, the wall time per stage and the next command."""
    print()
    print(leaderboard.read_text(encoding="utf-8"))
    total = duration(sum(seconds.values()))
    print(f"[demo] done in {total}: " + ", ".join(f"{k} {duration(v)}" for k, v in seconds.items()))
    print(f"next: layerswap analyze {out}")
