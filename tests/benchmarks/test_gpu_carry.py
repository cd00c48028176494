"""benchmarks/gpu_check/carry.py: slimmed wheels still install with pip and run, and the total
is measured against the device's limit. Run:
.venv/bin/python -m pytest -q tests/benchmarks/test_gpu_carry.py
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from benchmarks.gpu_check import carry

DIST = "lm_eval-0.0.1.dist-info"


def _wheel(folder: Path, exe: bytes) -> Path:
    """A tiny lm_eval wheel: kept and dropped task folders, a large member, an executable."""
    path = folder / "lm_eval-0.0.1-py3-none-any.whl"
    big = os.urandom(300_000) + bytes(300_000)  # over LZMA_FROM: compressed with LZMA
    files = {
        "lm_eval/__init__.py": b"",
        "lm_eval/tasks/__init__.py": b"",
        "lm_eval/tasks/belebele/belebele_eng_Latn.yaml": b"task: belebele_eng_Latn\n",
        "lm_eval/tasks/mgsm/direct/mgsm_direct_en.yaml": b"task: mgsm_direct_en\n",
        "lm_eval/tasks/arc/arc_easy.yaml": b"task: arc_easy\n",
        "lm_eval/big.bin": big,
        "lm_eval/tool": exe,
        f"{DIST}/METADATA": b"Metadata-Version: 2.1\nName: lm_eval\nVersion: 0.0.1\n",
        f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0))
            info.external_attr = (
                0o100755 if name.endswith("tool") else 0o100644
            ) << 16  # regular files
            z.writestr(info, data)
        z.writestr(f"{DIST}/RECORD", "")
    return path


def test_slimmed_wheel_installs_with_pip_and_keeps_what_the_check_reads(tmp_path):
    exe = Path(shutil.which("true")).read_bytes()  # an ELF executable: stripped, must still run
    wheel = _wheel(tmp_path, exe)
    old, new = carry.slim_wheel(wheel, shutil.which("strip"))
    assert new < old  # the large member went LZMA; the arc task folder is gone

    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        methods = {i.filename: i.compress_type for i in z.infolist()}
        record = z.read(f"{DIST}/RECORD").decode().splitlines()
        data = {n: z.read(n) for n in names}
    assert "lm_eval/tasks/arc/arc_easy.yaml" not in names
    assert {"lm_eval/tasks/belebele/belebele_eng_Latn.yaml", "lm_eval/tasks/mgsm/direct/mgsm_direct_en.yaml", "lm_eval/tasks/__init__.py"} <= names  # fmt: skip
    assert methods["lm_eval/big.bin"] == zipfile.ZIP_LZMA
    for line in record:  # every member's hash and size as written (pip checks none, but tools do)
        name, digest, size = line.split(",")
        if name.endswith("RECORD"):
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(data[name]).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={want}", len(data[name]))

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         "--target", str(target), str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    assert (target / "lm_eval/tasks/belebele/belebele_eng_Latn.yaml").read_text() == "task: belebele_eng_Latn\n"  # fmt: skip
    assert len((target / "lm_eval/big.bin").read_bytes()) == 600_000
    assert subprocess.run([str(target / "lm_eval/tool")]).returncode == 0  # still executable


def test_the_total_is_measured_against_the_limit(tmp_path, monkeypatch, capsys):
    gpu = tmp_path / ".gpu"
    (gpu / "wheels").mkdir(parents=True)
    shutil.copy(_wheel(tmp_path, b"#!/bin/sh\n"), gpu / "wheels")
    monkeypatch.setattr(carry, "tree_bytes", lambda root: 10 * 2**20)
    assert carry.main(["--gpu-dir", str(gpu), "--check-only"]) == 0
    assert "fits" in capsys.readouterr().out
    monkeypatch.setattr(carry, "tree_bytes", lambda root: 64 * 2**20)
    assert carry.main(["--gpu-dir", str(gpu), "--check-only"]) == 1
    assert "OVER the device's limit" in capsys.readouterr().out
    assert carry.main(["--gpu-dir", str(tmp_path / "none")]) == 2


def test_ray_loses_serve_and_llm_only(tmp_path):
    """Ray Serve and Ray LLM go (nothing imports them); Ray Data stays: Ray Train v2 imports it."""
    path = tmp_path / "ray-0.0.1-cp312-cp312-manylinux2014_x86_64.whl"
    kept = ["ray/__init__.py", "ray/data/__init__.py", "ray/tune/__init__.py", "ray/train/__init__.py", "ray/serve.py"]  # fmt: skip
    with zipfile.ZipFile(path, "w") as z:
        for name in [*kept, "ray/serve/__init__.py", "ray/serve/api.py", "ray/llm/__init__.py"]:
            z.writestr(name, b"")
    carry.slim_wheel(path, None)
    assert sorted(zipfile.ZipFile(path).namelist()) == sorted(kept)
