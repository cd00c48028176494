"""`layerswap prefetch CONFIG... [--dry-run]`: download every model, training dataset and lm-eval
task the configs need into the local Hugging Face caches before a study starts, so that Ray
workers read them instead of racing to download (or failing offline).

Thin: study.needs lists what the configs need (no network); trainables.prefetch downloads it.
Each download is reported; the command exits 1 when any failed, naming it. Run
`layerswap prefetch --help`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def _listing(needs) -> list[tuple[str, str, tuple]]:
    """(kind, label, fetch args) of every download, models first."""
    rows = [("model", m, (m,)) for m in sorted(needs.models)]
    rows += [("dataset", f"{s}" + (f" ({lang})" if lang else ""), (s, lang)) for s, lang in sorted(needs.datasets, key=str)]  # fmt: skip
    if needs.tasks:
        names = sorted(needs.tasks)
        rows.append(("lm-eval tasks", ", ".join(names), (names,)))
    return rows


def _cmd_prefetch(args: argparse.Namespace) -> int:
    # lazy: the library (torch, lm-eval) loads when the command runs; --help stays fast
    from layerswap.study.needs import needs_of

    needs = needs_of(args.configs)
    rows = _listing(needs)
    if not rows:
        print("prefetch: the configs need nothing from the Hub (local models, data and tasks)")
        return 0
    offline = [v for v in OFFLINE if os.environ.get(v, "0") not in ("0", "", "false", "False")]
    if offline and not args.dry_run:
        raise ValueError(f"{' and '.join(offline)} set: prefetch downloads; run it with {'=0 '.join(offline)}=0")  # fmt: skip
    for kind, label, _ in rows:
        print(f"{'would fetch' if args.dry_run else 'fetch'} {kind}: {label}", flush=True)
    if args.dry_run:
        return 0
    # lazy: as above; the downloaders import huggingface_hub, datasets and lm-eval
    from layerswap.trainables import prefetch

    fetch = {"model": prefetch.fetch_model, "dataset": prefetch.fetch_dataset, "lm-eval tasks": prefetch.fetch_tasks}  # fmt: skip
    failed = []
    for kind, label, fargs in rows:
        try:
            fetch[kind](*fargs)
            print(f"  done {kind}: {label}", flush=True)
        except Exception as e:  # one failed download must not hide the others' outcome
            failed.append(f"{kind} {label}: {type(e).__name__}: {e}")
            print(f"  FAILED {kind}: {label}: {type(e).__name__}: {e}", flush=True)
    if failed:
        print(f"layerswap: prefetch: {len(failed)} of {len(rows)} failed:\n  " + "\n  ".join(failed), file=sys.stderr)  # fmt: skip
        return 1
    print(f"prefetch: {len(rows)} download(s) in the cache ({os.environ.get('HF_HOME', '~/.cache/huggingface')})")  # fmt: skip
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `prefetch CONFIG... [--dry-run]`."""
    p = subparsers.add_parser(
        "prefetch",
        help="download the models, datasets and lm-eval tasks configs need, before a study",
        description="List (offline) and download every Hub model (safetensors, configs, "
        "tokenizers; no pickled weights), training dataset of the source table and lm-eval "
        "task a study, training or search config needs, into the local Hugging Face caches "
        "(HF_HOME / HF_HUB_CACHE / HF_DATASETS_CACHE). Run it once where the cache is shared "
        "(or on each node) before `layerswap train` / `search`, so Ray workers never race to "
        "download. Needs HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 (and HF_TOKEN for gated "
        "models such as Llama 3.1). Exits 1 naming every download that failed.",
    )
    p.add_argument("configs", type=Path, nargs="+", help="study, training or search YAMLs")
    p.add_argument("--dry-run", action="store_true", help="list what would be downloaded; fetch nothing")  # fmt: skip
    p.set_defaults(func=_cmd_prefetch)
    return p
