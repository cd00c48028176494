"""`layerswap search EXPERIMENT.yaml [--out RUN] [--resume | --continue] [--no-promote]`: the merge
search.

Thin: validates the search experiment, then calls search.search.run_search and
search.promote.promote (ray, optuna and torch load only when the command runs). Prints one
"[search] trial k/N ..." line per finished trial (best so far, elapsed, ETA) and one line per
promoted model; `--verbose` adds Ray's, Tune's and Optuna's own notices (Tune's configuration box,
Ray's token notice) and lm-eval's progress bars and INFO log during promotion.

`--continue` is `--resume` that also skips a finished search: a command that ends well records
in RUN/search/FINISHED the experiment it ran and whether it promoted, and `--continue` of that
very experiment says so and does nothing (what a study's exported commands.sh passes). The
record goes before any later search there starts, so it never outlives a change to the run.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

from layerswap.cli.args import continue_clash
from layerswap.search.preflight_device import cpu_size_problems  # light: 0.1 s, transformers lazily
from layerswap.spaces.errors import RunFailed
from layerswap.spaces.search_experiment import load_search_experiment
from layerswap.trainables.atomic import atomic_write_text
from layerswap.trainables.devices import resolve_device  # light: torch loads when it runs
from layerswap.trainables.output_checks import writable_inside
from layerswap.trainables.outputs import output_problems, replacing, sibling_problems, writing

FINISHED = "finished.json"  # in RUN/search: the experiment the last command there ran to its end


def _cmd_search(args: argparse.Namespace) -> int:
    """Validate the experiment and everything it names, run (or resume) the search, promote."""
    from contextlib import nullcontext

    exp = load_search_experiment(args.experiment)
    run_dir = Path(args.out) if args.out is not None else Path("runs") / exp.name
    _check(exp, run_dir, args)
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.search.search import lost_line, run_search, search_outputs

    ran = {"experiment": json.loads(exp.explicit().model_dump_json()), "promoted": not args.no_promote}  # fmt: skip
    record = run_dir / "search" / FINISHED
    finished = args.cont and _finished(record, ran)
    if not finished:  # a finished search reads no task data and writes nothing into RUN/search
        if not args.overwrite and (problem := writable_inside(run_dir / "search")) is not None:
            raise ValueError(problem)  # a search it continues writes inside (--overwrite: beside)
        _check_data(exp, args)
    # One writer per search: a second search or a --resume of this one is refused, naming it
    with writing(run_dir / "search"), replacing(search_outputs(run_dir)) if args.overwrite else nullcontext():  # fmt: skip
        if finished:
            print(f"{run_dir}: this search is already finished{' and promoted' if ran['promoted'] else ''}; nothing to do")  # fmt: skip
            return 0
        # The run changes once run_search's checks pass: unfinished from then until the end (a
        # refused --resume, e.g. of a changed seed, leaves a finished search finished).
        unmark = partial(record.unlink, missing_ok=True) if args.resume or args.cont else None
        res = run_search(exp, run_dir, resume=args.resume or args.cont, verbose=args.verbose, before_writing=unmark)  # fmt: skip
        print(f"[search] {res.n_trials} trial(s) in {res.trials_path}; study {res.study_path}")
        if not args.no_promote:
            # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
            from layerswap.search.promote import promote

            board = promote(exp, run_dir, verbose=args.verbose)
            print(f"promotion: leaderboard {board.leaderboard}; best model {board.best_dir}")
        if getattr(res, "lost", 0):  # not finished: --continue and --resume run them again
            raise RunFailed(lost_line(res.lost))
        if record.parent.is_dir():  # run_search made it (a stubbed one in tests may not)
            atomic_write_text(record, json.dumps(ran, indent=1) + "\n")
    return 0


def _finished(record: Path, ran: dict) -> bool:
    """Whether the last search command into the run ran this experiment to its end (with its
    promotion, when this one would promote)."""
    try:
        done = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(done, dict) or done.get("experiment") != ran["experiment"]:
        return False
    return bool(done.get("promoted")) or not ran["promoted"]


def _check(exp, run_dir: Path, args: argparse.Namespace) -> None:
    """Every problem with the experiment's inputs and the run folder, before Ray starts."""
    # lazy: the library (torch, Ray, lm-eval) loads when the command runs; --help stays fast
    from layerswap.search.preflight import check_search

    problems = check_search(exp)
    promote_device = None
    if not args.no_promote:
        # a promotion device that cannot run is refused before the search
        try:
            promote_device = resolve_device(exp.promote.device)
        except ValueError as e:
            problems.append(f"promote.device: {e}")
    # a model too large for the CPU its trials or promotion would run on: refused before any trial
    problems += cpu_size_problems(exp, promote_device)
    if args.resume and args.overwrite:
        problems.append("--resume and --overwrite: give one (continue the search, or start over)")
    if clash := continue_clash(args, "starts, resumes or skips the search as it stands"):
        problems.append(clash)
    inputs = _inputs(exp)
    problems += output_problems(
        run_dir / "search",
        "search",
        overwrite=args.overwrite,
        allow_existing=True,
        inputs=inputs,
        inside=False,  # a finished one writes nothing there: _cmd_search checks it once it knows
    )
    if args.overwrite or (not args.no_promote and exp.promote.write_best):
        # Promotion replaces RUN/best (a merged model) at its very end, --overwrite at once.
        problems += output_problems(run_dir / "best", "merge", overwrite=True, inputs=inputs)
    if args.overwrite or not args.no_promote:
        # --overwrite sets aside, and promotion rewrites, RUN/promotion, RUN/leaderboard.md and
        # RUN/best: only those a search there wrote (its marker claims them), never a user's.
        problems += sibling_problems(run_dir / "search")
    if problems:
        raise ValueError("\n  ".join(problems))


