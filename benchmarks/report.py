"""Result rows, the printed table, and ``RESULTS.md`` (machine, date, command, tables)."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Row:
    """One figure: sortpack's value, the same-run baseline, their ratio and the target."""

    bench: str
    figure: str
    ranks: int | None
    value: str
    baseline: str = ""
    ratio: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""

    def status(self) -> str:
        """Return met / MISSED / skipped / error / blank for the table."""
        if self.met is None:
            return ""
        return "met" if self.met else "MISSED"


@dataclass
class Section:
    """A titled extra table (e.g. a stage profile)."""

    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)


def save_json(path: Path | None, results) -> None:
    """Write a script's ``results`` as JSON to ``path`` (its folder made; nothing when None): what
    ``runner.script_results`` reads back."""
    if path is not None:
        import json

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results))


def secs(s: float) -> str:
    """Return seconds in a readable unit."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def speed(baseline_s: float, ours_s: float) -> str:
    """Return how much faster (or slower) ours is than the baseline, e.g. ``12× faster``."""
    r = baseline_s / ours_s if ours_s > 0 else float("inf")
    if r >= 1:
        return f"{r:.0f}× faster" if r >= 10 else f"{r:.2f}× faster"
    return f"{1 / r:.0f}× slower" if 1 / r >= 10 else f"{1 / r:.2f}× slower"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """Return a GitHub markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


ROW_HEADER = ["figure", "P", "sortpack", "baseline (same run)", "ratio", "target", "status", "note"]


def row_cells(r: Row) -> list[str]:
    """Return the table cells of a row."""
    return [r.figure, "" if r.ranks is None else str(r.ranks), r.value, r.baseline, r.ratio, r.target,
            r.status(), r.note]


def plain(header: list[str], rows: list[list[str]]) -> str:
    """Return a fixed-width text table for the terminal."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*(str(c) for c in r)) for r in rows]
    return "\n".join(lines)


def script_log(name: str, scale: str):
    """Print a benchmark script's header line (its scale, the load average, the cores); return its log function."""
    print(f"{name}, scale {scale}, load average {'/'.join(f'{x:.1f}' for x in os.getloadavg())}, "
          f"{os.cpu_count()} cores", flush=True)

    def log(msg: str) -> None:
        print(f"  .. {msg}", flush=True)

    return log


def print_script_results(sections: list, rows: list[Row]) -> None:
    """Print a script-run benchmark's sections, its figures table and the load average (returns nothing)."""
    for sec in sections:
        print(f"\n{sec.title}\n" + plain(sec.header, sec.rows))
    print()
    header = ["figure", "P", "value", "baseline", "ratio", "target", "status", "note"]
    print(plain(header, [row_cells(r) for r in rows]))
    print(f"\nload average at end {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _first_line(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd).stdout.strip()
        return next((ln.strip() for ln in out.splitlines() if ln.strip()), "unknown")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _mpi_version(mpiexec: str) -> str:
    """Return the launcher's version line (MPICH's hydra prints it after a header)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    versioned = [ln for ln in lines if ln.lower().startswith(("version", "mpiexec", "hydra build")) and
                 any(ch.isdigit() for ch in ln)]
    return " ".join((versioned or lines or ["unknown"])[0].split())


def machine(root: Path) -> dict:
    """Return what the results depend on: CPU, cores, RAM, software versions, sortpack commit."""
    import numpy
    import pyarrow

    try:
        import mpi4py

        mpi4py_v = mpi4py.__version__
    except ImportError:
        mpi4py_v = "absent"
    try:
        import tokenizers

        tok_v = tokenizers.__version__
    except ImportError:
        tok_v = "absent"
    mpi = shutil.which("mpiexec")
    commit = _first_line(["git", "rev-parse", "--short", "HEAD"], root)
    changed = _first_line(["git", "status", "--porcelain", "--", "sortpack"], root) not in ("", "unknown")
    import sortpack
    from sortpack import kernels as _k

    backend = getattr(_k, "backend", lambda: "numpy")()
    kernels = "compiled C (_ckernels)" if backend == "c" else "numpy/Python fallback (C kernels not built)"
    return {
        "CPU": _cpu_model(),
        "cores": str(os.cpu_count()),
        "RAM": _ram_gib(),
        "OS": platform.platform(),
        "Python": sys.version.split()[0],
        "numpy / pyarrow / mpi4py / tokenizers": f"{numpy.__version__} / {pyarrow.__version__} / {mpi4py_v} / {tok_v}",
        "MPI": (_mpi_version(mpi) + f" ({mpi})") if mpi else "mpiexec not found",
        "sortpack commit": commit + (" (+ uncommitted changes in sortpack/)" if changed else ""),
        "sortpack kernels": kernels,
        "sortpack imported from": str(Path(sortpack.__file__).parent),
    }


def render_markdown(info: dict, command: str, scale: str, rows: list[Row], sections: list[Section],
                    notes: list[str], elapsed: float) -> str:
    """Return the whole RESULTS.md text."""
    date = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    parts = [f"# sortpack benchmark results ({scale} scale)", "",
             f"- date: {date}", f"- command: `{command}`", f"- suite wall time: {elapsed:.0f} s"]
    parts += [f"- {k}: {v}" for k, v in info.items()]
    parts += ["", "## Figures", "", markdown(ROW_HEADER, [row_cells(r) for r in rows])]
    for s in sections:
        parts += ["", f"## {s.title}", "", markdown(s.header, s.rows)]
    if notes:
        parts += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(parts) + "\n"
