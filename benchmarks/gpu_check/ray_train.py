"""Stage 6 of the GPU check: `layerswap train` through Ray Train + FSDP2 (NCCL on a GPU), killed
like a lost node once its first sharded checkpoint is on disk, then resumed with `--resume`.

Everything is checked from outside the command, as a user would: the tiny world's base trained
with `scaling: {strategy: fsdp}` (and `use_gpu: true` on a GPU) in a process session of its own;
SIGKILL to the driver, Ray and its worker at once when RUN/train/<name>/samples_*
holds a checkpoint; the same command with `--resume` then runs to the end. The run's own step log
(debug.step_log: one row per step with the step it started from) says whether the step counter
continued from the checkpoint; the last checkpoint's model.safetensors must load; the worker's
c10d log line ("Using backend config: ...", TORCH_LOGS=c10d) names the process group's backends
and NCCL_DEBUG=INFO lines show whether an NCCL communicator was made.

Run: python benchmarks/gpu_check/run.py [--smoke] --stages ray_train --out DIR
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gpu_check.common import ROOT, write_text
from gpu_check.results import killed_run_part, ray_train_result

TITLE = "Ray Train + FSDP2 (+ NCCL) through layerswap train, killed and resumed"

NAME = "gpu_check_fsdp"
# 6 steps of 4 samples, a checkpoint every 2 steps (8 samples): the kill lands after the first.
# Each step sleeps STEP_DELAY_S (debug.step_delay_s) so the run is still going when the first
# checkpoint appears: the tiny model's own steps take milliseconds.
STEPS, BATCH, EVERY_SAMPLES, STEP_DELAY_S = 6, 4, 8, 0.5
BACKEND_LINE = re.compile(r"Using backend config: (\{[^}]*\})")
NCCL_INIT = re.compile(r"NCCL INFO .*Init COMPLETE")
LOG_TAIL = 20_000  # characters of each command's output kept in the run folder
START_S = (
    20.0  # `layerswap train` to its first step: Ray's start (18-20 s on CPU) and the model load
)


def experiment(world: Path, tmp: Path, gpu: bool) -> dict:
    """The training experiment: the tiny world's base, full weights, FSDP2 on one worker.

    Args:
        world: a built tiny world.
        tmp: the stage's scratch folder (the step log goes there).
        gpu: one GPU worker in bf16-mixed (else a CPU worker in the base's fp32).
    """
    cfg = {
        "name": NAME,
        "base": str(world / "base"),
        "kind": "math",
        "language": "en",
        "datasets": [{"path": str(world / "data/sft/math_en.jsonl")}],
        "mode": "full",
        "hyper": {
            "lr": 3e-3, "schedule": "constant_with_warmup", "warmup_steps": 1,
            "batch_size": BATCH, "max_steps": STEPS, "seq_len": 96,
        },
        "checkpoint_every_samples": EVERY_SAMPLES,
        "scaling": {"num_workers": 1, "use_gpu": gpu, "strategy": "fsdp"},
        "failure": {"max_failures": 0},
        "debug": {"step_log": str(tmp / "steps.jsonl"), "step_delay_s": STEP_DELAY_S},
    }  # fmt: skip
    if gpu:
        cfg["precision"] = "bf16-mixed"
    return cfg


# ------------------------------------------------------------------ reading what the run wrote


def read_step_log(text: str) -> list[dict]:
    """The rows of a debug.step_log file (one JSON object a line; a torn last line is dropped:
    the writer may have been killed mid-line)."""
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def resume_summary(before: list[dict], after: list[dict], total: int) -> dict:
    """What the step log says about a run killed once and resumed.

    Args:
        before: the step log's rows ({"step", "start", ...}) written by the killed attempt.
        after: those the resumed attempt appended.
        total: the run's step count.
    Returns:
        {"resumed_from": the step the resumed attempt started at (0: it started over; None: it
         logged no step), "last_before_kill": the last step the killed attempt logged,
         "redone": steps trained again (done before the kill, after the checkpoint),
         "continued": whether the resumed attempt's steps are exactly resumed_from+1 .. total
         (the counter went on, not restarted)}.
    """
    start = after[0]["start"] if after else None
    last = max((r["step"] for r in before), default=None)
    steps = [r["step"] for r in after]
    return {
        "resumed_from": start,
        "last_before_kill": last,
        "redone": None if start is None or last is None else max(0, last - start),
        "continued": start is not None and steps == list(range(start + 1, total + 1)),
    }


def backends_in_logs(text: str) -> tuple[dict | None, int]:
    """The process group's device -> backend map from torch's c10d log line, and the number of
    NCCL communicators initialised ("NCCL INFO ... Init COMPLETE", with NCCL_DEBUG=INFO).

    Ray forwards a worker's lines to the driver's output, so one line can be read twice (once
    with a "(RayTrainWorker pid=...)" prefix): communicators are counted by their distinct lines
    (each names its comm pointer and id).

    Returns:
        (e.g. {"cpu": "gloo", "cuda": "nccl"}, or None when no line says; count of NCCL inits).
    """
    m = BACKEND_LINE.search(text)
    found = ast.literal_eval(m.group(1)) if m else None
    return found, len(set(NCCL_INIT.findall(text)))


# ------------------------------------------------------------------ the command, from outside


def _checkpoints(run: Path) -> list[Path]:
    """Finished checkpoints (their manifest is written last, and the folder renamed in whole)."""
    return sorted(p.parent for p in run.glob("samples_*/layerswap_train.json"))


def processes() -> dict[int, tuple[int, bytes]]:
    """{pid: (session id, command line)} of the live processes (zombies left out: they are dead,
    only not yet reaped)."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            sid = stat_session((proc / "stat").read_text())
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if sid is not None:
            out[int(proc.name)] = (sid, cmdline)
    return out


def command_pids(sessions: set[int], ray_tmp: str) -> list[int]:
    """The live processes of a command: those of `sessions` (the command's own, and sessions
    seen before) and of the sessions of the processes whose command line names `ray_tmp`, which
    are added to `sessions`. layerswap starts Ray's GCS and raylet in sessions of their own
    (trainables/ray_session.py); the workers a raylet forks stay in its session, under titles
    Ray rewrites (`ray::...`), and may outlive it briefly: so sessions are remembered."""
    procs = processes()
    mark = ray_tmp.encode()
    sessions |= {sid for sid, cmd in procs.values() if mark in cmd} - {os.getsid(0)}
    return sorted(pid for pid, (sid, cmd) in procs.items() if sid in sessions or mark in cmd)


def stat_session(stat: str) -> int | None:
    """The session id in a /proc/PID/stat line (its 6th field; the command name before it, in
    parentheses, may hold spaces and parentheses), or None for a zombie."""
    fields = stat.rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
    return None if fields[0] == "Z" else int(fields[3])


class Command:
    """`layerswap train ...` in a session of its own, its output in a file, Ray in its own
    RAY_TMPDIR (short: Ray's socket paths are length-limited) so its logs and processes are
    this command's alone."""

    def __init__(self, args: list[str], log: Path, gpu: bool):
        self.ray_tmp = tempfile.mkdtemp(prefix="lsg", dir="/tmp")
        self.log = log
        env = {
            **os.environ, "RAY_TMPDIR": self.ray_tmp, "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TORCH_LOGS": "c10d",  # the worker logs its process group's backends
            "NCCL_DEBUG": "INFO",  # and NCCL, when it is used, its communicators
        }  # fmt: skip
        if not gpu:
            env["OMP_NUM_THREADS"] = "1"  # tiny model on shared cores: one thread is fastest
        self.t0 = time.monotonic()
        self.sessions: set[int] = set()  # the command's, then Ray's as kill_group sees them
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "layerswap.cli", *args], cwd=ROOT, env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.sessions.add(self.proc.pid)  # start_new_session: it leads its own

    def output(self) -> str:
        """The command's output and every log its Ray wrote (the workers' included; os.walk
        does not follow Ray's session_latest link, so each file is read once)."""
        parts = [self.log.read_text(errors="replace")]
        for folder, _, files in os.walk(self.ray_tmp):
            if Path(folder).name == "logs" or "/logs/" in folder:
                for f in sorted(files):
                    if f.endswith((".out", ".err", ".log")):
                        parts.append((Path(folder) / f).read_text(errors="replace"))
        return "\n".join(parts)

    def wait_for(self, ready, what: str, timeout: float) -> float:
        """Seconds from the start until `ready()` holds; RuntimeError if the command ends or
        `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited {self.proc.returncode} before {what}: {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} after {timeout:.0f} s: {self.tail()}")
            time.sleep(0.05)
        return time.monotonic() - self.t0

    def finish(self, timeout: float) -> int:
        """Wait for the command's own exit; its exit code."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"still running after {timeout:.0f} s: {self.tail()}") from None

    def kill_group(self) -> None:
        """SIGKILL every process the command started at once, as when its node is lost (no
        handler runs): its session (the driver) and Ray's (GCS, raylet and its workers)."""
        for _ in range(20):  # until none is left (a dying raylet may still have forked one)
            pids = command_pids(self.sessions, self.ray_tmp)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.proc.poll() is None:
                self.proc.wait(timeout=30)
            time.sleep(0.1)
        self.proc.wait(timeout=30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def close(self, keep: Path) -> None:
        """Kill whatever of the command is left (its driver may have exited with Ray's processes
        still up, or the check itself is being cut: run.Cut), keep the tail of the output beside
        the report, drop Ray's folder."""
        self.kill_group()
        write_text(keep, self.log.read_text(errors="replace")[-LOG_TAIL:])
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def _final_checkpoint(ckpt: Path) -> dict:
    """The last checkpoint as a user loads it: its manifest, its sharded trainer state (DCP
    files), and whether model.safetensors loads into the model with every tensor as saved."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from layerswap.trainables.train import read_manifest

    saved = load_file(ckpt / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype="auto", use_safetensors=True)
    state = model.state_dict()
    dcp = ckpt / "trainer_state" / "dcp"
    manifest = read_manifest(ckpt)
    return {
        "path": ckpt.name,
        "step": manifest["step"],
        "world_size": manifest["world_size"],
        "dcp_files": sorted(p.name for p in dcp.iterdir()) if dcp.is_dir() else [],
        "loads": all(torch.equal(state[k], v) for k, v in saved.items()) and len(saved) > 0,
    }


def _killed_run(args: list[str], ckpts: Path, step_log: Path, gpu: bool, limit: float, keep: Path) -> dict:  # fmt: skip
    """Start the run, SIGKILL its process group once the first checkpoint is on disk."""
    c = Command(args, step_log.with_name("killed.log"), gpu)
    try:
        first_s = c.wait_for(lambda: bool(_checkpoints(ckpts)), "first checkpoint", limit)
        c.kill_group()
        killed_at = time.monotonic()
        at_kill = [p.name for p in _checkpoints(ckpts)]
        logged = step_log.read_bytes() if step_log.exists() else b""
        if c.proc.returncode != -signal.SIGKILL:
            raise RuntimeError(f"ended by itself (exit {c.proc.returncode}) before the kill: {c.tail()}")  # fmt: skip
        return {
            "first_checkpoint_s": first_s, "killed_at": killed_at, "checkpoints_at_kill": at_kill,
            "step_log_bytes": len(logged), "output": c.output(),
        }  # fmt: skip
    finally:
        c.close(keep)


def _resumed_run(args: list[str], log: Path, gpu: bool, limit: float, keep: Path) -> dict:
    """The same command with --resume, to its end."""
    c = Command([*args, "--resume"], log, gpu)
    try:
        rc = c.finish(limit)
        if rc != 0:
            raise RuntimeError(f"`layerswap train --resume` exited {rc}: {c.tail()}")
        return {"done_at": time.monotonic(), "output": c.output()}
    finally:
        c.close(keep)


def command_limit(ctx) -> float:
    """Seconds one command may take: what is left of the check when it starts, 240 at most (the
    stage is ~1 min). Taken again for the resumed command: one limit for both let a hung resume
    (an NCCL wait) spend the killed run's time a second time. No floor: a floor let the stage run
    past the budget by it (60 s each, found by a red-team).

    Raises:
        RuntimeError when less than START_S is left: the command could not even start.
    """
    left = min(240.0, ctx.remaining())
    if left < START_S:
        raise RuntimeError(f"{max(left, 0):.0f} s of the check's budget left: `layerswap train` needs ~{START_S:.0f} s to start")  # fmt: skip
    return left


def run(ctx) -> dict:
    gpu = ctx.device == "cuda"
    with tempfile.TemporaryDirectory(prefix="gc-ray-") as tmp:
        tmp = Path(tmp)
        cfg = tmp / "exp.yaml"
        cfg.write_text(yaml.safe_dump(experiment(ctx.world, tmp, gpu), sort_keys=False))
        ckpts, step_log = tmp / "run" / "train" / NAME, tmp / "steps.jsonl"
        args = ["train", str(cfg), "--out", str(tmp / "run")]
        killed = _killed_run(args, ckpts, step_log, gpu, command_limit(ctx), ctx.out / "ray_train_killed.log")  # fmt: skip
        # the killed run's part outlives a failed resume
        ctx.keep("killed run", lambda: killed_run_part(gpu, killed, *backends_in_logs(killed["output"]), EVERY_SAMPLES))  # fmt: skip
        resumed = _resumed_run(args, tmp / "resumed.log", gpu, command_limit(ctx), ctx.out / "ray_train_resumed.log")  # fmt: skip
        text, cut = step_log.read_bytes(), killed["step_log_bytes"]  # the killed attempt's bytes
        before, after = read_step_log(text[:cut].decode()), read_step_log(text[cut:].decode())
        final = _final_checkpoint(_checkpoints(ckpts)[-1])
    summary = resume_summary(before, after, STEPS)
    backends, nccl_inits = backends_in_logs(killed["output"] + resumed["output"])
    used = None if backends is None else backends.get("cuda" if gpu else "cpu")
    res = ray_train_result(ctx, killed, resumed, summary, final, backends, used, nccl_inits, steps=STEPS, every_samples=EVERY_SAMPLES, step_delay_s=STEP_DELAY_S)  # fmt: skip
    res["step_log"] = {"killed": before, "resumed": after}
    return res
