"""Progress of a stage on rank 0: a tqdm bar on a terminal, rate-limited log lines otherwise.

Under ``mpiexec`` or in a Slurm job stderr is a file, so a bar would never show: there a
``Progress`` writes a plain line such as::

    sortpack: rank 0 of 4: analyze 45% 1.1M/2.5M rows, 1.2M rows/s, 3.1M tokens, eta 5 s

at most one every ``interval`` seconds or every ``step`` of the total, whichever comes
first, plus a closing ``done`` line. Only rank 0 reports, and only its own share (other
ranks' progress is not visible without communication, and a collective inside a loop
would hang ranks with different unit counts); the ``rank 0 of P`` prefix says so.
A stage shorter than ``delay`` seconds prints nothing at all, so small jobs and error
messages stay clean. The CLI turns reporting on for rank 0 unless ``--quiet``
(``configure``); library calls stay silent unless they call ``configure(True)``.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple, TextIO

_DEFAULTS = {"enabled": False, "ranks": 1}
_current: dict[str, Progress] = {}  # the latest open reporter: ``phase`` reports to it
_clocks: list[tuple[dict[str, float], list[float]]] = []  # open ``phase_times`` blocks: (seconds by phase, last mark)


def configure(enabled: bool, ranks: int = 1) -> None:
    """Set whether reporters created without ``enabled`` report, and the job's rank count."""
    _DEFAULTS["enabled"] = bool(enabled)
    _DEFAULTS["ranks"] = max(int(ranks), 1)


@contextmanager
def silenced() -> Iterator[None]:
    """Within the block, reporters created without ``enabled`` report nothing (a stage run dry, on no rows)."""
    before = dict(_DEFAULTS)
    _DEFAULTS["enabled"] = False
    try:
        yield
    finally:
        _DEFAULTS.update(before)


def _delay() -> float:
    """Return the seconds a stage runs before it reports (``SORTPACK_PROGRESS_DELAY``, default 2)."""
    try:
        return max(float(os.environ.get("SORTPACK_PROGRESS_DELAY", "2")), 0.0)
    except ValueError:
        return 2.0


def human(x: float) -> str:
    """Return ``x`` with a k/M/G suffix and one decimal (``4.5M``); small integers as they are."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.1f}{suffix}"
    return f"{x:.1f}" if isinstance(x, float) and not float(x).is_integer() else str(int(x))


def duration(seconds: float) -> str:
    """Return a duration as ``42 s``, ``17 min`` or ``2.8 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Display(NamedTuple):
    """Whether a ``Progress`` reports, for how many ranks, where its lines go and how often.

    Parameters
    ----------
    enabled : bool, optional
        Report at all (rank 0 and not ``--quiet``); None takes ``configure``'s setting.
    ranks : int, optional
        Ranks of the job; above 1 lines say ``rank 0 of P`` (only rank 0's share is shown);
        None takes ``configure``'s setting.
    clock : callable
        Seconds since an arbitrary origin; tests pass a fake one.
    stream : file, optional
        Where lines go (stderr); a bar is used when it is a terminal.
    interval, step : float
        At most one line per ``interval`` seconds or per ``step`` of the total.
    delay : float, optional
        Seconds before the first line (None: ``SORTPACK_PROGRESS_DELAY``, default 2).
    bar : bool, optional
        Force (True) or forbid (False) the tqdm bar; None: when ``stream`` is a terminal.
    """

    enabled: bool | None = None
    ranks: int | None = None
    clock: Callable[[], float] = time.monotonic
    stream: TextIO | None = None
    interval: float = 10.0
    step: float = 0.1
    delay: float | None = None
    bar: bool | None = None


_AS_CONFIGURED = Display()


