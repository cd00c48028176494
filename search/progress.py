"""Plain progress lines for layerswap's own long-running work: trials of a search, stages of the demo.

`TrialProgress` formats one line per finished trial ("[search] trial 7/20  ok  objective 0.4120
best 0.4550 (#0003)  elapsed 1m12s  ETA 2m05s"), with the ETA from the mean duration of the trials
finished so far and how many run at once. `Stages` prints "[demo] stage 3/5: ... (at 2m52s)" as
each stage starts and keeps the wall time of each; every line says how long the run has been
going, so the log of a run that was killed still shows where its time went. Lines are whole and
plain (no carriage-return redraw), so a log file of a run reads like the terminal did. Used by
search/searcher.py and demo/pipeline.py; tested in tests/search/test_progress.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

Clock = Callable[[], float]
Emit = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)  # flushed: a redirected log shows progress as it happens


def duration(seconds: float) -> str:
    """A short wall time: "7s", "1m12s", "2h05m" (rounded to whole seconds; minutes past 1 h).

    Args:
        seconds: a non-negative duration.
    Returns:
        the text.
    """
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class TrialProgress:
    """One line per finished trial: k/N, status, objective, best so far, elapsed, ETA.

    The ETA is mean(trial duration) × remaining / min(concurrency, remaining): trials run
    `concurrency` at once, and the last one still takes a whole trial. A trial's duration runs
    from `started` to `finished`; one never started (e.g. finished before this object existed)
    counts towards k/N but not towards the mean.
    """

    def __init__(
        self,
        tag: str,
        total: int,
        *,
        done: int = 0,
        best: tuple[float, str] | None = None,
        concurrency: int = 1,
        clock: Clock = time.monotonic,
        emit: Emit = _print,
    ):
        """Args:
        tag: the bracketed prefix, e.g. "search".
        total: N, every trial of the run (those finished before a resume included).
        done: trials already finished (a resumed run's rows).
        best: (objective, label) of the best of those, or None.
        concurrency: trials run at once (may be set later, once known).
        clock: seconds, monotonic; a fake one in tests.
        emit: where a line goes (print, flushed).
        """
        self.tag, self.total, self.done, self.best = tag, total, done, best
        self.concurrency = max(1, concurrency)
        self.clock, self.emit = clock, emit
        self.t0 = clock()
        self._started: dict[str, float] = {}
        self._durations: list[float] = []

    def started(self, key: str) -> None:
        """Record that trial `key` started now."""
        self._started.setdefault(key, self.clock())

    def finished(
        self, key: str, *, status: str, objective: float | None, label: str, detail: str = ""
    ) -> str:
        """Record that trial `key` finished; emit and return its line.

        Args:
            key: what `started` was given.
            status: the trial's outcome (ok, duplicate, pruned, failed).
            objective: its score (higher is better), None when it has none.
            label: how the line names it as the best so far, e.g. "#0003".
            detail: appended after two spaces (e.g. the recipe), "" for nothing.
        Returns:
            the line.
        """
        now = self.clock()
        if key in self._started:
            self._durations.append(now - self._started.pop(key))
        self.done += 1
        if objective is not None and math.isfinite(objective):
            if self.best is None or objective > self.best[0]:
                self.best = (objective, label)
        line = self.line(status, objective, now)
        if detail:
            line += f"  {detail}"
        self.emit(line)
        return line

    def eta(self) -> float | None:
        """Seconds until the last trial finishes, or None before any trial's duration is known."""
        if not self._durations:
            return None
        remaining = max(0, self.total - self.done)
        if remaining == 0:
            return 0.0
        mean = sum(self._durations) / len(self._durations)
        return mean * remaining / min(self.concurrency, remaining)

    def line(self, status: str, objective: float | None, now: float) -> str:
        """The text of a progress line at time `now` (see the class docstring)."""
        obj = "-" if objective is None or not math.isfinite(objective) else f"{objective:.4f}"
        best = "-" if self.best is None else f"{self.best[0]:.4f} ({self.best[1]})"
        eta = self.eta()
        return (
            f"[{self.tag}] trial {self.done}/{self.total}  {status:<9}  objective {obj}  "
            f"best {best}  elapsed {duration(now - self.t0)}  "
            f"ETA {'?' if eta is None else duration(eta)}"
        )


class Stages:
    """Numbered stage lines ("[demo] stage 3/5: merge search ... (at 2m52s)") and each stage's
    wall time; the time since the first stage started closes every line."""

    def __init__(self, tag: str, total: int, *, clock: Clock = time.monotonic, emit: Emit = _print):
        """Args:
        tag: the bracketed prefix, e.g. "demo".
        total: how many stages the run has.
        clock: seconds, monotonic; a fake one in tests.
        emit: where a line goes (print, flushed).
        """
        self.tag, self.total, self.clock, self.emit = tag, total, clock, emit
        self.seconds: dict[str, float] = {}  # stage key -> wall time, in order
        self._n = 0
        self._current: tuple[str, float] | None = None
        self._t0: float | None = None

    def _at(self) -> str:
        return f"(at {duration(self.clock() - self._t0)})"

    def start(self, key: str, text: str) -> str:
        """End the current stage (its time goes to `seconds`), start stage `key`; emit its line.

        Args:
            key: the stage's short name in `seconds`, e.g. "search".
            text: what the line says after "stage k/N: ".
        Returns:
            the line.
        """
        self.end()
        self._n += 1
        self._current = (key, self.clock())
        if self._t0 is None:
            self._t0 = self._current[1]
        line = f"[{self.tag}] stage {self._n}/{self.total}: {text} {self._at()}"
        self.emit(line)
        return line

    def note(self, text: str) -> str:
        """Emit a line that belongs to the current stage ("[demo]   text (at 3m05s)"); return it."""
        line = f"[{self.tag}]   {text}" + ("" if self._t0 is None else f" {self._at()}")
        self.emit(line)
        return line

    def end(self) -> dict[str, float]:
        """End the current stage, if any, and return the wall time of every stage so far."""
        if self._current is not None:
            key, t0 = self._current
            self.seconds[key] = self.seconds.get(key, 0.0) + self.clock() - t0
            self._current = None
        return self.seconds


__all__ = ["Stages", "TrialProgress", "duration"]
