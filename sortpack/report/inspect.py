"""``sortpack inspect``: summary figures of a metrics, sorted or index directory."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SortpackError
from ..format.manifest import read_manifest
from ..format.schemas import measure_names, padded_plan, plan_caps
from ..format.shards import read_rows


def _column(directory: str, manifest: dict, name: str) -> np.ndarray:
    return read_rows(directory, manifest, 0, manifest["num_rows"], [name]).column(0).to_numpy()


@dataclass(frozen=True)
class IndexColumns:
    """An index's per-micro-batch columns as the report reads them (int64): the shape, tokens and the sums.

    ``attention`` and ``size2`` are None where the plan does not record them; ``measures`` holds
    every measure's per-micro-batch sum by name (``size2``, ``targets``, each cap's).
    """

    num_samples: np.ndarray
    batch_size: np.ndarray
    padded_size: np.ndarray
    tokens: np.ndarray
    attention: np.ndarray | None = None
    size2: np.ndarray | None = None
    measures: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def read(cls, directory: str, manifest: dict) -> IndexColumns:
        """Return the columns of the index ``directory`` (``attention`` and the measures where its schema has them)."""
        table = read_rows(directory, manifest, 0, manifest["num_rows"],
                          ["num_samples", "batch_size", "padded_size", "tokens"])
        ns, bs, ps, tok = (table.column(i).to_numpy().astype(np.int64) for i in range(4))
        schema = manifest.get("schema") or {}
        measures = {name: _column(directory, manifest, name).astype(np.int64) for name in measure_names(schema)}
        attention = _column(directory, manifest, "attention").astype(np.int64) if "attention" in schema else None
        return cls(ns, bs, ps, tok, attention, measures.get("size2"), measures)

    @property
    def padded(self) -> np.ndarray:
        """Return each micro-batch's padded tokens, ``batch_size * padded_size``."""
        return self.batch_size * self.padded_size


def _quantiles(x: np.ndarray) -> dict:
    if len(x) == 0:
        return {"min": 0, "median": 0, "max": 0}
    return {"min": _num(x.min()), "median": _num(np.median(x)), "max": _num(x.max())}


def _num(v):
    v = float(v)
    return int(v) if v.is_integer() else v


def step_costs(cost: np.ndarray, world_size: int, grad_accum: int) -> np.ndarray:
    """Return the (steps, world_size) cost of each rank in each step (tail padded from the start)."""
    from ..reader.plan import step_positions

    # the sampler's layout, (steps, A, W); a short tail repeats micro-batches from the start
    return cost[step_positions(len(cost), world_size, grad_accum) % len(cost)].sum(axis=1)


# C of the per-sample compute cost C*s + s^2 (docs/step-costs.md): 6 * d_model for d_model 1024.
# Per layer a token costs about 24*d^2 FLOPs in its matrix products and a pair of tokens 4*d in
# attention (QK^T and AV), so a document of s tokens costs 4*d*(6*d*s + s^2): C = 6*d_model.
DEFAULT_COST_COEFF = 6144


def imbalance(costs: np.ndarray) -> dict:
    """Return {p50, p99, max, weighted} of a (steps, ranks) cost table.

    Per step the costliest rank over the mean rank (1.0 for a step of no cost); ``weighted``
    is the sum of the step maxima over the sum of the step means: the fraction of the run's
    time ranks wait, plus one.
    """
    if costs.size == 0:
        return {"p50": 1.0, "p99": 1.0, "max": 1.0, "weighted": 1.0}
    costs = costs.astype(np.float64)
    mean, top = costs.mean(axis=1), costs.max(axis=1)
    ratio = np.where(mean > 0, top / np.where(mean > 0, mean, 1), 1.0)
    total = float(mean.sum())
    return {"p50": float(np.quantile(ratio, 0.5)), "p99": float(np.quantile(ratio, 0.99)),
            "max": float(ratio.max()), "weighted": float(top.sum() / total) if total > 0 else 1.0}


