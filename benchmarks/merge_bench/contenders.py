"""The merge benchmark's contenders (copy, merge, engine, mergekit, compose, roundtrip, startup;
benchmarks/bench_merge.py's docstring says what each measures) and the repeats that run them in
an order rotated per repeat, with the launcher that measures a command's wall time and peak RSS.

Used by benchmarks/bench_merge.py (and `run_child` by benchmarks/bench_delta.py); not run on its
own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from layerswap.trainables.merge.compose import compose_recipe
from layerswap.trainables.merge.engine import merge_to_disk

from .compare import compare_outputs, summary_line

REPO = Path(__file__).resolve().parents[2]  # the commands run from the repository root
# In table order: the report lists the contenders in this order.
NAMES = ("copy", "merge", "engine", "mergekit", "compose", "roundtrip", "startup")
MEASURES_RSS = ("merge", "mergekit", "startup")  # the ones run as a child process

# A minimal interpreter between us and the measured command. ru_maxrss of a child includes the
# high-water RSS of the address space it was forked from (Linux records the old mm's peak at
# exec), so a child forked from this process, which holds the experts' state dicts, would report
# at least our RSS. Forked from this launcher (stdlib only, ~10 MB), it reports its own peak.
_LAUNCHER = """
import json, os, sys, time
res, cmd = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
pid = os.posix_spawn(cmd[0], cmd, os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - t0
code = os.waitstatus_to_exitcode(status)
with open(res, "w") as f:
    json.dump({"wall": wall, "maxrss_kib": usage.ru_maxrss, "code": code}, f)
"""


def run_child(cmd: list[str], log: Path) -> tuple[float, float]:
    """Run a command; returns (wall seconds, peak RSS MiB of the command's process).

    Both are measured by a small launcher process around posix_spawn + os.wait4.
    """
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    res = log.with_suffix(".rusage.json")
    launcher = [sys.executable, "-S", "-c", _LAUNCHER, str(res), *map(str, cmd)]
    with open(log, "wb") as out:
        subprocess.run(
            launcher, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, check=True
        )
    info = json.loads(res.read_text())
    if info["code"] != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{cmd[0]} exited with {info['code']}; log {log}:\n{tail}")
    return info["wall"], info["maxrss_kib"] / 1024  # ru_maxrss is in KiB on Linux


def remove(path: Path) -> None:
    """Delete an output folder, then sync (untimed)."""
    shutil.rmtree(path, ignore_errors=True)
    os.sync()  # untimed: the next contender starts with no pending writeback


def load_dir(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of every safetensors shard in `path`."""
    state: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(f))
    return state


def commands(layerswap_bin: Path, mergekit_bin: Path, recipe: Path, mk_config: Path) -> dict:
    """The child processes' command lines ("OUT" stands for the output folder of a repeat).

    Returns:
        {"merge": layerswap merge, "mergekit": mergekit-yaml, "startup": import-only python}.
    """
    return {
        "merge": [str(layerswap_bin), "merge", str(recipe), "--out", "OUT", "-q"],
        "mergekit": [
            str(mergekit_bin),
            str(mk_config),
            "OUT",
            "--no-cuda",
            "--device",
            "cpu",
            "--no-copy-tokenizer",  # the random experts carry no tokenizer
            "--quiet",
        ],
        "startup": [
            sys.executable,
            "-c",
            "import layerswap.cli, layerswap.trainables.merge.engine",
        ],
    }


@dataclass
class Contenders:
    """Every contender of one run, and what they measured: per-repeat seconds (`times`) and peak
    RSS of the child processes (`rss`); repeat 0's outputs are kept for the equality checks,
    whose results land in `checks`."""

    run_dir: Path
    experts: dict[str, Path]
    recipe: object
    sources: dict  # expert path -> its state dict, loaded beforehand (compose's input)
    depth: int
    cmds: dict[str, list[str]]
    times: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in NAMES})
    rss: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in MEASURES_RSS})
    keep: dict = field(default_factory=dict)  # repeat 0: outputs kept for the equality checks
    checks: dict = field(default_factory=dict)

    def copy(self, r: int) -> None:
        out = self.run_dir / f"copy-{r}"
        t = time.perf_counter()
        shutil.copytree(self.experts["task"], out)
        self.times["copy"].append(time.perf_counter() - t)
        remove(out)

    def _child(self, name: str, r: int) -> None:
        """merge or mergekit: its command as a child process, output kept on repeat 0."""
        out = self.run_dir / f"{name}-{r}"
        cmd = [str(out) if a == "OUT" else a for a in self.cmds[name]]
        wall, peak = run_child(cmd, self.run_dir / f"{name}.log")
        self.times[name].append(wall)
        self.rss[name].append(peak)
        if r == 0:
            self.keep[name] = out
            os.sync()
        else:
            remove(out)

    def merge(self, r: int) -> None:
        self._child("merge", r)

    def mergekit(self, r: int) -> None:
        self._child("mergekit", r)

    def compose(self, r: int) -> None:
        t = time.perf_counter()
        merged = compose_recipe(self.recipe, self.sources, self.depth)
        self.times["compose"].append(time.perf_counter() - t)
        if r == 0:
            self.keep["compose"] = merged
        del merged

    def engine(self, r: int) -> None:
        out = self.run_dir / f"engine-{r}"
        t = time.perf_counter()
        merge_to_disk(self.recipe, out)
        self.times["engine"].append(time.perf_counter() - t)
        remove(out)

    def roundtrip(self, r: int) -> None:
        out = self.run_dir / f"roundtrip-{r}"
        t = time.perf_counter()
        merge_to_disk(self.recipe, out)
        state = load_dir(out)
        self.times["roundtrip"].append(time.perf_counter() - t)
        if r == 0:
            self.checks["roundtrip_state"] = state
        del state
        remove(out)

    def startup(self, r: int) -> None:
        wall, peak = run_child(self.cmds["startup"], self.run_dir / "startup.log")
        self.times["startup"].append(wall)
        self.rss["startup"].append(peak)

    def order(self, r: int) -> list[tuple[str, Callable[[int], None]]]:
        """Repeat r's contenders: NAMES rotated by r, so none always runs first."""
        ordered = [(name, getattr(self, name)) for name in NAMES]
        return ordered[r % len(ordered) :] + ordered[: r % len(ordered)]

    def check_outputs(self, assembly: dict) -> None:
        """After repeat 0: mergekit's output against ours, and compose against the disk round
        trip (bit for bit); prints both and frees the kept outputs."""
        self.checks["mergekit_vs_ours"] = compare_outputs(
            self.keep["merge"], self.keep["mergekit"], assembly
        )
        remove(self.keep.pop("merge"))
        remove(self.keep.pop("mergekit"))
        composed = self.keep.pop("compose")
        from_disk = self.checks.pop("roundtrip_state")
        self.checks["compose_vs_disk_equal"] = sorted(composed) == sorted(from_disk) and all(
            torch.equal(composed[k], from_disk[k]) for k in composed
        )
        del composed, from_disk
        print(f"mergekit vs layerswap: {summary_line(self.checks['mergekit_vs_ours'])}")
        print(f"compose == disk round trip, bit for bit: {self.checks['compose_vs_disk_equal']}")

    def run(self, repeats: int, assembly: dict) -> None:
        """Every contender once per repeat, printing each time; the outputs checked after the
        first repeat."""
        os.sync()
        for r in range(repeats):
            for name, fn in self.order(r):
                fn(r)
                last = self.times[name][-1]
                extra = f", peak RSS {self.rss[name][-1]:.0f} MiB" if name in self.rss else ""
                print(f"repeat {r + 1}/{repeats} {name:<9} {last:8.2f} s{extra}", flush=True)
            if r == 0:
                self.check_outputs(assembly)
