"""The `layerswap` command line: a root parser and one thin module per subcommand.

Each subcommand module (`merge`, `train`, `search`, `eval`, `analyze`, `world`, `demo`) adds its
parser and a handler that validates input once and calls a plain function of the library.
Modules import only light things at load time (argparse, the pydantic configs), so `layerswap
--help` stays fast; torch, ray, lm-eval, optuna and pandas load when a command runs (tested). Run `layerswap --help`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from pydantic import ValidationError

# Order is the order `layerswap --help` lists them in.
SUBCOMMANDS = ("merge", "world", "eval", "search", "train", "analyze", "demo")


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every subcommand registered."""
    p = argparse.ArgumentParser(
        prog="layerswap",
        description="Cross-lingual transfer by layer swapping: merge a task (math) expert and a "
        "language expert fine-tuned from one base model.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"cli.{name}").add_parser(sub)
    return p


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so every `finally` and atomic writer cleans up."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the command; invalid input exits 2 with one line naming the problem.

    SIGINT exits 130 and SIGTERM 143, without a traceback; what was half-written is removed by
    the atomic writers on the way out, and `--resume` continues a train or search run.
    """
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Ray Tune's own SIGINT handler ends the tuning loop and returns as if it had finished (the
    # command would go on to promotion and exit 0); without it Ctrl-C raises KeyboardInterrupt
    # here. Ray Train's handler is kept out by running fit off the main thread (ray_train.py).
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        return args.func(args)
    except (ValueError, ValidationError, FileExistsError, FileNotFoundError, OSError) as e:
        print(f"layerswap: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted("SIGINT", 130)
    except Terminated:
        return _interrupted("SIGTERM", 143)
    except SystemExit as e:
        # ray.init replaces the SIGTERM handler of the driver with sys.exit(SIGTERM).
        if e.code == signal.SIGTERM:
            return _interrupted("SIGTERM", 143)
        raise


def _interrupted(name: str, code: int) -> int:
    print(
        f"layerswap: interrupted ({name}); nothing half-written was kept "
        "(train and search continue with --resume)",
        file=sys.stderr,
    )
    return code
