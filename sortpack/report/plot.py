"""``sortpack inspect --plot``: one PNG a person reads to judge a packing.

An index gets six panels: the sample-size distribution (log axis, p50/p90/p99), the fill
of every micro-batch in index order, tokens per rank per step at ``--world-size`` /
``--grad-accum`` (a heat map) with the step imbalance beside it, the most frequent
micro-batch shapes, and the learning-rate scale a linear rule would give each step. A
metrics or sorted directory has no micro-batches: it gets the size distribution only.
matplotlib is imported only here, lazily, and draws with the Agg canvas (no display).
"""
from __future__ import annotations

import numpy as np

from ..errors import SortpackError
from ..format.manifest import read_manifest
from ..format.shards import read_rows
from .inspect import DEFAULT_COST_COEFF, IndexColumns, compute_cost, imbalance, step_costs

MAX_POINTS = 2000  # series longer than this are drawn as per-bin mean with a min..max band
TOP_SHAPES = 15


def _matplotlib():
    """Return (Figure, FigureCanvasAgg), or raise the one-line install hint."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise SortpackError("--plot needs matplotlib: pip install 'sortpack[plot]'") from None
    return Figure, FigureCanvasAgg


def _columns(directory: str, manifest: dict, names: list[str]) -> dict[str, np.ndarray]:
    table = read_rows(directory, manifest, 0, manifest["num_rows"], names)
    return {n: table.column(n).to_numpy() for n in names}


def weighted_quantiles(values: np.ndarray, weights: np.ndarray | None, qs) -> np.ndarray:
    """Return, per q in ``qs``, the smallest value whose cumulative weight reaches q of the total.

    ``weights`` None counts every value once.
    """
    if weights is None:
        n = len(values)
        idx = [max(int(np.ceil(q * n)) - 1, 0) for q in qs]
        return np.partition(values, idx)[idx] if n else np.zeros(len(qs))
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if len(values) == 0:
        return np.zeros(len(qs))
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    pos = np.searchsorted(cum, np.asarray(qs) * cum[-1], side="left")
    return values[order][np.minimum(pos, len(values) - 1)]


def _binned(y: np.ndarray, bins: int = MAX_POINTS):
    """Return (x centres, mean, min, max) of ``y`` in at most ``bins`` equal runs of positions."""
    n = len(y)
    edges = np.unique(np.linspace(0, n, min(bins, n) + 1).astype(np.int64))
    starts = edges[:-1]
    sums = np.add.reduceat(y, starts)
    counts = np.diff(edges)
    return ((starts + edges[1:] - 1) / 2, sums / counts, np.minimum.reduceat(y, starts),
            np.maximum.reduceat(y, starts))


def _size_panel(ax, sizes: np.ndarray, weights: np.ndarray | None, title: str, xlabel: str) -> None:
    positive = sizes[sizes > 0] if weights is None else sizes
    lo, hi = (max(int(positive.min()), 1), max(int(positive.max()), 2)) if len(positive) else (1, 2)
    bins = np.geomspace(lo, hi * 1.0001, 60) if hi > lo else np.array([lo * 0.9, hi * 1.1])
    ax.hist(np.maximum(sizes, lo), bins=bins, weights=weights, color="#4c72b0")
    ax.set_xscale("log")
    for q, v, style in zip(("p50", "p90", "p99"), weighted_quantiles(sizes, weights, [0.5, 0.9, 0.99]),
                           ("-", "--", ":")):
        ax.axvline(max(v, lo), color="#c44e52", linestyle=style, linewidth=1.2, label=f"{q} {int(v)}")
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("samples")


def _series_panel(ax, y: np.ndarray, color: str, label: str | None = None) -> None:
    """Draw ``y`` over its positions, binned when long."""
    if len(y) <= MAX_POINTS:
        ax.plot(np.arange(len(y)), y, ".", markersize=2.5, color=color, label=label)
        return
    x, mean, lo, hi = _binned(y.astype(np.float64))
    ax.fill_between(x, lo, hi, color=color, alpha=0.25, linewidth=0)
    ax.plot(x, mean, color=color, linewidth=1, label=label)


def plot_directory(directory: str, path: str, world_size: int | None = None, grad_accum: int = 1,
                   cost_coeff: float | None = None):
    """Write the inspect figure of a directory to the PNG ``path``; return the matplotlib Figure.

    ``cost_coeff``: C of the compute panel's cost C*s + s^2 (default ``DEFAULT_COST_COEFF``).
    """
    Figure, FigureCanvasAgg = _matplotlib()
    m = read_manifest(directory)
    if m["_kind"] != "index":
        size = _columns(directory, m, ["size"])["size"].astype(np.int64)
        fig = Figure(figsize=(7, 4.2))
        ax = fig.add_subplot(1, 1, 1)
        _size_panel(ax, size, None, f"sample sizes ({m['num_samples']:,} samples)", "size (log)")
        fig.suptitle(f"{directory} ({m['_kind']})", fontsize=10)
    else:
        coeff = DEFAULT_COST_COEFF if cost_coeff is None else cost_coeff
        fig = _plot_index(directory, m, world_size, grad_accum, coeff)
    fig.tight_layout()
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)
    return fig


def _plot_index(directory: str, m: dict, world_size: int | None, accum: int, cost_coeff: float):
    """Return the seven-panel figure of an index directory (an eighth, the shares, for a mixture).

    ``world_size`` None: one rank, and the rank panel's title says how to split by rank.
    """
    Figure, _ = _matplotlib()
    world, world_assumed = world_size or 1, world_size is None
    if world < 1:
        raise SortpackError(f"--world-size {world}: must be >= 1")
    if accum < 1:
        raise SortpackError(f"--grad-accum {accum}: must be >= 1")
    cols = IndexColumns.read(directory, m)
    ns, bs, ps, tok = cols.num_samples, cols.batch_size, cols.padded_size, cols.tokens
    padded = cols.padded
    mixture = bool(m.get("mixture"))  # a last panel below: achieved shares against the schedule
    fig = Figure(figsize=(15, 16.5 if mixture else 12.5))
    axes = [fig.add_subplot(4 if mixture else 3, 3, k) for k in range(1, 8)]

    # a micro-batch of sorted samples holds nearly equal sizes: its max size stands for each;
    # packed rows mix sizes, so there it is only an upper bound
    bound = " (upper bound: rows mix sizes)" if m["options"].get("rows") else ""
    _size_panel(axes[0], _columns(directory, m, ["max_size"])["max_size"].astype(np.int64), ns.astype(np.float64),
                f"sample sizes ({m['num_samples']:,} samples)", f"max size of the sample's micro-batch{bound}, log")
    _fill_panel(axes[1], tok, padded)
    per_rank = step_costs(tok, world, accum) if len(tok) else np.zeros((1, world), np.int64)
    per_rank_padded = step_costs(padded, world, accum) if len(tok) else np.zeros((1, world), np.int64)
    note = " (--world-size to split by rank)" if world_assumed else f" (W={world}, A={accum})"
    _rank_heat_panel(fig, axes[2], per_rank, world, note)
    _imbalance_panel(axes[3], per_rank, per_rank_padded, world)
    _shapes_panel(axes[4], bs, ps)
    _lr_panel(axes[5], step_costs(ns, world, accum).sum(axis=1) if len(ns) else np.zeros(1, np.int64))
    compute = compute_cost(m, cols, cost_coeff)
    _compute_panel(axes[6], None if compute is None or not len(tok) else step_costs(compute, world, accum),
                   world, cost_coeff)
    if mixture:
        from .mixture import shares_panel

        shares_panel(fig.add_subplot(4, 1, 4), m, tok, _columns(directory, m, ["source"])["source"])

    fig.suptitle(f"{directory}: {m['num_microbatches']:,} micro-batches, {m['num_samples']:,} samples, "
                 f"{per_rank.shape[0]:,} steps", fontsize=11)
    return fig


def _fill_panel(ax, tok: np.ndarray, padded: np.ndarray) -> None:
    """Draw each micro-batch's fill (real over padded tokens) in index order."""
    fill = np.where(padded > 0, tok / np.maximum(padded, 1), 1.0)
    _series_panel(ax, fill, "#55a868")
    total_fill = tok.sum() / padded.sum() if padded.sum() else 1.0
    ax.set_ylim(min(0.0, float(fill.min()) if len(fill) else 0.0), 1.02)
    ax.set_title(f"fill per micro-batch (overall {100 * total_fill:.2f}%)")
    ax.set_xlabel("micro-batch (index order)")
    ax.set_ylabel("tokens / (batch_size x padded_size)")


