"""Documented check: render an analysis report in headless Chromium and save a screenshot.

By default it runs `layerswap demo` on the tiny world into a temporary folder (`--run DIR`: an
existing run, e.g. a full `layerswap demo`), runs `layerswap analyze` on it and screenshots
report.html; `--synthetic` uses the analysis tests' synthetic run (registry, trials,
Optuna study, promotion results) so every section has content; `--html FILE` screenshots an
existing report. Needs a `chromium` (or `chromium-browser`/`google-chrome`) binary on PATH
(Debian: `apt-get install -y chromium`).

    python benchmarks/screenshot_report.py [--run DIR | --synthetic | --html FILE] [--out report.png]

Prints the screenshot path and checks the PNG is non-trivial (not blank, expected size); exit 1
when the demo, the analysis or the browser fails. Smoke run (tests/benchmarks/
test_screenshot_report.py, ~20 s): `--synthetic --out shots/report.png --height 1200`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The first headless-capable Chromium binary on PATH, or None."""
    return next((b for b in map(shutil.which, BROWSERS) if b), None)


def screenshot(html: Path, out: Path, *, width: int = 1280, height: int = 4000) -> Path:
    """Render `html` with headless Chromium into the PNG `out` (full width, tall window).

    Raises:
        RuntimeError when no browser is installed or it fails to write the PNG.
    """
    browser = find_browser()
    if browser is None:
        raise RuntimeError(f"no Chromium on PATH (tried {', '.join(BROWSERS)})")
    out = Path(out).resolve()
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",  # root in containers; the page is our own local file
            "--disable-gpu",
            "--hide-scrollbars",
            # Nothing but the local page: a closed network (CI, clusters) must not stall start-up
            # on first-run setup, component updates, sync or background fetches.
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",  # a fresh profile per screenshot
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            Path(html).resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(
            f"{browser} wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}"
        )
    return out


def check_png(path: Path, width: int = 1280) -> tuple[int, int, float]:
    """(width, height, fraction of non-white pixels); raises if the image is blank."""
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    h, w = img.shape[:2]
    inked = float((img[..., :3] < 0.95).any(axis=-1).mean())
    if w != width or inked < 0.01:
        raise RuntimeError(f"{path}: unexpected screenshot ({w}x{h}, {inked:.1%} non-white)")
    return w, h, inked


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--html", type=Path, help="an existing report.html (skips demo + analyze)")
    p.add_argument("--run", type=Path, help="an existing run folder to analyze (skips the demo)")
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="analyze the tests' synthetic run instead of a demo run",
    )
    p.add_argument(
        "--out", type=Path, default=Path("bench-out/report_screenshot.png"), help="PNG path"
    )
    p.add_argument(
        "--height", type=int, default=4000, help="window height in pixels (default 4000)"
    )
    p.add_argument("--keep", type=Path, help="also keep the analyzed run and report in this folder")
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="layerswap-shot-") as tmp:
        html = args.html
        if html is None:
            from layerswap.cli import main as cli

            if args.keep is not None and args.keep.exists():
                p.error(f"--keep {args.keep}: already exists (give a new folder)")
            root = Path(args.keep or tmp)
            root.mkdir(parents=True, exist_ok=args.keep is None)  # the temporary folder exists
            if args.synthetic:
                sys.path.insert(0, str(REPO / "tests" / "analysis"))
                from analysis_synth import make_run

                run = make_run(root)
            elif args.run is not None:
                run = args.run
            else:
                run = root / "demo"
                demo = ["demo", "--world-size", "tiny", "--trials", "4", "--train-steps", "6"]
                if cli([*demo, "--out", str(run), "--overwrite"]) != 0:
                    return 1
            report = root / "report"
            if (
                cli(
                    ["analyze", str(run), "--out", str(report), "--overwrite", "--resamples", "500"]
                )
                != 0
            ):
                return 1
            html = report / "report.html"
        out = screenshot(html, args.out, height=args.height)
        w, h, inked = check_png(out)
    print(f"screenshot of {html}: {out} ({w}x{h}, {inked:.0%} non-white pixels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
