"""--update-throughput: the GPU check's measured figures into spaces/throughput.yaml.

A stage that measures a throughput figure returns it under result["throughput"][name] as
{"value", "unit", "shape", "result", "derivation"}; this writes each into the chosen profile as
`measured` (benchmark, command, date, device, shape, result, derivation), replacing `assumed`,
validates the whole file with layerswap's own model, and replaces it atomically. Figures the
check cannot measure (e.g. parallel_efficiency on one GPU) keep their `assumed` text.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpu_check.common import ROOT, write_text

THROUGHPUT = ROOT / "spaces" / "throughput.yaml"


def measured_figures(records: list[dict]) -> dict[str, dict]:
    """{figure name: its measurement} over every finished stage (a later stage wins a tie)."""
    out: dict[str, dict] = {}
    for r in records:
        if r["status"] == "ok":
            out.update(r["result"].get("throughput", {}))
    return out


def updated_yaml(text: str, profile: str, figures: dict[str, dict], command: str, device: str, date: str) -> str:  # fmt: skip
    """`text` (a throughput.yaml) with `figures` written into `profile` as measured.

    The file's leading comment block is kept; the rest is re-dumped from the parsed data.
    Raises ValueError naming an unknown profile or figure, or a result layerswap would refuse.
    """
    import yaml

    from layerswap.spaces.study import Profiles

    data = yaml.safe_load(text)
    if profile not in data.get("profiles", {}):
        raise ValueError(f"throughput.yaml has no profile {profile!r} (has {', '.join(data['profiles'])})")  # fmt: skip
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


def update_throughput(records: list[dict], ctx, profile: str, command: str, path: Path = THROUGHPUT) -> None:  # fmt: skip
    """Write the run's measured figures into `path`'s `profile` (see module doc)."""
    figures = measured_figures(records)
    if not figures:
        print("--update-throughput: no stage measured a throughput figure; file unchanged")
        return
    text = updated_yaml(path.read_text(), profile, figures, command, ctx.gpu_name, time.strftime("%Y-%m-%d"))  # fmt: skip
    write_text(path, text)
    print(f"{path}: {profile} now measured for {', '.join(sorted(figures))}")
