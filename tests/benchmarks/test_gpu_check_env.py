"""benchmarks/gpu_check/env.py: the environment stage names versions pyproject.toml does not allow.
Run: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_check_env.py
"""

from __future__ import annotations


def test_versions_outside_pyproject_are_noted(tmp_path, monkeypatch):
    """The device runs its image's transformers (5.17 when last read) under a project that
    requires >=5.24: the environment stage says so beside every figure."""
    from benchmarks.gpu_check import env

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["transformers>=5.24,<6", "ray[tune]==2.60.0", "absent>=1"]\n')  # fmt: skip
    installed = {"transformers": "5.17.0", "ray": "2.60.0"}
    monkeypatch.setattr(env, "_version", lambda d: installed.get(d, "not installed"))
    notes = env.outside_requirements(pyproject)
    assert len(notes) == 1 and notes[0].startswith("transformers 5.17.0 is outside")
    installed["transformers"] = "5.24.0"
    assert env.outside_requirements(pyproject) == []
