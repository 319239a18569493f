"""``sortpack inspect`` of a mixture plan: per-source figures, the prefix bound, the shares panel.

Everything is recomputed from the index's ``tokens``, ``source``, ``num_samples``,
``batch_size`` and ``padded_size`` columns in plan order and the manifest's ``mixture``
schedule, so inspect checks what the writer recorded rather than repeating it.
"""
from __future__ import annotations

import numpy as np

from ..inputs.schedule import deviations, schedule_from_dict

SHARE_BINS = 200  # the shares panel: achieved shares in at most this many equal spans of the run's tokens
MBS_PER_BIN = 20  # ... and spans of at least about this many micro-batches (a span of one is all one source)


def mixture_report(manifest: dict, cols: dict[str, np.ndarray]) -> dict:
    """Return the ``mixture`` section of an index report (JSON-ready)."""
    mix = manifest["mixture"]
    names = [s["name"] for s in mix["sources"]]
    schedule = schedule_from_dict(mix["schedule"], names)
    tok = cols["tokens"].astype(np.int64)
    src = cols["source"].astype(np.int64)
    ns = cols["num_samples"].astype(np.int64)
    padded = cols["batch_size"].astype(np.int64) * cols["padded_size"].astype(np.int64)
    total = float(mix["target_tokens"])
    dev = deviations(tok, src, schedule, total)
    all_tokens = int(tok.sum())
    shares = schedule.shares()
    bound = int(tok.max()) if len(tok) else 0
    if mix.get("unit", "microbatch") != "microbatch" and len(tok):
        bound = int(mix["bound_tokens"])  # same-shape groups move whole: the bound is a group's tokens
    sources = []
    for s, rec in enumerate(mix["sources"]):
        mine = src == s
        t, p = int(tok[mine].sum()), int(padded[mine].sum())
        sources.append({
            "name": rec["name"], "tokens": t, "samples": int(ns[mine].sum()),
            "unique_samples": int(rec["unique_samples"]), "microbatches": int(mine.sum()),
            "passes": float(rec["passes"]), "share": t / all_tokens if all_tokens else 0.0,
            "scheduled_share": float(shares[s]),
            "padding_ratio": (1.0 - t / p) if p else 0.0,
            "max_deviation_tokens": float(dev[s]),
            **({"targets": int(cols["targets"][mine].sum())} if "targets" in cols else {}),
        })
    worst = float(dev.max()) if len(dev) else 0.0
    return {"num_sources": len(names), "tokens": all_tokens, "total_tokens": mix.get("total_tokens"),
            "target_tokens": total, "interleave": mix.get("interleave"), "bound_tokens": bound,
            "max_deviation_tokens": worst, "max_deviation_of_bound": worst / bound if bound else 0.0,
            "sources": sources}


def render_mixture(section: dict) -> str:
    """Return the mixture section as indented lines for ``sortpack inspect``."""
    lines = [f"{section['num_sources']} sources, {section['tokens']} tokens (target {section['target_tokens']:.0f}), "
             f"interleave {section['interleave']}"]
    width = max(len(s["name"]) for s in section["sources"])
    for s in section["sources"]:
        lines.append(f"  {s['name']:<{width}}  tokens {s['tokens']} (share {s['share']:.4f}, scheduled "
                     f"{s['scheduled_share']:.4f}), samples {s['samples']} ({s['unique_samples']} distinct), "
                     f"passes {s['passes']:.3f}, padding {100 * s['padding_ratio']:.2f}%, "
                     f"max deviation {s['max_deviation_tokens']:.0f} tokens")
    lines.append(f"  largest deviation from the schedule over every prefix: {section['max_deviation_tokens']:.0f} "
                 f"tokens = {section['max_deviation_of_bound']:.3f} of the largest micro-batch "
                 f"({section['bound_tokens']} tokens)")
    return "\n".join(lines)


def shares_panel(ax, manifest: dict, tokens: np.ndarray, source: np.ndarray) -> None:
    """Draw each source's achieved share per span of the run (solid) against the schedule (dashed)."""
    mix = manifest["mixture"]
    names = [s["name"] for s in mix["sources"]]
    schedule = schedule_from_dict(mix["schedule"], names)
    tok = tokens.astype(np.int64)
    x = np.cumsum(tok)
    total = float(x[-1]) if len(x) else 1.0
    bins = int(np.clip(len(tok) // MBS_PER_BIN, 1, SHARE_BINS))
    edges = np.linspace(0.0, total, bins + 1)
    centre = (edges[:-1] + edges[1:]) / 2 / total
    knots = np.concatenate(([0.0], schedule.ends))
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"]
    for s, name in enumerate(names):
        cum = np.concatenate(([0], np.cumsum(np.where(source == s, tok, 0)))).astype(np.float64)
        xs = np.concatenate(([0], x)).astype(np.float64)
        got = np.interp(edges, xs, cum)  # the source's tokens up to each edge
        share = np.diff(got) / np.diff(edges)
        color = colors[s % len(colors)]
        ax.plot(centre, share, color=color, linewidth=1.2, label=f"{name} (achieved)")
        ax.step(knots, np.concatenate((schedule.weights[:, s], schedule.weights[-1:, s])), where="post",
                color=color, linestyle="--", linewidth=1, label=f"{name} (schedule)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title(f"mixture: achieved share per 1/{bins} of the run (solid) vs schedule (dashed)")
    ax.set_xlabel("fraction of the run's tokens")
    ax.set_ylabel("share of tokens")
    ax.legend(fontsize=7, loc="best", ncol=2)
