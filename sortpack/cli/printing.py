"""What the CLI prints: errors, and the lines that sum up a finished job."""
from __future__ import annotations

import sys
from typing import NoReturn

import click

from ..errors import one_line


def echo_err(msg: str) -> None:
    """Print ``msg`` on standard error."""
    click.echo(msg, err=True)


def fail(exc: Exception) -> NoReturn:
    """Print ``exc`` as one ``Error:`` line and exit with status 2."""
    echo_err(f"Error: {one_line(exc)}")
    sys.exit(2)


def summary_line(path: str, m: dict) -> str:
    """Return the line that says what a job wrote to ``path`` (manifest ``m``)."""
    s = m["stats"]
    if m["format"] == "sortpack-index":
        return (f"wrote {path}: {m['num_microbatches']} micro-batches, {m['num_samples']} samples, "
                f"padding {100 * s['padding_ratio']:.2f}%, {s['distinct_shapes']} shapes, "
                f"{len(m['shards'])} shards, content_hash {m['content_hash'][:16]}")
    return (f"wrote {path}: {m['num_samples']} samples, sizes {s['size_min']}..{s['size_max']}, "
            f"{len(m['shards'])} shards, content_hash {m['content_hash'][:16]}")


def oversize_note(m: dict) -> str | None:
    """Return the line that says how many samples --oversize skipped, truncated or split (None: none)."""
    s = m.get("stats", {})
    skipped, truncated = int(s.get("skipped", 0) or 0), int(s.get("truncated", 0) or 0)
    total = int(m.get("num_samples", 0)) + skipped
    if skipped and skipped == total:
        return (f"sortpack: warning: --oversize skip dropped all {skipped} samples (none fits the budget alone): "
                f"the index is empty")
    if skipped:
        return f"sortpack: --oversize skip dropped {skipped} of {total} samples (larger than the budget alone)"
    if truncated:
        lost = s.get("truncated_tokens")
        return (f"sortpack: --oversize truncate cut {truncated} of {total} samples to fit the budget"
                + (f" ({lost} tokens dropped; --oversize split keeps them)" if lost else ""))
    split = int(s.get("split", 0) or 0)
    if split:
        unit = SIZE_UNITS.get(str(m.get("options", {}).get("size") or "length"), "size units")
        if "mixture" in m:  # cut in the sources; the blend then uses each piece as the schedule says
            return (f"sortpack: --oversize split cut {split} of the sources' samples into {s.get('split_pieces', 0)} "
                    f"pieces that fit the budget ({s.get('split_tokens', 0)} {unit} of the sources, none lost in "
                    f"the cut; the plan uses them as the schedule says)")
        return (f"sortpack: --oversize split cut {split} samples into {s.get('split_pieces', 0)} pieces that fit "
                f"the budget ({s.get('split_tokens', 0)} {unit}, none lost)")
    return None


# what a split's units are, by --size: the unit its pieces are cut in
SIZE_UNITS = {"tokens": "tokens", "bytes": "bytes", "length": "characters or list elements"}


def holdout_note(m: dict) -> str | None:
    """Return the line that says the held-out plan holds fewer samples than were held out (None: it holds them all).

    The held-out samples are chosen by sample id before packing, so a held-out sample without
    content is chosen like any other and then dropped with the other empty samples.
    """
    h = m.get("holdout") or {}
    dropped = int(h.get("empty_dropped", 0) or 0)
    if not dropped:
        return None
    return (f"sortpack: --holdout held out {h.get('num_samples', 0)} samples, {dropped} of them empty (no content; "
            f"dropped as in training, --keep-empty keeps them): {h.get('directory', 'holdout')}/ plans "
            f"{int(h.get('num_samples', 0)) - dropped} of them")


def profile_table(p: dict, exchange: dict | None = None) -> str:
    """Return the --profile table: wall time and bytes per stage and phase, start-up, peak memory (max over ranks)."""
    stages = [name for name, v in p.items() if isinstance(v, dict)]
    w = max([len("stage")] + [len(name) for name in stages]
            + [2 + len(ph) for name in stages for ph in p[name].get("phases", {})])
    lines = [f"{'stage':<{w}} {'wall s':>9} {'alltoallv MB (max rank)':>24}"]
    for name in stages:
        v = p[name]
        lines.append(f"{name:<{w}} {v['wall_s']:>9.3f} {v['alltoallv_bytes_max'] / 1e6:>24.1f}")
        for ph, secs in v.get("phases", {}).items():  # this rank's phases, max over ranks each
            lines.append(f"{'  ' + ph:<{w}} {secs:>9.3f}")
    if p.get("startup_s") is not None:
        lines.append(f"start-up (process start to the first stage, max rank): {p['startup_s']:.3f} s"
                     + (f", {p['startup_cpu_s']:.3f} s CPU" if "startup_cpu_s" in p else ""))
    if p.get("outside_stages_s") is not None:
        lines.append(f"between stages (after the first stage began, in none; max rank): {p['outside_stages_s']:.3f} s")
        lines.append(f"process start to the manifest (max rank): {p['process_s']:.3f} s, CPU per rank "
                     f"{', '.join(f'{c:.2f}' for c in p['cpu_s_per_rank'])} s; the rest of a launcher's wall "
                     "is the launch, the manifest's rename and the exit")
    lines.append(f"peak RSS (max rank): {p['peak_rss_bytes_max'] / 2**20:.1f} MiB")
    if p.get("peak_rss_bytes_per_rank"):
        lines.append(f"peak RSS per rank (MiB): {', '.join(f'{b / 2**20:.0f}' for b in p['peak_rss_bytes_per_rank'])}")
    if exchange:
        lines.append(f"--store: memory limit {exchange['memory_limit'] / 2**20:.1f} MiB per rank, "
                     f"{exchange['rounds']} rounds, {exchange.get('spills', 0)} spills")
    if p.get("analyze_rows_per_rank"):
        lines.append(f"analyze rows per rank: {', '.join(map(str, p['analyze_rows_per_rank']))}")
    return "\n".join(lines)
