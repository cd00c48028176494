"""The report's building blocks: a Section is a title and a list of paragraphs, tables and
figures; report.py renders the same sections to HTML and Markdown."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class Figure:
    name: str  # file stem, unique within the report, e.g. "delta_math_expert"
    png: bytes
    caption: str  # what data it comes from and how many items/trials it rests on


@dataclass
class Table:
    caption: str
    df: pd.DataFrame


@dataclass
class Section:
    key: str
    title: str
    blocks: list[str | Table | Figure] = field(default_factory=list)
    data: dict = field(default_factory=dict)  # machine-readable results (summary.json)

    def text(self, s: str) -> None:
        self.blocks.append(s)

    def table(self, caption: str, df: pd.DataFrame) -> None:
        self.blocks.append(Table(caption, df))

    def figure(self, name: str, png: bytes, caption: str) -> None:
        self.blocks.append(Figure(name, png, caption))

    @property
    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]


NOT_IN_RUN = "Not in this run"


def absent(key: str, title: str, why: str) -> Section:
    """A section for data the run does not have."""
    s = Section(key, title)
    s.text(f"{NOT_IN_RUN}: {why}")
    return s


def fmt(v, digits: int = 3) -> str:
    """A number for a table cell ('–' for missing)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def fmt_ci(est: float, lo: float, hi: float) -> str:
    if math.isnan(est):
        return "–"
    if math.isnan(lo):
        return f"{est:+.2f}"
    return f"{est:+.2f} [{lo:+.2f}, {hi:+.2f}]"
