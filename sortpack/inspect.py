"""``sortpack inspect``: summary figures of a metrics, sorted or index directory."""
from __future__ import annotations

import numpy as np

from .errors import SortpackError
from .format.manifest import read_manifest
from .format.shards import read_rows


def _column(directory: str, manifest: dict, name: str) -> np.ndarray:
    return read_rows(directory, manifest, 0, manifest["num_rows"], [name]).column(0).to_numpy()


def _quantiles(x: np.ndarray) -> dict:
    if len(x) == 0:
        return {"min": 0, "median": 0, "max": 0}
    return {"min": _num(x.min()), "median": _num(np.median(x)), "max": _num(x.max())}


def _num(v):
    v = float(v)
    return int(v) if v.is_integer() else v


def step_costs(cost: np.ndarray, world_size: int, grad_accum: int) -> np.ndarray:
    """Return the (steps, world_size) cost of each rank in each step (tail padded from the start)."""
    per_step = world_size * grad_accum
    m = len(cost)
    steps = max(1, -(-m // per_step))
    idx = np.arange(steps * per_step) % m
    # rank r takes micro-batches s*W*A + a*W + r: reshape to (steps, A, W) and sum over A
    return cost[idx].reshape(steps, grad_accum, world_size).sum(axis=1)


def inspect_directory(directory: str, world_size: int | None = None, grad_accum: int = 1) -> dict:
    """Return the inspect report of a directory as a JSON-ready dict."""
    m = read_manifest(directory)
    kind = m["_kind"]
    report = {"directory": str(directory), "kind": kind, "format": m["format"], "version": m["version"],
              "num_samples": m["num_samples"], "num_shards": len(m["shards"]),
              "content_hash": m["content_hash"], "options": m["options"]}
    if kind != "index":
        size = _column(directory, m, "size")
        report.update({"size": {**_quantiles(size), "mean": float(size.mean()) if len(size) else 0.0,
                                "sum": int(size.sum())}})
        if kind == "sorted" and "stage_counts" in m["stats"]:
            report["stage_counts"] = m["stats"]["stage_counts"]
        return report
    if world_size is not None and world_size < 1:
        raise SortpackError(f"--world-size {world_size}: must be >= 1")
    if grad_accum < 1:
        raise SortpackError(f"--grad-accum {grad_accum}: must be >= 1")
    table = read_rows(directory, m, 0, m["num_rows"], ["num_samples", "batch_size", "padded_size", "tokens"])
    ns, bs, ps, tok = (table.column(i).to_numpy().astype(np.int64) for i in range(4))
    padded = bs * ps
    shapes = np.unique(np.stack([bs, ps]), axis=1) if len(bs) else np.zeros((2, 0))
    total_padded = int(padded.sum())
    report.update({
        "num_microbatches": m["num_microbatches"],
        "tokens": int(tok.sum()),
        "padded_tokens": total_padded,
        "padding_ratio": (1.0 - tok.sum() / total_padded) if total_padded else 0.0,
        "fill": float(tok.sum() / total_padded) if total_padded else 1.0,
        "distinct_shapes": int(shapes.shape[1]),
        "samples_per_microbatch": _quantiles(ns),
        "padded_size": _quantiles(ps),
        "skipped": m["stats"].get("skipped", 0),
        "truncated": m["stats"].get("truncated", 0),
    })
    if m.get("data"):
        from .format.data_shards import describe_data

        report["data"] = describe_data(m["data"])
    if world_size is not None and len(padded):
        costs = step_costs(padded, world_size, grad_accum)
        mean = costs.mean(axis=1)
        ratio = np.where(mean > 0, costs.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
        report.update({"world_size": world_size, "grad_accum": grad_accum, "steps": int(costs.shape[0]),
                       "step_imbalance": float(ratio.max()), "step_imbalance_mean": float(ratio.mean())})
    return report


def render(report: dict) -> str:
    """Return the report as an aligned human-readable table."""
    rows = []
    for key, value in report.items():
        if key == "options":
            value = ", ".join(f"{k}={v}" for k, v in value.items() if v not in (None, [], False))
        elif isinstance(value, dict):
            value = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())
        elif isinstance(value, float):
            value = f"{100 * value:.2f}%" if key in ("padding_ratio", "fill") else f"{value:.4f}"
        rows.append((key, str(value)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def plot_directory(directory: str, path: str) -> None:
    """Write a PNG histogram of sample sizes (metrics/sorted) or padded sizes (index)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SortpackError("--plot needs matplotlib (pip install 'sortpack[plot]')") from None
    m = read_manifest(directory)
    fig, ax = plt.subplots(figsize=(7, 4))
    if m["_kind"] == "index":
        ps = _column(directory, m, "padded_size")
        ns = _column(directory, m, "num_samples")
        ax.scatter(ps, ns, s=4, alpha=0.5)
        ax.set_xlabel("padded length")
        ax.set_ylabel("samples per micro-batch")
        ax.set_title(f"{m['num_microbatches']} micro-batches")
    else:
        size = _column(directory, m, "size")
        ax.hist(size, bins=100)
        ax.set_xlabel("size")
        ax.set_ylabel("samples")
        ax.set_title(f"{m['num_samples']} samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
