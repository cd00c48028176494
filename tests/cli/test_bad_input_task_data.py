"""Task data missing from the offline cache is refused before anything trains or loads: an expert
sweep whose indicator tasks cannot be read (its trials score only after training, hours at 8B).
test_bad_input.py's own check, its tripwires armed (nothing started, nothing changed). The search's
and eval's twins: tests/search/test_preflight_data.py, tests/trainables/evaluate/test_offline_hint.py.

Run: .venv/bin/python -m pytest -q tests/cli/test_bad_input_task_data.py
"""

from __future__ import annotations

import pytest

from tests.cli.test_bad_input import (  # noqa: F401  (bases_in_tmp, env, tripwires: fixtures)
    Env,
    bases_in_tmp,
    env,
    tripwires,
)
from tests.cli.test_bad_input import (
    test_bad_input_is_refused_and_changes_nothing as refused_and_unchanged,
)

SWEEP = {"num_samples": 2, "params": {"hyper.lr": {"low": 1e-4, "high": 1e-2, "log": True}}}


def train__sweep_scored_on_an_uncached_builtin_task(e: Env):
    # The world's own indicators read its local files; a built-in one needs the Hub's dataset,
    # which this offline machine has never downloaded.
    sweep = SWEEP | {"indicators": ["world_mgsm_direct_en_dev", "mgsm_direct_sw"]}
    argv = ["train", e.train_exp(sweep=sweep), "--out", e.at("run")]
    return argv, ["task data not in the local Hugging Face cache: mgsm_direct_sw (", "layerswap prefetch"]  # fmt: skip


@pytest.mark.slow  # ~15-40 s: lm-eval indexes its ~10k built-in task YAMLs to find the task
@pytest.mark.parametrize("make", [train__sweep_scored_on_an_uncached_builtin_task])
def test_uncached_task_data_is_refused_before_training(make, env, tree_state, capsys):  # noqa: F811
    refused_and_unchanged(make, env, tree_state, capsys)