def _check_data(exp, args: argparse.Namespace) -> None:
    """Refuse task data missing from the offline cache (search/preflight_data.py), after the
    other checks: it loads lm-eval, and a config with other problems fails at once."""
    # lazy: search.promote and the task writer it reads by (0.38 s measured); lm-eval itself
    # loads only when the check runs
    from layerswap.search.preflight_data import uncached_problem

    if (problem := uncached_problem(exp, promote=not args.no_promote)) is not None:
        raise ValueError(problem)


def _inputs(exp) -> list[Path]:
    """The local folders and files the search reads (a Hub id is none)."""
    named = [*exp.task_experts, *exp.language_experts, *exp.include_path]
    named += [p for p in (exp.base, exp.world) if p is not None]
    if exp.experts is not None:
        named.append(exp.experts.registry)
    return [p for p in map(Path, named) if p.expanduser().exists()]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `search` subcommand to a `layerswap` subparsers object; returns its parser."""
    s = subparsers.add_parser(
        "search",
        help="search layer-swap recipes with Ray Tune + Optuna, then promote the best",
        description="Proxy-scored merge search (dev splits only), then full lm-eval evaluation "
        "of the top-k recipes and the baselines, with the target test split. Writes "
        "RUN/search/trials.parquet, RUN/search/study.db, RUN/promotion/, RUN/leaderboard.md "
        "and RUN/best/.",
    )
    s.add_argument("experiment", type=Path, help="search experiment YAML")
    s.add_argument("--out", type=Path, help="run folder (default: runs/<experiment name>)")
    s.add_argument("--resume", action="store_true", help="continue an interrupted search")
    s.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="as --resume (which also starts a search RUN does not hold), but a search whose "
        "last command ran this very experiment to its end (promotion included, unless "
        f"--no-promote) is skipped, saying so (exit 0): RUN/search/{FINISHED} records it. What a "
        "study's exported commands.sh passes",
    )
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="start the search over (the old one is kept until the new one finishes)",
    )
    s.add_argument("--no-promote", action="store_true", help="stop after the proxy search")
    s.add_argument(
        "--verbose",
        action="store_true",
        help="also Ray's, Tune's and Optuna's own notices in the search and lm-eval's "
        "per-request progress bars and INFO log in promotion (default: layerswap's own trial "
        "and model lines only)",
    )
    s.set_defaults(func=_cmd_search)
    return s