def compute_cost(m: dict, cols: IndexColumns, cost_coeff: float) -> np.ndarray | None:
    """Return each micro-batch's compute ``C * tokens + attention`` (float64; None when the plan cannot say).

    The linear part counts what the micro-batch computes: its padded tokens when it trains as a
    padded tensor, its real tokens when it trains varlen (``--rows``, ``--budget tokens``). An
    index written before ``attention`` was recorded implies it only for a padded plan.
    """
    padded = padded_plan(m.get("options") or {})
    attention = cols.attention
    if attention is None:
        if not padded:
            return None
        attention = cols.padded * cols.padded_size
    linear = cols.padded if padded else cols.tokens
    return cost_coeff * linear.astype(np.float64) + attention.astype(np.float64)


def inspect_directory(directory: str, world_size: int | None = None, grad_accum: int = 1,
                      cost_coeff: float = DEFAULT_COST_COEFF, lr: tuple[str, str] | None = None) -> dict:
    """Return the inspect report of a directory as a JSON-ready dict (``cost_coeff``: C of the compute cost).

    ``lr``: the (method, by) the training scales its LR with (``VariableBatchSizeLR``'s): the
    report then warns of steps whose LR scale is far from the median step's (``lr_warnings``).
    """
    m = read_manifest(directory)
    kind = m["_kind"]
    report = {"directory": str(directory), "kind": kind, "format": m["format"], "version": m["version"],
              "num_samples": m["num_samples"], "num_shards": len(m["shards"]),
              "content_hash": m["content_hash"], "options": m["options"]}
    if kind != "index":
        report.update(_samples_report(directory, m))
        return report
    _check_layout(world_size, grad_accum)
    cols = IndexColumns.read(directory, m)
    shapes = np.unique(np.stack([cols.batch_size, cols.padded_size]), axis=1) if len(cols.batch_size) \
        else np.zeros((2, 0))
    report.update(_microbatch_report(m, cols, shapes))
    report.update(_shape_lines(m, shapes))
    report.update(_sections(directory, m, cols))
    warnings = lr_warnings({"samples": cols.num_samples, "tokens": cols.tokens}, lr, world_size or 1,
                           grad_accum) if lr else []
    if warnings:
        report["warnings"] = warnings
    if world_size is not None and len(cols.padded):
        report.update(_step_report(directory, m, cols, (world_size, grad_accum), cost_coeff))
    return report


def _check_layout(world_size: int | None, grad_accum: int) -> None:
    """Raise SortpackError (one line) for a ``--world-size``/``--grad-accum`` inspect cannot report on."""
    from ..reader.trace import MAX_STEP_MICROBATCHES

    if world_size is not None and world_size < 1:
        raise SortpackError(f"--world-size {world_size}: must be >= 1")
    if grad_accum < 1:
        raise SortpackError(f"--grad-accum {grad_accum}: must be >= 1")
    if world_size is not None and world_size * grad_accum > MAX_STEP_MICROBATCHES:
        raise SortpackError(f"--world-size {world_size} --grad-accum {grad_accum}: {world_size * grad_accum} "
                            f"micro-batches per step, more than inspect reports on ({MAX_STEP_MICROBATCHES})")


def _sections(directory: str, m: dict, cols: IndexColumns) -> dict:
    """Return the report's sections of what an index holds beside its micro-batches: a mixture's sources, the
    held-out plan, the stored data, the two caps' fills."""
    out: dict = {}
    if m.get("mixture"):
        from .mixture import mixture_report

        mix_cols = {"tokens": cols.tokens, "source": _column(directory, m, "source"), "num_samples": cols.num_samples,
                    "batch_size": cols.batch_size, "padded_size": cols.padded_size}
        if "targets" in (m.get("schema") or {}):  # fine-tuning data: each source's loss targets too
            mix_cols["targets"] = _column(directory, m, "targets").astype(np.int64)
        out["mixture"] = mixture_report(m, mix_cols)
    if m.get("holdout") or m.get("held_out"):
        out.update(_holdout_report(m))
    if m.get("data"):
        from ..format.data_shards import describe_data

        out["data"] = describe_data(m["data"])
    caps = _caps(m, cols)
    if caps:  # each cap's mean fill, and which binds how often (the manifest's count, where it has one)
        out.update(cap_fills=cap_fills(m, cols, caps),
                   cap_binding=m["stats"].get("cap_binding") or binding_counts(m, cols, caps))
    return out


def _caps(m: dict, cols: IndexColumns) -> list[tuple[str, int]]:
    """Return the caps beside the budget the plan records whose measure it holds, (measure, N) each."""
    return [(name, n) for name, n in plan_caps(m["options"]) if name in cols.measures]


