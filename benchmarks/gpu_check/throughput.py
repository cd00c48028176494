"""The GPU check's measured figures into spaces/throughput.yaml, in the profile of the GPU measured.

A stage that measures a throughput figure returns it under result["throughput"][name] as
{"value", "unit", "shape", "result", "derivation"}. As soon as such a stage ends, run.py writes
them under its --out folder (MEASURED: the figures with the GPU and command; UPDATED: the whole
throughput.yaml as it would then be), so they come back from a GPU machine whose tree is thrown
away, and survive a run cut short. Applying them writes each into the profile as `measured`
(benchmark, command, date, device, shape, result, derivation, and `partial` for a figure of a
stage that failed or was cut after part of it finished), replacing `assumed`, validates
the whole file with layerswap's own model, and replaces it atomically. Figures the check cannot
measure (e.g. parallel_efficiency on one GPU) keep their `assumed` text.

The profile is the GPU's own (`profile_for`: "h100" for any H100, "h200" for an H200); one that
names another family is refused, so an H200's figures never land in the h100 profile. A GPU
profile the file lacks is made from TEMPLATE's assumptions, each marked as copied.

Apply a report folder (e.g. one copied back from the GPU machine) on your own machine:
    python benchmarks/gpu_check/throughput.py DIR [--profile NAME] [--file spaces/throughput.yaml]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

# Run as a script, this folder is sys.path[0]; its modules are imported as the gpu_check package
# instead (benchmarks/ on the path), so names like `env` or `timing` shadow nothing.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from gpu_check.common import ROOT, write_json, write_text  # noqa: E402
from gpu_check.figures import gpu_family  # noqa: E402

THROUGHPUT = ROOT / "spaces" / "throughput.yaml"
MEASURED = (
    "throughput_measured.json"  # under --out: {"gpu", "profile", "command", "date", "figures"}
)
UPDATED = "throughput.yaml"  # under --out: spaces/throughput.yaml with them applied
TEMPLATE = "h100"  # a GPU profile the file lacks starts from this one's assumptions


def profile_for(gpu_name: str) -> str | None:
    """The throughput profile of a GPU: its family in lower case ("h100", "h200"); None when
    figures.GPU_SPECS has no row for it."""
    family = gpu_family(gpu_name)
    return family.lower() if family else None


def check_profile(profile: str | None, gpu_name: str) -> str:
    """The profile measurements of `gpu_name` may go into: `profile`, or the GPU's own when None.

    Raises:
        ValueError when `profile` names another GPU family than the one measured, or the GPU's
        family is unknown (nothing to compare with).
    """
    own = profile_for(gpu_name)
    if own is None:
        raise ValueError(f"GPU {gpu_name!r} has no row in gpu_check/figures.GPU_SPECS: its profile is unknown; add its row")  # fmt: skip
    if profile is not None and profile != own:
        raise ValueError(f"--profile {profile!r} is not the measured GPU's ({gpu_name!r} is profile {own!r}); its figures would describe another GPU")  # fmt: skip
    return own


def assumed_profile(gpu_name: str, smoke: bool):
    """(the Profile whose figures the report sets beside the measured ones, a note saying which):
    the GPU's own profile (an H200's is h200); h100's on a --smoke run (the numbers mean nothing
    there, the path is checked) and, labelled as another GPU's, for a GPU spaces/throughput.yaml
    has no profile for (the issue's targets are an H100's); None when the file has neither."""
    from layerswap.spaces.study import load_profiles

    profiles = load_profiles(THROUGHPUT)
    name = TEMPLATE if smoke else profile_for(gpu_name)
    if name in profiles:
        return profiles[name], f"*assumed*: spaces/throughput.yaml profile {name}"
    if TEMPLATE in profiles:
        return profiles[TEMPLATE], (
            f"*assumed*: spaces/throughput.yaml has no profile for {gpu_name} ({name or 'unknown family'}): "
            f"the column shows profile {TEMPLATE}'s, ANOTHER GPU's figures (the issue's H100), not this GPU's"
        )  # fmt: skip
    return None, f"*assumed*: spaces/throughput.yaml has no profile for {gpu_name} ({name or 'unknown family'}): none shown"  # fmt: skip


def measured_figures(records: list[dict]) -> dict[str, dict]:
    """{figure name: its measurement} over every finished stage, and the finished parts of a
    stage that failed or was cut (run.with_kept), each of those with "partial" saying what
    stopped after what ("stage evaluator running after candidate 1 finished"); a later stage
    wins a tie."""
    out: dict[str, dict] = {}
    for r in records:
        if r["status"] == "ok":
            out.update(r["result"].get("throughput", {}))
        elif r.get("partial"):
            why = f"stage {r['stage']} {r['status']} after {', '.join(r['partial']['parts'])} finished"  # fmt: skip
            for name, m in r["result"].get("throughput", {}).items():
                out[name] = {**m, "partial": why}
    return out


def _new_profile(data: dict, profile: str, device: str) -> dict:
    """A profile for `device` made from TEMPLATE's, each figure's assumption marked as copied."""
    new = copy.deepcopy(data["profiles"][TEMPLATE])
    for fig in new.values():
        if isinstance(fig, dict) and "assumed" in fig:
            fig["assumed"] = f"copied from profile {TEMPLATE}, not re-derived for {device}: {fig['assumed']}"  # fmt: skip
    new["device"] = device
    return new


def updated_yaml(text: str, profile: str, figures: dict[str, dict], command: str, device: str, date: str) -> str:  # fmt: skip
    """`text` (a throughput.yaml) with `figures` written into `profile` as measured.

    The file's leading comment block is kept; the rest is re-dumped from the parsed data. A
    profile the file lacks is made (`_new_profile`) only when it is `device`'s own.
    Raises ValueError naming an unknown profile or figure, or a result layerswap would refuse.
    """
    import yaml

    from layerswap.spaces.study import Profiles

    data = yaml.safe_load(text)
    if profile not in data.get("profiles", {}):
        if profile != profile_for(device) or TEMPLATE not in data["profiles"]:
            raise ValueError(f"throughput.yaml has no profile {profile!r} (has {', '.join(data['profiles'])})")  # fmt: skip
        data["profiles"][profile] = _new_profile(data, profile, device)
    prof = data["profiles"][profile]
    for name, m in figures.items():
        if name not in prof or not isinstance(prof[name], dict):
            raise ValueError(f"profile {profile!r} has no figure {name!r}")
        prof[name] = {
            "value": float(m["value"]),
            "unit": m.get("unit", prof[name]["unit"]),
            "measured": {
                "benchmark": "benchmarks/gpu_check/run.py",
                "command": command,
                "date": date,
                "device": device,
                "shape": m["shape"],
                "result": m["result"],
                "derivation": m["derivation"],
                # the profile model's own field, so `layerswap plan` can say the figure is partial
                **({"partial": m["partial"]} if m.get("partial") else {}),
            },
        }
    if figures:
        prof["device"] = f"{device} (figures marked measured: layerswap's GPU check, {date})"
    Profiles.model_validate(data)  # the file layerswap reads must still load
    head = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        head.append(line)
    body = yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)
    return "\n".join(head) + "\n" + body


def save_measured(out: Path, records: list[dict], gpu_name: str, profile: str, command: str) -> bool:  # fmt: skip
    """Write the run's measurements so far under `out` (MEASURED, and UPDATED: the shipped file
    with them applied), each atomically; run.py calls it after every stage. Returns whether
    there was anything to write."""
    figures = measured_figures(records)
    if not figures:
        return False
    date = time.strftime("%Y-%m-%d")
    write_json(out / MEASURED, {"gpu": gpu_name, "profile": profile, "command": command, "date": date, "figures": figures})  # fmt: skip
    write_text(out / UPDATED, updated_yaml(THROUGHPUT.read_text(), profile, figures, command, gpu_name, date))  # fmt: skip
    return True


def update_throughput(records: list[dict], ctx, profile: str | None, command: str, path: Path = THROUGHPUT) -> None:  # fmt: skip
    """--update-throughput: write the run's measured figures into `path`'s `profile`, which must
    be the measured GPU's own (`check_profile`; ValueError, nothing written, when it is not)."""
    name = check_profile(profile, ctx.gpu_name)
    figures = measured_figures(records)
    if not figures:
        print("--update-throughput: no stage measured a throughput figure; file unchanged")
        return
    text = updated_yaml(path.read_text(), name, figures, command, ctx.gpu_name, time.strftime("%Y-%m-%d"))  # fmt: skip
    write_text(path, text)
    print(f"{path}: {name} now measured for {', '.join(sorted(figures))}")


