"""Fit what travels to the lent GPU machine under its 64 MiB: the working tree plus `.gpu/`.

`bash ../shared/gpu/prepare.sh` writes `.gpu/wheels` (~61 MB: Ray's alone is 43 MB); the tree
is ~29 MB (the shipped world bases are 23 MB of it), so together they were over the limit and
the device refused the call. This rewrites the wheels in place, keeping what the GPU check runs:
Ray's native binaries stripped of their symbol tables (`strip --strip-unneeded`: what a
distribution's packages do; their exported symbols stay) and large members LZMA-compressed
(pip reads any zip method), lm-eval without the task folders the check never includes (it
includes belebele and mgsm), Ray without Serve and LLM, which nothing here imports. Then it
prints the total and exits 1 if it is still over.

Run from the repository root after prepare.sh:
    python benchmarks/gpu_check/carry.py [--gpu-dir .gpu] [--check-only]
Tests: .venv/bin/python -m pytest -q tests/benchmarks/test_gpu_carry.py
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LIMIT_BYTES = 64 * 2**20  # the device tool's limit on the tree + carried paths, per call
LZMA_FROM = 256 * 1024  # members at least this large are LZMA-compressed (smaller: deflate)
KEEP_TASKS = ("belebele", "mgsm")  # lm-eval task folders the GPU check's task YAMLs include
# Ray libraries nothing in layerswap, Ray Train or Ray Tune imports (Ray Data is imported by
# Ray Train v2, so it stays): 0.9 MB of margin under the limit.
RAY_UNUSED = ("ray/serve/", "ray/llm/")
ELF = b"\x7fELF"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _dropped(wheel: str, name: str) -> bool:
    """Whether a member of `wheel` is left out: lm-eval's task folders the check never reads,
    Ray Serve and Ray LLM."""
    if wheel.startswith("ray-"):
        return name.startswith(RAY_UNUSED)
    if not wheel.startswith("lm_eval-"):
        return False
    parts = name.split("/")
    return len(parts) > 3 and parts[:2] == ["lm_eval", "tasks"] and parts[2] not in KEEP_TASKS


def _stripped(data: bytes, strip: str | None) -> bytes:
    """An ELF file without its symbol tables (as is, without `strip` or if strip fails)."""
    if strip is None or not data.startswith(ELF):
        return data
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "elf"
        f.write_bytes(data)
        done = subprocess.run([strip, "--strip-unneeded", str(f)], capture_output=True)
        return f.read_bytes() if done.returncode == 0 else data


def slim_wheel(path: Path, strip: str | None) -> tuple[int, int]:
    """Rewrite one wheel in place (atomically); returns its (old, new) size in bytes."""
    wheel = path.name
    members: list[tuple[zipfile.ZipInfo, bytes]] = []
    record: zipfile.ZipInfo | None = None
    with zipfile.ZipFile(path) as zin:
        for info in zin.infolist():
            if _dropped(wheel, info.filename):
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                record = info
                continue
            members.append((info, _stripped(zin.read(info.filename), strip)))
    lines = [_record_line(i.filename, d) for i, d in members]
    if record is not None:
        lines.append(f"{record.filename},,")
    tmp = path.with_name(f".{wheel}.tmp")
    with zipfile.ZipFile(tmp, "w") as zout:
        for info, data in members:
            method = zipfile.ZIP_LZMA if len(data) >= LZMA_FROM else zipfile.ZIP_DEFLATED
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr = info.external_attr  # keeps the executables' mode bits
            zout.writestr(out, data, compress_type=method)
        if record is not None:
            zout.writestr(record.filename, "\n".join(lines) + "\n", zipfile.ZIP_DEFLATED)
    old = path.stat().st_size
    tmp.replace(path)
    return old, path.stat().st_size


def tree_bytes(root: Path) -> int:
    """Bytes of what the device copies besides carried paths: tracked files and untracked ones
    git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout  # fmt: skip
    files = (root / n for n in out.decode().split("\0") if n)
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def dir_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu-dir", type=Path, default=Path(".gpu"), help="prepare.sh's folder")
    p.add_argument("--check-only", action="store_true", help="measure, rewrite nothing")
    args = p.parse_args(argv)
    wheels = sorted((args.gpu_dir / "wheels").glob("*.whl"))
    if not wheels:
        print(f"carry: no wheels under {args.gpu_dir}/wheels: run bash ../shared/gpu/prepare.sh first", file=sys.stderr)  # fmt: skip
        return 2
    if not args.check_only:
        strip = shutil.which("strip")
        if strip is None:
            print("carry: no `strip` here: Ray's binaries travel with their symbols", file=sys.stderr)  # fmt: skip
        for w in wheels:
            old, new = slim_wheel(w, strip)
            if old - new > 1 << 20:
                print(f"carry: {w.name}: {old / 2**20:.1f} -> {new / 2**20:.1f} MiB")
    tree, gpu = tree_bytes(Path.cwd()), dir_bytes(args.gpu_dir)
    total = tree + gpu
    verdict = "fits" if total <= LIMIT_BYTES else "OVER the device's limit"
    print(
        f"carry: tree {tree / 2**20:.1f} MiB + {args.gpu_dir} {gpu / 2**20:.1f} MiB = "
        f"{total / 2**20:.1f} MiB of {LIMIT_BYTES / 2**20:.0f} MiB: {verdict}"
    )
    return 0 if total <= LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