def _step_report(directory: str, m: dict, cols: IndexColumns, layout: tuple[int, int], cost_coeff: float) -> dict:
    """Return the steps of ``layout`` (W, A): their padded-token, compute, second-size and targets imbalance."""
    world_size, grad_accum = layout
    costs = step_costs(cols.padded, world_size, grad_accum)
    mean = costs.mean(axis=1)
    ratio = np.where(mean > 0, costs.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
    out: dict = {"world_size": world_size, "grad_accum": grad_accum, "steps": int(costs.shape[0]),
           "step_imbalance": float(ratio.max()), "step_imbalance_mean": float(ratio.mean())}
    compute = compute_cost(m, cols, cost_coeff)
    if compute is not None:
        out["cost_coeff"] = _num(cost_coeff)
        out["compute_imbalance"] = imbalance(step_costs(compute, world_size, grad_accum))
    if cols.size2 is not None:
        out["size2_imbalance"] = imbalance(step_costs(cols.size2.astype(np.float64), world_size, grad_accum))
    out.update(_cap_steps(m, cols, [name for name, _ in _caps(m, cols)], world_size, grad_accum))
    if "targets" in cols.measures:  # fine-tuning data: what trains per rank and step (the loss's share)
        out["targets_imbalance"] = imbalance(step_costs(cols.measures["targets"], world_size, grad_accum))
    return out


def _cap_steps(m: dict, cols: IndexColumns, capped: list[str], world_size: int, grad_accum: int) -> dict:
    """Return the steps' imbalance of each capped measure (``cap_imbalance``) and of the vision encoder's work
    (``encoder_imbalance``, apart from the LLM's ``compute_imbalance``), where the plan has them."""
    out: dict = {}
    if capped:
        out["cap_imbalance"] = {name: imbalance(step_costs(cols.measures[name].astype(np.float64), world_size,
                                                           grad_accum)) for name in capped}
    encoder = encoder_cost(m["options"], cols)
    if encoder is not None:
        out["encoder_imbalance"] = imbalance(step_costs(encoder, world_size, grad_accum))
    return out


def _samples_report(directory: str, m: dict) -> dict:
    """Return the size quantiles (and stage counts) of a samples or sorted directory."""
    size = _column(directory, m, "size")
    out: dict = {"size": {**_quantiles(size), "mean": float(size.mean()) if len(size) else 0.0,
                          "sum": int(size.sum())}}
    if m["_kind"] == "sorted" and "stage_counts" in m["stats"]:
        out["stage_counts"] = m["stats"]["stage_counts"]
    # the measures' totals (every measure column the directory holds)
    out.update({k: m["stats"][k] for k in measure_names(m.get("schema") or {}) if k in m["stats"]})
    return out


def _microbatch_report(m: dict, cols: IndexColumns, shapes: np.ndarray) -> dict:
    """Return an index's token, padding, shape and lost-sample figures."""
    tok = cols.tokens
    total_padded = int(cols.padded.sum())
    return {
        "num_microbatches": m["num_microbatches"],
        "tokens": int(tok.sum()),
        "padded_tokens": total_padded,
        "padding_ratio": (1.0 - tok.sum() / total_padded) if total_padded else 0.0,
        "fill": float(tok.sum() / total_padded) if total_padded else 1.0,
        "distinct_shapes": int(shapes.shape[1]),
        "samples_per_microbatch": _quantiles(cols.num_samples),
        "padded_size": _quantiles(cols.padded_size),
        "skipped": m["stats"].get("skipped", 0),
        "truncated": m["stats"].get("truncated", 0),
        # tokens (size units) too: older plans did not record them (None there when samples were lost)
        "skipped_tokens": m["stats"].get("skipped_tokens", 0 if not m["stats"].get("skipped") else None),
        "truncated_tokens": m["stats"].get("truncated_tokens", 0 if not m["stats"].get("truncated") else None),
        # fine-tuning data: the loss targets truncation cut away (recorded only for such plans)
        **({"truncated_targets": m["stats"]["truncated_targets"]} if "truncated_targets" in m["stats"] else {}),
        "split": m["stats"].get("split", 0),
        "split_pieces": m["stats"].get("split_pieces", 0),
        "split_tokens": m["stats"].get("split_tokens", 0),
        "empty_dropped": m["stats"].get("empty_dropped", 0),
        # the per-micro-batch sums' totals, where the plan records them (attention and every measure)
        **{k: m["stats"][k] for k in ("attention", *measure_names(m.get("schema") or {})) if k in m["stats"]},
    }


def fills(m: dict, cols: IndexColumns, caps: list[tuple[str, int]]) -> dict[str, np.ndarray]:
    """Return each micro-batch's fill of the budget (``max_tokens``) and of each cap (by its measure's name).

    The budget's use is the micro-batch's cost under it (padded tokens, tokens, or tokens plus
    attention / Q under quadratic); a cap's is its measure's sum over N (N per row with ``--rows``).
    """
    opts = m["options"]
    used = (cols.padded if padded_plan(opts) else cols.tokens).astype(np.float64)
    if opts.get("budget") == "quadratic" and not opts.get("rows") and cols.attention is not None:
        used = used + cols.attention / float(opts.get("quadratic_scale") or 1.0)
    rows = cols.batch_size.astype(np.float64) if opts.get("rows") else 1.0
    out = {"max_tokens": used / float(opts["max_tokens"])}
    out.update({name: cols.measures[name].astype(np.float64) / (float(n) * rows) for name, n in caps})
    return out


def cap_fills(m: dict, cols: IndexColumns, caps: list[tuple[str, int]]) -> dict:
    """Return the mean fill of the budget (``max_tokens``) and of each cap (its measure's name; ``size2``'s also as
    ``max_size2``, its first name), and of the binding one: the mean of each micro-batch's largest fill."""
    each = fills(m, cols, caps)
    if not len(cols.tokens):
        return {**{k: 0.0 for k in each}, "binding": 0.0}
    out = {k: float(v.mean()) for k, v in each.items()}
    if "size2" in out:
        out["max_size2"] = out["size2"]
    out["binding"] = float(np.max(np.stack(list(each.values())), axis=0).mean())
    return out


def binding_counts(m: dict, cols: IndexColumns, caps: list[tuple[str, int]]) -> dict[str, int]:
    """Return how many micro-batches each cap binds (its fill the largest; ties to the budget, then to the first)."""
    each = fills(m, cols, caps)
    top = np.argmax(np.stack(list(each.values())), axis=0) if len(cols.tokens) else np.zeros(0, np.int64)
    return {name: int(c) for name, c in zip(each, np.bincount(top, minlength=len(each)))}


def encoder_cost(options: dict, cols: IndexColumns) -> np.ndarray | None:
    """Return each micro-batch's vision-encoder work (``--encoder-patches``): per image ``C_e*p + p^2`` (full
    attention, the squares' measure summed), ``(C_e + W)*p`` (windows of W patches); None without an encoder."""
    name = options.get("encoder_patches")
    if not name or name not in cols.measures:
        return None
    coeff = float(options.get("encoder_coeff") or 0.0)
    kind, _, value = str(options.get("encoder_attention") or "").partition(":")
    patches = cols.measures[name].astype(np.float64)
    if kind == "window":
        return (coeff + float(value)) * patches
    squares = cols.measures.get(value)
    return None if squares is None else coeff * patches + squares.astype(np.float64)


def _holdout_report(m: dict) -> dict:
    """Return the held-out figures: the seed and each source's rows and held-out count.

    A training plan reports its held-out plan (``holdout``, with the directory and its
    micro-batches); a held-out plan reports what it holds (``held_out``).
    """
    rec = m.get("holdout") or m["held_out"]
    out = {"seed": rec.get("seed"), "num_samples": rec.get("num_samples"),
           "sources": [{"name": s.get("name"), "num_rows": s.get("num_rows"), "request": s.get("request"),
                        "held_out": s.get("held_out")} for s in rec.get("sources", [])]}
    if m.get("holdout"):
        # held out by id before packing: the empty ones among them are not in the held-out plan
        out["empty_dropped"] = rec.get("empty_dropped", 0)
        return {"holdout": {"directory": rec.get("directory"), **out, "num_microbatches": rec.get("num_microbatches")}}
    return {"held_out": out}


def _render_holdout(value: dict) -> str:
    """Return the holdout line(s): where, how many, the seed, then per source its count of its rows."""
    head = [f"{value['directory']}/" if value.get("directory") else "this plan",
            f"{value['num_samples']} samples"]
    if value.get("empty_dropped"):
        head.append(f"{value['empty_dropped']} of them empty, dropped")
    if value.get("num_microbatches") is not None:
        head.append(f"{value['num_microbatches']} micro-batches")
    head.append(f"seed {value['seed']}")
    per = [f"{s['name'] if s['name'] is not None else 'input'} {s['held_out']} of {s['num_rows']}"
           + (f" (request {s['request']})" if s["request"] else "") for s in value["sources"]]
    return ", ".join(head) + "; " + ", ".join(per)


LR_SPREAD = 4.0  # a step's LR scale past this multiple of the median step's is worth a warning


def lr_warnings(batches: dict[str, np.ndarray], lr: tuple[str, str], world_size: int, grad_accum: int) -> list[str]:
    """Return a warning when a step's LR scale exceeds 4x the median step's under the LR rule ``lr``, (method, by):
    ``linear`` or ``sqrt`` scaling by the micro-batches' ``samples`` or ``tokens`` (``batches``' arrays).

    The reference batch is the mean step's, as the recipes take it; the ratio to the median
    step does not depend on it. A loss averaged over tokens (``step_loss``) wants ``by="tokens"``.
    """
    method, by = lr
    values = batches[by]
    if not len(values) or method not in ("linear", "sqrt"):
        return []
    batch = step_costs(values.astype(np.float64), world_size, grad_accum).sum(axis=1)
    ratio = batch / max(float(batch.mean()), 1e-300)
    scale = np.sqrt(ratio) if method == "sqrt" else ratio
    median = float(np.median(scale))
    if not (median > 0 and float(scale.max()) > LR_SPREAD * median):
        return []
    worst = int(np.argmax(scale))
    return [f"step {worst} trains at {scale[worst] / median:.2f}x the median step's LR under {method} LR scaling by "
            f"{by} ({int(batch[worst])} {by} vs a median of {float(np.median(batch)):g}); "
            + ("scale by tokens (by=\"tokens\") when the loss is a mean over tokens (step_loss)"
               if by == "samples" else "its tokens are far from the median step's")]


def _shape_lines(m: dict, shapes: np.ndarray) -> dict:
    """Return the chosen lengths (--shapes auto:K) and the (batch, length) shapes when there are few."""
    out: dict[str, object] = {}
    auto = m["stats"].get("auto_shapes")
    if auto:
        out["chosen_lengths"] = {"request": auto["request"], "lengths": auto["lengths"],
                                 "rounding_padding_ratio": auto["rounding_padding_ratio"]}
    if shapes.shape[1] <= 32:
        out["shapes"] = [[int(b), int(length)] for b, length in shapes.T]
    return out


def _figures(value: dict) -> str:
    """Return ``{name: figure}`` as ``name figure  name figure`` (floats to 4 significant digits)."""
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())


def render(report: dict) -> str:
    """Return the report as an aligned human-readable table."""
    rows = []
    for key, value in report.items():
        if key == "warnings":
            continue  # the CLI prints them to stderr
        if key == "options":
            value = ", ".join(f"{k}={v}" for k, v in value.items() if v not in (None, [], False))
        elif key == "shapes":
            value = " ".join(f"{b}x{length}" for b, length in value) + "  (batch x padded length)"
        elif key == "mixture":
            from .mixture import render_mixture

            value = render_mixture(value)
        elif key in ("holdout", "held_out"):
            value = _render_holdout(value)
        elif key == "chosen_lengths":
            value = (f"{value['request']}: {','.join(map(str, value['lengths']))}  "
                     f"(per-sample rounding pads {100 * value['rounding_padding_ratio']:.2f}%)")
        elif key == "cap_imbalance":  # one line per capped measure
            for name, figures in value.items():
                rows.append((f"{name}_imbalance", _figures(figures)))
            continue
        elif isinstance(value, dict):
            value = _figures(value)
        elif isinstance(value, float):
            value = f"{100 * value:.2f}%" if key in ("padding_ratio", "fill") else f"{value:.4f}"
        rows.append((key, str(value)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

