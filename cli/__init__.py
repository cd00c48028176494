"""The `layerswap` command line: a root parser and one thin module per subcommand.

Each subcommand module (`merge`, `train`, `plan`, `search`, `eval`, `analyze`, `world`, `demo`,
`schema`) adds its parser and a handler that validates input once and calls a plain function of the library.
Modules import only light things at load time (argparse, the pydantic configs), so `layerswap
--help` stays fast; torch, ray, lm-eval, optuna and pandas load when a command runs (tested). Run `layerswap --help`.
"""

from __future__ import annotations

# First, before any heavy import: in the `layerswap` process this installs the start-up signal
# handler (a Ctrl-C from here on is one line and exit 130; cli/startup.py says why).
from layerswap.cli import startup

# isort: split
import argparse
import importlib
import os
import signal
import sys

from pydantic import ValidationError

from layerswap.cli import continue_hint, interrupts
from layerswap.cli.interrupts import SIGNALLED, Terminated
from layerswap.cli.watchdog import EXIT, Watchdog
from layerswap.spaces import reference  # noqa: F401  (registers the wrong-kind message)
from layerswap.spaces.errors import RunFailed
from layerswap.trainables.atomic import write_failure
from layerswap.trainables.locks import COMMAND_ENV, own_command_line

# Order is the order `layerswap --help` lists them in.
SUBCOMMANDS = (
    "merge",
    "world",
    "eval",
    "search",
    "train",
    "plan",
    "prefetch",
    "analyze",
    "demo",
    "schema",
)


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every subcommand registered."""
    p = argparse.ArgumentParser(
        prog="layerswap",
        description="Cross-lingual transfer by layer swapping: merge a task (math) expert and a "
        "language expert fine-tuned from one base model.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"layerswap.cli.{name}").add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the command; invalid input exits 2 with one line naming the problem.

    SIGINT exits 130 and SIGTERM 143, without a traceback; what was half-written is removed by
    the atomic writers on the way out; the line says how the command continues (continue_hint).
    """
    args = build_parser().parse_args(argv)
    continue_hint.set_command(args.command, [k for k, v in vars(args).items() if v is True])
    if getattr(args, "verbose", None) is False:  # search, demo, train without --verbose
        quiet_progress_bars()
    if startup.starting() and _uses_torch(args):
        startup.preload_torch()  # while a signal still ends the process at once (startup.py)
    # Markers and locks written by this command's Ray workers and children name it (locks.py).
    os.environ[COMMAND_ENV] = own_command_line(argv)
    interrupts.begin()
    before = {s: signal.signal(s, interrupts.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    unraisable = sys.unraisablehook
    sys.unraisablehook = interrupts.unraisable_hook(unraisable)
    # Ray Tune's own SIGINT handler ends the tuning loop and returns as if it had finished (the
    # command would go on to promotion and exit 0); without it Ctrl-C raises KeyboardInterrupt
    # here. Ray Train's is kept out while fit() runs (trainables/train/ray_fit.py).
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        code = _run_command(args)
        if SIGNALLED:
            # A library swallowed the interrupt and the command went on to the end (seen: a
            # KeyboardInterrupt raised in an isinstance check that C code reports as ignored).
            # The signal still decides the exit code, so `layerswap ... && next` stops.
            raise KeyboardInterrupt
        return code
    except BaseException as e:
        return _outcome(e)
    finally:
        for s, handler in before.items():
            # The start-up handler's time is over: what is left is the exit, where run()
            # ignores signals (its "while starting" line would be wrong now).
            signal.signal(s, signal.SIG_IGN if startup.is_startup(handler) else handler)
        sys.unraisablehook = unraisable


def quiet_progress_bars() -> None:
    """Hold back `datasets`' "Generating ... split" and transformers' "Loading weights" bars (a
    command's default output is layerswap's own lines; --verbose keeps them). Hub download bars
    stay: a model download can take minutes. A user's HF_DATASETS_DISABLE_PROGRESS_BARS wins.
    """
    # datasets reads it at import (datasets.config); the switch covers an import already made.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1" and "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    # lazy: transformers' logging module (0.5 s measured after torch), loaded only by the
    # commands that load models anyway; its bar switch has no environment variable of its own
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    hub_off = are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # Hub's bars too: turned back on below
    if not hub_off:
        enable_progress_bars()


def _run_command(args: argparse.Namespace) -> int:
    """The command's function; a signal re-sent after it ended is dropped (cli/interrupts.py)."""
    try:
        return args.func(args)
    finally:
        # A re-sent signal landing before this line raises here, inside main's try: its
        # outcome is the signal's, like any other.
        interrupts.ended()


# Commands that never import torch: loading it up front would only slow them down.
_NO_TORCH = {"schema", "plan"}


def _uses_torch(args: argparse.Namespace) -> bool:
    """Whether the parsed command imports torch (`world export-base` copies files only)."""
    if args.command == "world":
        return getattr(args, "world_command", None) == "build"
    return args.command not in _NO_TORCH


def _outcome(e: BaseException) -> int:
    """The exit code of a command that raised `e`; re-raises what is not the user's doing."""
    e = _ray_cause(e)
    # A signal decides, whatever it became on its way out: a library may swallow the
    # KeyboardInterrupt and fail later with an unrelated error.
    if SIGNALLED or isinstance(e, (KeyboardInterrupt, Terminated)):
        sigterm = (SIGNALLED[:1] or [None])[0] == signal.SIGTERM or isinstance(e, Terminated)
        return _interrupted(signal.SIGTERM if sigterm else signal.SIGINT)
    if isinstance(e, SystemExit) and e.code == signal.SIGTERM:
        # Ray's driver SIGTERM handler, sys.exit(SIGTERM), if one landed while ray.init ran
        return _interrupted(signal.SIGTERM)
    if (failed := write_failure(e)) is not None:  # a full disk, a read-only mount: one line
        print(f"layerswap: failed: {failed}", file=sys.stderr)
        return 1
    if isinstance(e, (ValueError, ValidationError, FileExistsError, FileNotFoundError, OSError)):
        print(f"layerswap: error: {e}", file=sys.stderr)
        return 2
    if isinstance(e, RunFailed):
        print(f"layerswap: failed: {e}", file=sys.stderr)
        return 1
    raise e


def _ray_cause(e: BaseException) -> BaseException:
    """The error a Ray task raised, for one whose error `ray.get` re-raised as RayTaskError.

    Ray's RayTaskError(Cause) is a subclass of the cause whose message is the remote traceback
    (ANSI-coloured), so a bad input found inside a task (a training run of another experiment,
    in the demo) printed that instead of one line. Told by name, not by import: this module
    loads before Ray, and most commands never load it.
    """
    cause = getattr(e, "cause", None)
    if type(e).__name__.startswith("RayTaskError") and isinstance(cause, BaseException):
        return cause
    return e


def _interrupted(sig: int) -> int:
    name, code = EXIT[sig]
    # Ray's C++ failure handler arms alarm(3) on SIGTERM to abort the process (exit -6).
    signal.alarm(0)
    # CPython marks an interrupt that passed through code compiled from strings (dataclasses
    # while torch imports) as unhandled and re-kills the process with SIGINT at exit (-2);
    # running any exec() resets that flag.
    exec("")
    print(
        f"layerswap: interrupted ({name}); nothing half-written was kept{continue_hint.hint()}",
        file=sys.stderr,
    )
    return code


def run() -> None:
    """The console script: `main`, then exit; a signal during Ray's shutdown at exit (after
    the outcome is decided) is ignored rather than printed as a traceback. A signalled command
    ends within the watchdog's deadline, its exit (Ray's shutdown at exit) included."""
    startup.install()  # already, when this process was started as the command
    watchdog = Watchdog()  # never closed: its deadline covers the exit too
    code = main()
    watchdog.command_ended()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    sys.exit(code)