def _rank_heat_panel(fig, ax, per_rank: np.ndarray, world: int, note: str) -> None:
    """Draw the tokens of every rank at every step as a heat map, binned past MAX_POINTS steps."""
    from matplotlib.ticker import MaxNLocator

    steps = per_rank.shape[0]
    heat = per_rank.T.astype(np.float64)
    if steps > MAX_POINTS:
        edges = np.linspace(0, steps, MAX_POINTS + 1).astype(np.int64)
        heat = np.add.reduceat(heat, edges[:-1], axis=1) / np.diff(edges)
    img = ax.imshow(heat, aspect="auto", interpolation="nearest", cmap="viridis",
                    extent=(0, steps, world - 0.5, -0.5))
    fig.colorbar(img, ax=ax, label="tokens")
    ax.set_title(f"tokens per rank per step{note}")
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _imbalance_panel(ax, per_rank: np.ndarray, per_rank_padded: np.ndarray, world: int) -> None:
    """Draw each step's max over mean rank cost, for real and for padded tokens."""
    for costs, color, label in ((per_rank, "#4c72b0", "tokens"), (per_rank_padded, "#dd8452", "padded tokens")):
        mean = costs.mean(axis=1)
        ratio = np.where(mean > 0, costs.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
        _series_panel(ax, ratio, color, f"{label}: worst {ratio.max():.3f}, mean {ratio.mean():.3f}")
    ax.set_title(f"step imbalance: max / mean over {world} ranks")
    ax.set_xlabel("step")
    ax.set_ylabel("max / mean")
    ax.legend(fontsize=8, loc="upper right")


def _compute_panel(ax, costs: np.ndarray | None, world: int, cost_coeff: float) -> None:
    """Draw each step's max over mean rank compute (C*s + s^2 per document), with the weighted figure."""
    if costs is None:
        ax.set_title("compute: the plan records no attention work")
        return
    mean = costs.mean(axis=1)
    ratio = np.where(mean > 0, costs.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
    fig = imbalance(costs)
    _series_panel(ax, ratio, "#c44e52", f"p99 {fig['p99']:.3f}, max {fig['max']:.3f}")
    ax.set_title(f"compute imbalance over {world} ranks (C={cost_coeff:g}): weighted {fig['weighted']:.4f}")
    ax.set_xlabel("step")
    ax.set_ylabel("max / mean compute")
    ax.legend(fontsize=8, loc="upper right")


def _shapes_panel(ax, bs: np.ndarray, ps: np.ndarray) -> None:
    """Draw the most common (batch_size x padded_size) shapes and their counts."""
    from matplotlib.ticker import MaxNLocator

    shapes, counts = np.unique(np.stack([bs, ps], axis=1), axis=0, return_counts=True) if len(bs) else \
        (np.zeros((0, 2), np.int64), np.zeros(0, np.int64))
    top = np.argsort(-counts, kind="stable")[:TOP_SHAPES]
    labels = [f"{b} x {p}" for b, p in shapes[top]]
    ax.barh(np.arange(len(top)), counts[top], color="#8172b2")
    ax.set_yticks(np.arange(len(top)), labels, fontsize=8)
    ax.invert_yaxis()
    shown = counts[top].sum() / max(counts.sum(), 1)
    ax.set_title(f"{len(counts):,} distinct shape{'s' if len(counts) != 1 else ''}; "
                 f"the top {len(top)} hold {100 * shown:.0f}% of micro-batches")
    ax.set_xlabel("micro-batches")
    ax.set_ylabel("batch_size x padded_size")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _lr_panel(ax, step_samples: np.ndarray) -> None:
    """Draw each step's LR scale under the linear rule (step samples over their median)."""
    from matplotlib.ticker import FuncFormatter

    ref = float(np.median(step_samples)) or 1.0
    scale = step_samples / ref
    _series_panel(ax, scale, "#c44e52")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    if scale.max() > 4 * max(scale.min(), 1e-9) and scale.min() > 0:
        ax.set_yscale("log")  # small-sample and large-sample steps both stay readable
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    ax.set_title(f"LR scale, linear rule (step samples / median {ref:g})")
    ax.set_xlabel("step")
    ax.set_ylabel("LR multiplier")


def axes_titles(fig) -> list[str]:
    """Return the titles of the figure's panels in order (colour bars have none and are left out)."""
    return [ax.get_title() for ax in fig.axes if ax.get_title()]
