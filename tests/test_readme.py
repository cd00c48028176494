"""The README's commands run as written, so the README cannot drift from the command line.

Every line of README.md's fenced bash blocks is checked: a `layerswap` line must name a real
subcommand whose `--help` lists every option the line uses; the cheap ones (`--plan`, `plan`,
`demo --merge-only`) run verbatim with their outputs sent to a temporary folder (slow); `make X`
must be a Makefile target, and "`make X` runs `CMD`" must be what the Makefile runs; the install
lines must pin the Makefile's torch and name an extra pyproject has. The docs' `layerswap` lines get
the same option check. Also: the README stays a guide (≤ 300 lines) and every relative link in
README.md and docs/ resolves to a file (and a heading, when it names one).

Run: .venv/bin/python -m pytest -q tests/test_readme.py (add -m slow for the verbatim runs).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^```(\w*)\s*$")
OPTION = re.compile(r"^--[a-z][\w-]*")


def bash_lines(path: Path) -> list[str]:
    """Shell command lines of a Markdown file's ```bash blocks (continuations joined, no comments).

    Args:
        path: a Markdown file.
    Returns:
        One string per command, trailing `# ...` comments and blank lines dropped.
    """
    out, lang, pending = [], None, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        fence = FENCE.match(line.strip())
        if fence:
            lang = None if lang is not None else fence.group(1)
        elif lang == "bash" and line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        elif lang == "bash":
            words = shlex.split(pending + line, comments=True)
            pending = ""
            if words:
                out.append(shlex.join(words))
    return out


def command_words(line: str) -> list[str]:
    """A command's words without leading VAR=value assignments."""
    words = shlex.split(line)
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    return words


def layerswap_cmd() -> list[str]:
    """The installed console script (beside this interpreter), else `python -m layerswap.cli`."""
    script = Path(sys.executable).parent / "layerswap"
    if script.exists():
        return [str(script)]
    found = shutil.which("layerswap")
    return [found] if found else [sys.executable, "-m", "layerswap.cli"]


def subcommand(words: list[str]) -> tuple[str, ...]:
    """`layerswap world build ...` -> ("world", "build"); `layerswap train X` -> ("train",)."""
    return tuple(words[1:3]) if words[1] == "world" else (words[1],)


@functools.cache
def help_text(sub: tuple[str, ...]) -> str:
    """`layerswap SUB --help`, run once per subcommand; fails the test on a non-zero exit."""
    proc = subprocess.run(
        [*layerswap_cmd(), *sub, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, f"layerswap {' '.join(sub)} --help: {proc.stderr[-2000:]}"
    return proc.stdout


def unknown_options(line: str) -> list[str]:
    """Options of a `layerswap` line that its subcommand's --help does not list."""
    words = command_words(line)
    text = help_text(subcommand(words))
    opts = {OPTION.match(w).group(0) for w in words if OPTION.match(w)}
    return sorted(o for o in opts if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text))


README_LINES = bash_lines(README)
LAYERSWAP = [c for c in README_LINES if command_words(c)[0] == "layerswap"]
# Each distinct docs line once; lines the README shows too are checked there.
DOC_LAYERSWAP = sorted(
    {
        (page.relative_to(ROOT).as_posix(), line)
        for page in DOCS
        for line in bash_lines(page)
        if command_words(line)[:1] == ["layerswap"] and line not in LAYERSWAP
    }
)


def test_readme_is_a_guide_not_a_notebook():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move detail into docs/"


def test_readme_shows_commands():
    assert LAYERSWAP, "no layerswap command in README.md's bash blocks"
    assert {"make demo", "make test"} <= set(README_LINES)


@pytest.mark.parametrize("line", README_LINES)
def test_every_readme_line_is_a_known_kind(line):
    words = command_words(line)
    known = (
        words[0] in {"layerswap", "make"}
        or words[:3] == ["python3", "-m", "venv"]
        or words[0].endswith("/pip")
    )
    assert known, f"README shows a command this test cannot check: {line!r}"


@pytest.mark.parametrize("line", LAYERSWAP)
def test_readme_layerswap_options_exist(line):
    assert not unknown_options(line), f"{line!r}: options not in --help: {unknown_options(line)}"


@pytest.mark.parametrize(("page", "line"), DOC_LAYERSWAP)
def test_docs_layerswap_options_exist(page, line):
    assert not unknown_options(line), f"{page}: {line!r}: not in --help: {unknown_options(line)}"


def _makefile_recipe(target: str) -> str:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)*)", text, re.M)
    assert m, f"Makefile has no target {target!r}"
    return m.group(1)