class Progress:
    """Reports one stage's progress on this process's stderr.

    Parameters
    ----------
    stage : str
        The stage's name as printed (``analyze``, ``sort``, ``pack``, ``write index``).
    total : int or None
        Units this process will do; None when unknown (no percentage or eta).
    unit : str
        What ``update`` counts (``rows``, ``shards``, ``phases``).
    job_total : int, optional
        Units of the whole job, where known without communication (printed beside rank 0's share).
    display : Display
        Whether it reports and how (default: as ``configure`` set, lines on stderr).
    """

    def __init__(self, stage: str, total: int | None, unit: str = "rows", job_total: int | None = None,
                 display: Display = _AS_CONFIGURED):
        self.stage, self.total, self.unit, self.job_total = stage, total, unit, job_total
        enabled, bar, clock = display.enabled, display.bar, display.clock
        self.enabled = _DEFAULTS["enabled"] if enabled is None else bool(enabled)
        self.clock, self.stream = clock, display.stream if display.stream is not None else sys.stderr
        self.ranks = _DEFAULTS["ranks"] if display.ranks is None else display.ranks
        self.interval, self.step = display.interval, display.step
        self.delay = _delay() if display.delay is None else display.delay
        self.done = 0
        self.extra: dict[str, int] = {}  # counters such as tokens, summed
        self.phase_name: str | None = None
        self.lines = 0  # log lines written
        self._bar = None
        if not self.enabled:
            return
        self.start = self.last_time = clock()
        self.last_done = 0
        if bar if bar is not None else _isatty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=f" {unit}", desc=stage, file=self.stream, leave=False,
                             delay=self.delay, unit_scale=True, dynamic_ncols=True)
        _current["open"] = self

    def update(self, n: int = 1, phase: str | None = None, **extra: int) -> None:
        """Count ``n`` more units (``extra`` counters such as ``tokens=`` are summed too)."""
        if not self.enabled:
            return
        self.done += int(n)
        for k, v in extra.items():
            self.extra[k] = self.extra.get(k, 0) + int(v)
        if phase is not None:
            self.phase_name = phase
        if self._bar is not None:
            self._bar.update(int(n))
            if self.extra or phase:
                post = {k: human(v) for k, v in self.extra.items()}
                self._bar.set_postfix(post if not phase else {"phase": phase, **post}, refresh=False)
            return
        now = self.clock()
        if now - self.start < self.delay:
            return
        due_time = now - self.last_time >= self.interval
        total = self.total or 0
        due_step = total != 0 and (self.done - self.last_done) >= self.step * total
        finished = self.total is not None and self.done >= self.total  # ``close`` says it
        if (due_time or due_step) and not finished:
            self._write(self.line(now))
            self.last_time, self.last_done = now, self.done

    def close(self) -> None:
        """End the stage: the bar goes, and a ``done`` line follows when the stage reported at all."""
        if not self.enabled:
            return
        self.enabled = False
        if _current.get("open") is self:
            del _current["open"]
        if self._bar is not None:
            self._bar.close()
            return
        now = self.clock()
        if self.lines or now - self.start >= self.delay:
            self._write(self.line(now, final=True))

    def line(self, now: float, final: bool = False) -> str:
        """Return the log line describing the progress at time ``now``."""
        elapsed = max(now - self.start, 0.0)
        who = f"rank 0 of {self.ranks}: " if self.ranks > 1 else ""
        counted = human(self.done)
        if self.total and not final:
            total = max(self.total, self.done)  # a total estimated from bytes may fall short
            counted = f"{100 * self.done / total:.0f}% {counted}/{human(total)}"
        parts = [f"{counted} {self.unit}"]
        if self.ranks > 1 and self.job_total is not None:
            parts[0] += f" (job {human(self.job_total)})"
        if self.unit != "phases" and elapsed > 0 and self.done:
            parts.append(f"{human(self.done / elapsed)} {self.unit}/s")
        parts += [f"{human(v)} {k}" for k, v in self.extra.items()]
        if final:
            parts.append(duration(elapsed) if elapsed >= 120 else f"{elapsed:.1f} s")
        elif self.phase_name:
            parts.append(f"phase {self.phase_name}")
        if not final and self.total and self.done and self.done < self.total:
            parts.append(f"eta {duration(elapsed * (self.total - self.done) / self.done)}")
        return f"sortpack: {who}{self.stage}{' done' if final else ''} " + ", ".join(parts)

    def _write(self, text: str) -> None:
        self.lines += 1
        print(text, file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def phase(name: str) -> None:
    """Count one finished phase ``name`` on the latest open reporter, and time it in the innermost ``phase_times``.

    The phase's time is this rank's wall time since the previous ``phase`` call (or the block's start);
    a phase named twice adds up.
    """
    if _clocks:
        times, last = _clocks[-1]
        now = time.perf_counter()
        times[name] = times.get(name, 0.0) + now - last[0]
        last[0] = now
    if "open" in _current:
        _current["open"].update(1, phase=name)


@contextmanager
def phase_times() -> Iterator[dict[str, float]]:
    """Yield the dict that collects, per phase name, the seconds of the phases ended inside the block."""
    times: dict[str, float] = {}
    _clocks.append((times, [time.perf_counter()]))
    try:
        yield times
    finally:
        _clocks.pop()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
