"""`layerswap train`'s `--resume [CKPT]` in every order users type it: a bare `--resume` before
the experiment YAML (`train --resume exp.yaml --out RUN`) resumes that experiment, and
`--resume CKPT` still names a checkpoint folder. Parse level only: nothing trains.

Run: .venv/bin/python -m pytest -q tests/cli/test_train_resume_args.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from layerswap.cli import build_parser, main
from layerswap.cli.train import experiment_and_resume

EXAMPLE = "spaces/examples/world_math_full.yaml"


def _parsed(*argv: str) -> tuple[Path, bool | Path]:
    """(experiment, resume) as `layerswap train ARGV` reads them."""
    return experiment_and_resume(build_parser().parse_args(["train", *argv]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--resume", EXAMPLE, "--out", "runs/x"],  # the flag first, as users type it
        ["--out", "runs/x", "--resume", EXAMPLE],
        ["--resume", "--out", "runs/x", EXAMPLE],
        [EXAMPLE, "--resume", "--out", "runs/x"],
        [EXAMPLE, "--out", "runs/x", "--resume"],
    ],
)
def test_a_bare_resume_in_any_place_resumes_the_experiment(argv):
    assert _parsed(*argv) == (Path(EXAMPLE), True)


def test_a_yml_suffix_is_an_experiment_too():
    assert _parsed("--resume", "exp.YML") == (Path("exp.YML"), True)
    assert _parsed("--resume", "exp.json") == (Path("exp.json"), True)  # JSON is YAML too


def test_an_experiment_after_resume_and_a_checkpoint_folder_after_it(tmp_path):
    """`--resume EXP.yaml CKPT_DIR`: the folder is the checkpoint, the YAML the experiment."""
    ckpt = tmp_path / "samples_16"
    ckpt.mkdir()
    assert _parsed("--resume", EXAMPLE, str(ckpt), "--no-ray") == (Path(EXAMPLE), ckpt)


@pytest.mark.parametrize(
    "argv",
    [
        ["--resume", "runs/x/train/t/checkpoints/samples_16", EXAMPLE, "--no-ray"],
        [EXAMPLE, "--no-ray", "--resume", "runs/x/train/t/checkpoints/samples_16"],
    ],
)
def test_resume_ckpt_still_names_a_checkpoint_folder(argv):
    assert _parsed(*argv) == (Path(EXAMPLE), Path("runs/x/train/t/checkpoints/samples_16"))


def test_no_resume_is_false():
    assert _parsed(EXAMPLE) == (Path(EXAMPLE), False)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--out", "runs/x"], "no experiment YAML given"),
        (["--resume"], "no experiment YAML given"),
        (["--resume", "runs/x/ckpt"], "no experiment YAML given"),
        ([EXAMPLE, "--resume", "other.yaml"], "--resume other.yaml: CKPT is a checkpoint folder"),
    ],
)
def test_a_missing_or_doubled_experiment_says_what_to_type(argv, says, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert "layerswap train EXPERIMENT.yaml" in err
    assert len(err.strip().splitlines()) == 1, err