def test_make_targets_and_what_they_run():
    for line in README_LINES:
        if line.startswith("make "):
            _makefile_recipe(line.split()[1])
    prose = README.read_text(encoding="utf-8")
    claims = re.findall(r"`make (\w+)` runs `layerswap ([^`]+)`", prose)
    assert claims, "the README no longer says what `make demo` runs"
    for target, cmd in claims:
        assert f"/layerswap {cmd}" in _makefile_recipe(target), (target, cmd)


def test_install_lines_match_makefile_and_pyproject():
    torch_pin = re.search(r"^TORCH \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    extras = re.search(
        r"\[project\.optional-dependencies\]\n((?:\w+ = .*\n)+)",
        (ROOT / "pyproject.toml").read_text(),
    ).group(1)
    pips = [command_words(c) for c in README_LINES if command_words(c)[0].endswith("/pip")]
    assert any(torch_pin in w for w in pips), f"README's pip lines do not install {torch_pin}"
    named = [
        extra
        for words in pips
        for w in words
        if (m := re.fullmatch(r"'?\.\[([\w,]+)\]'?", w))
        for extra in m.group(1).split(",")
    ]
    assert named, "the README's pip lines install no extra of the project"
    for extra in named:
        assert re.search(rf"^{extra} = ", extras, re.M), f"no [{extra}] extra in pyproject"


def _cheap(words: list[str]) -> bool:
    return "--plan" in words or "--merge-only" in words or words[1] == "plan"


CHEAP = [c for c in LAYERSWAP if _cheap(command_words(c))]


def test_readme_has_cheap_commands_to_run():
    """So the verbatim runs below are not vacuous: the README shows one of each kind."""
    assert any(command_words(c)[1] == "plan" for c in CHEAP), CHEAP
    assert any("--plan" in c for c in CHEAP), CHEAP
    assert any("--merge-only" in c for c in CHEAP), CHEAP


@pytest.mark.slow
@pytest.mark.parametrize("line", CHEAP)
def test_cheap_readme_commands_run_as_written(line, tmp_path):
    words = command_words(line)
    for i, w in enumerate(words[:-1]):  # outputs go to the test's folder, nothing else changes
        if w in {"--out", "--json"}:
            words[i + 1] = str(tmp_path / Path(words[i + 1]).name)
    assignments = shlex.split(line)[: len(shlex.split(line)) - len(words)]
    env = dict(os.environ, **dict(a.split("=", 1) for a in assignments))
    proc = subprocess.run(
        [*layerswap_cmd(), *words[1:]],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, f"{line!r} exited {proc.returncode}:\n{proc.stderr[-3000:]}"


# --- links -------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slugify(text: str) -> str:
    """A heading's anchor as mkdocs (Python-Markdown's toc) makes it."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    """Anchors of a Markdown file's headings, code blocks skipped."""
    out, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
        elif not in_code and re.match(r"^#{1,6} ", line):
            out.add(slugify(line.lstrip("#").strip()))
    return out


def links(path: Path) -> list[str]:
    """Relative link targets of a Markdown file, code blocks and code spans skipped."""
    out, in_code = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
            continue
        if not in_code:
            out += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return [t for t in out if not re.match(r"^[a-z]+:", t)]


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    bad = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)