def read_measured(folder: Path) -> dict:
    """A report folder's measurements ({"gpu", "command", "date", "figures"}): its MEASURED
    file, else rebuilt from its stage records and the GPU name in 01_env.json.
    Raises ValueError naming the folder when neither says."""
    if (folder / MEASURED).is_file():
        return json.loads((folder / MEASURED).read_text())
    env = folder / "01_env.json"
    if not env.is_file():
        raise ValueError(f"{folder}: neither {MEASURED} nor 01_env.json (the GPU's name) is there")  # fmt: skip
    gpu = json.loads(env.read_text())["result"]["versions"]["device"]
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("[0-9][0-9]_*.json"))]
    return {"gpu": gpu, "command": f"benchmarks/gpu_check/run.py --out {folder.name}",
            "date": time.strftime("%Y-%m-%d"), "figures": measured_figures(records)}  # fmt: skip


def apply(folder: Path, profile: str | None = None, path: Path = THROUGHPUT) -> str:
    """Write `folder`'s measurements into `path`'s profile of the GPU measured (see module doc).

    Returns the line to print. Raises ValueError (nothing written) on a profile/GPU mismatch, an
    unknown GPU, a folder without measurements, or a result layerswap would refuse.
    """
    m = read_measured(folder)
    name = check_profile(profile, m["gpu"])
    if not m["figures"]:
        raise ValueError(f"{folder}: no stage measured a throughput figure; {path} unchanged")
    write_text(path, updated_yaml(path.read_text(), name, m["figures"], m["command"], m["gpu"], m["date"]))  # fmt: skip
    return f"{path}: profile {name} now measured for {', '.join(sorted(m['figures']))} ({m['gpu']})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a GPU check's --out folder")
    ap.add_argument("--profile", default=None, help="the profile to write (default: the measured GPU's own; another GPU's is refused)")  # fmt: skip
    ap.add_argument("--file", type=Path, default=THROUGHPUT, help="the throughput YAML to update (default spaces/throughput.yaml)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        print(apply(args.folder, args.profile, args.file))
    except (ValueError, OSError) as e:
        print(f"throughput.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
