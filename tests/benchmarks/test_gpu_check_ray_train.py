"""benchmarks/gpu_check/ray_train.py: reading what a killed and resumed run wrote (its step log,
the c10d and NCCL log lines, /proc's session ids), the experiment it trains, and (slow) the
stage's smoke run: `layerswap train` on Ray with FSDP2 SIGKILLed after its first checkpoint.

Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check_ray_train.py [-m "not slow"]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check import ray_train as R  # noqa: E402


def _rows(steps, start):
    return [{"step": s, "start": start, "group": "all"} for s in steps]


def test_a_resume_that_continues_the_step_counter():
    got = R.resume_summary(_rows([1, 2, 3], 0), _rows([3, 4, 5, 6], 2), total=6)
    assert got == {"resumed_from": 2, "last_before_kill": 3, "redone": 1, "continued": True}


def test_a_run_that_started_over_or_skipped_steps_is_not_a_continuation():
    # started over: every step again from 0 (the stage's figure, resumed from step N >= 1, misses)
    restarted = R.resume_summary(_rows([1, 2, 3], 0), _rows(range(1, 7), 0), total=6)
    assert restarted["resumed_from"] == 0 and restarted["redone"] == 3
    skipped = R.resume_summary(_rows([1, 2], 0), _rows([3, 5, 6], 2), total=6)
    assert skipped["resumed_from"] == 2 and not skipped["continued"]
    stopped = R.resume_summary(_rows([1, 2], 0), _rows([3, 4], 2), total=6)  # ended early
    assert not stopped["continued"]
    nothing = R.resume_summary(_rows([1, 2], 0), [], total=6)
    assert nothing == {"resumed_from": None, "last_before_kill": 2, "redone": None, "continued": False}  # fmt: skip


def test_step_log_drops_a_line_torn_by_the_kill():
    text = json.dumps({"step": 1, "start": 0}) + "\n" + '{"step": 2, "sta'
    assert R.read_step_log(text) == [{"step": 1, "start": 0}]
    assert R.read_step_log("") == []


def test_backends_and_nccl_communicators_from_the_logs():
    c10d = "I1127 03:32:54.119000 23094 torch/distributed/distributed_c10d.py:481] Using backend config: {'cpu': 'gloo', 'cuda': 'nccl'}"  # fmt: skip
    init = "h:1:2 [0] NCCL INFO comm 0x5a1 rank 0 nranks 1 cudaDev 0 busId 1000 commId 0xab - Init COMPLETE"  # fmt: skip
    other = init.replace("0x5a1", "0x7f2").replace("0xab", "0xcd")
    # Ray forwards each worker line to the driver as well: the same communicator read twice
    text = "\n".join([c10d, init, f"(RayTrainWorker pid=1) {init}", other, "NCCL INFO Bootstrap"])
    assert R.backends_in_logs(text) == ({"cpu": "gloo", "cuda": "nccl"}, 2)
    assert R.backends_in_logs("no such lines") == (None, 0)


def test_session_id_is_read_past_a_command_name_with_spaces_and_parentheses():
    assert R.stat_session("1234 (ray::Train (x) y) S 1 77 88 0 -1 4194560") == 88
    assert R.stat_session("1234 (python) Z 1 77 88 0 -1") is None  # dead, not yet reaped
    mine = os.getsid(0)
    assert os.getpid() in R.command_pids({mine}, "/no/such/ray_tmp")
    sessions: set[int] = set()
    # named on its command line (as started: `.venv/bin/python -m pytest` is no absolute path)
    argv0 = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    assert os.getpid() in R.command_pids(sessions, argv0)
    assert mine not in sessions  # never the caller's own session: kill_group would end it


@pytest.mark.parametrize("gpu", [False, True])
def test_experiment_is_fsdp_and_checkpoints_before_its_last_step(tmp_path, gpu):
    from layerswap.spaces.train_experiment import parse_train_experiment
    from layerswap.trainables.train.checkpoint_step import checkpoint_due

    exp = parse_train_experiment(R.experiment(tmp_path / "world", tmp_path, gpu))
    assert exp.scaling.strategy == "fsdp" and exp.scaling.use_gpu is gpu
    assert exp.scaling.num_workers == 1 and exp.failure.max_failures == 0
    assert (exp.precision.policy == "bf16-mixed") is gpu
    due = [s for s in range(1, R.STEPS + 1) if checkpoint_due(exp, s, s * R.BATCH, R.STEPS)]
    assert due[0] < R.STEPS - 1  # steps left to kill it in after the first checkpoint
    assert exp.debug.step_log == str(tmp_path / "steps.jsonl") and exp.debug.step_delay_s > 0


@pytest.mark.slow
def test_smoke_run_kills_and_resumes_layerswap_train(gpu_check_smoke):
    out = gpu_check_smoke
    res = json.loads((out / "06_ray_train.json").read_text())["result"]
    assert res["resume"]["resumed_from"] >= 1 and res["resume"]["continued"]
    assert res["final_checkpoint"]["loads"] and res["final_checkpoint"]["step"] == R.STEPS
    assert res["final_checkpoint"]["dcp_files"] == [".metadata", "__0_0.distcp"]
    assert res["backend_used"] == "gloo" and res["nccl_inits"] == 0
    figs = {f["name"]: f for f in res["figures"]}
    assert figs["resumed from step N"]["verdict"] == "met"
    assert figs["seconds to the first checkpoint"]["value"] > 0
    assert (out / "ray_train_killed.log").is_file() and (out / "ray_train_resumed.log").is_file()
