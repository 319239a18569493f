"""Mixtures: the spec of a run over several weighted sources (MIX.json or ``--blend``) and its schedule.

A mixture names sources (each its inputs, weight and optional ``column``), an optional
``total_tokens`` and an optional ``schedule``: piecewise-constant weights over the fraction of
the run's tokens. This module parses and checks the spec (one-line errors); the schedule's
arithmetic is in ``schedule.py``.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..errors import SortpackError
from ..permutation import SEED_LIMIT
from .holdout import parse_holdout
from .schedule import Schedule, schedule_dict

_TOP_KEYS = {"sources", "total_tokens", "schedule", "seed", "holdout_seed"}
_SOURCE_KEYS = {"name", "inputs", "weight", "column", "holdout"}
_PHASE_KEYS = {"until", "weights"}
MAX_SOURCES = 1024  # a micro-batch's source is stored as int16; this keeps stage codes in range too
# the schedule's targets are float64 arithmetic on total_tokens: above 2**53 they are no longer
# exact integers (and 9e15 tokens is a thousand times any run yet); docs/mixtures.md
MAX_TOTAL_TOKENS = 2**53


@dataclass
class MixSource:
    """One source of a mixture: its name, input paths, base weight and optional text column."""

    name: str
    inputs: list[str]
    weight: float | None = None
    column: str | None = None
    holdout: int | float | None = None  # held-out samples: a count or a fraction (None: --holdout's, if any)


@dataclass
class Mixture:
    """A parsed mixture: sources in order, the schedule, the total tokens (None: no repeats) and the seed."""

    sources: list[MixSource]
    schedule: Schedule
    total_tokens: int | None = None
    seed: int = 0
    origin: str = "MIX.json"  # where it came from, for messages
    holdout_seed: int | None = None  # seed of the held-out choice (None: --holdout-seed's, else 0)

    @property
    def names(self) -> list[str]:
        """Return the source names in order."""
        return [s.name for s in self.sources]

    def as_dict(self) -> dict:
        """Return the spec as recorded in the manifest (weights normalised per phase)."""
        # holdout keys only where given: a plan without them keeps its content hash
        return {
            "sources": [{"name": s.name, "inputs": list(s.inputs), "weight": s.weight, "column": s.column,
                         **({"holdout": s.holdout} if s.holdout is not None else {})}
                        for s in self.sources],
            "total_tokens": self.total_tokens,
            "seed": self.seed,
            "schedule": schedule_dict(self.schedule, self.names),
            **({"holdout_seed": self.holdout_seed} if self.holdout_seed is not None else {}),
        }


# --- parsing -------------------------------------------------------------------------------------
def _number(value, where: str, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SortpackError(f"{where}: expected a number, got {json.dumps(value)}")
    if positive and value <= 0:
        raise SortpackError(f"{where}: weights must be positive, got {value}")
    if value < 0:
        raise SortpackError(f"{where}: weights must not be negative, got {value}")
    return float(value)


def _unknown(obj: dict, allowed: set, where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise SortpackError(f"{where}: unknown key {extra[0]!r} (expected {', '.join(sorted(allowed))})")


def _objects(raw: list, where: str, expected: str, allowed: set) -> Iterator[tuple[str, dict]]:
    """Yield (``where[k]``, object) of each entry of ``raw``; refuse an entry that is no object or has unknown keys."""
    for k, obj in enumerate(raw):
        place = f"{where}[{k}]"
        if not isinstance(obj, dict):
            raise SortpackError(f"{place}: expected an object with {expected}")
        _unknown(obj, allowed, place)
        yield place, obj


def _total(value, where: str) -> int | None:
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value != int(value) or value <= 0):
        raise SortpackError(f"{where}: total_tokens must be a positive integer, got {json.dumps(value)}")
    return check_total_tokens(int(value), f"{where}: total_tokens")


def check_total_tokens(total: int, what: str) -> int:
    """Return ``total`` if it is at most ``MAX_TOTAL_TOKENS``, else raise a one-line SortpackError naming ``what``."""
    if total > MAX_TOTAL_TOKENS:
        raise SortpackError(f"{what} {total:.3g} is more than 2**53 = {MAX_TOTAL_TOKENS:.3g} tokens, the most a plan "
                            f"can count exactly (docs/mixtures.md): a typo?")
    return total


def parse_mixture(spec: dict, origin: str = "MIX.json", base_dir: str | None = None) -> Mixture:
    """Return the Mixture of a MIX.json object, or raise a one-line SortpackError naming the key.

    Relative input paths are taken relative to ``base_dir`` (the file's directory) when given.
    """
    if not isinstance(spec, dict):
        raise SortpackError(f"{origin}: expected a JSON object with 'sources'")
    _unknown(spec, _TOP_KEYS, origin)
    raw = spec.get("sources")
    if not isinstance(raw, list) or not raw:
        raise SortpackError(f"{origin}: 'sources' must be a non-empty list")
    if len(raw) > MAX_SOURCES:
        raise SortpackError(f"{origin}: {len(raw)} sources; at most {MAX_SOURCES}")
    sources: list[MixSource] = []
    for where, src in _objects(raw, f"{origin}: sources", "name, inputs and weight", _SOURCE_KEYS):
        name = src.get("name")
        if not isinstance(name, str) or not name.strip():
            raise SortpackError(f"{where}: 'name' must be a non-empty string")
        where = f"{origin}: source {name!r}"
        if name in {s.name for s in sources}:
            raise SortpackError(f"{where}: the name appears twice")
        inputs = src.get("inputs")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(p, str) and p for p in inputs):
            raise SortpackError(f"{where}: 'inputs' must be a non-empty list of paths")
        if base_dir:
            inputs = [p if os.path.isabs(p) or "://" in p else os.path.join(base_dir, p) for p in inputs]
        weight = src.get("weight")
        weight = None if weight is None else _number(weight, f"{where}: weight", positive=True)
        column = src.get("column")
        if column is not None and (not isinstance(column, str) or not column):
            raise SortpackError(f"{where}: 'column' must be a non-empty string")
        holdout = src.get("holdout")
        if holdout is not None:
            holdout = parse_holdout(holdout, f"{where}: holdout")
        sources.append(MixSource(name, inputs, weight, column, holdout))
    seed = _seed(spec.get("seed", 0), "seed", origin)
    holdout_seed = spec.get("holdout_seed")
    if holdout_seed is not None:
        holdout_seed = _seed(holdout_seed, "holdout_seed", origin)
    schedule = _parse_schedule(spec.get("schedule"), sources, origin)
    return Mixture(sources, schedule, _total(spec.get("total_tokens"), origin), seed, origin, holdout_seed)


def _seed(value, key: str, origin: str) -> int:
    """Return a MIX.json seed, refusing (one line) what ``--seed`` refuses: not an integer, negative, 2^64 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise SortpackError(f"{origin}: '{key}' must be an integer from 0 to 2^64-1, got {json.dumps(value)}")
    return value


def _parse_schedule(raw, sources: list[MixSource], origin: str) -> Schedule:
    names = [s.name for s in sources]
    if raw is None:
        missing = [s.name for s in sources if s.weight is None]
        if missing:
            raise SortpackError(f"{origin}: source {missing[0]!r} has no 'weight' (and there is no schedule)")
        rows, ends = [[s.weight for s in sources if s.weight is not None]], [1.0]  # all, as checked above
    else:
        if not isinstance(raw, list) or not raw:
            raise SortpackError(f"{origin}: 'schedule' must be a non-empty list of phases")
        rows, ends = [], []
        for where, phase in _objects(raw, f"{origin}: schedule", "'until' and 'weights'", _PHASE_KEYS):
            until = phase.get("until")
            if isinstance(until, bool) or not isinstance(until, (int, float)) or not 0 < until <= 1:
                raise SortpackError(f"{where}: 'until' must be a fraction in (0, 1], got {json.dumps(until)}")
            if ends and until <= ends[-1]:
                raise SortpackError(f"{where}: 'until' {until} does not increase (previous {ends[-1]})")
            given = phase.get("weights", {})
            if not isinstance(given, dict):
                raise SortpackError(f"{where}: 'weights' must be an object of source name to weight")
            for n in given:
                if n not in names:
                    raise SortpackError(f"{where}: unknown source {n!r} (sources: {', '.join(names)})")
            row = []
            for s in sources:
                if s.name in given:
                    row.append(_number(given[s.name], f"{where}: weight of {s.name!r}", positive=False))
                elif s.weight is not None:
                    row.append(s.weight)
                else:
                    raise SortpackError(f"{where}: no weight for source {s.name!r} (give one here or in the source)")
            if sum(row) <= 0:
                raise SortpackError(f"{where}: the weights sum to 0")
            rows.append(row)
            ends.append(float(until))
        if ends[-1] != 1.0:
            raise SortpackError(f"{origin}: the schedule must end at 1.0 (its last 'until' is {ends[-1]})")
    weights = np.asarray(rows, dtype=np.float64)
    # scale by each phase's largest weight first: weights near 1e308 would overflow their sum to inf
    # (and every share to 0), weights near 1e-320 lose their digits
    weights /= weights.max(axis=1, keepdims=True)
    weights /= weights.sum(axis=1, keepdims=True)
    schedule = Schedule(np.asarray(ends), weights)
    unused = [n for n, share in zip(names, schedule.shares()) if share <= 0]
    if unused:
        raise SortpackError(f"{origin}: source {unused[0]!r} has weight 0 in every phase of the schedule")
    return schedule


def load_mixture(path: str) -> Mixture:
    """Return the Mixture of a MIX.json file (relative inputs are relative to the file's directory)."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except FileNotFoundError:
        raise SortpackError(f"--mixture {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise SortpackError(f"--mixture {path}: not a JSON file ({exc})") from None
    return parse_mixture(spec, origin=str(path), base_dir=os.path.dirname(path))


def parse_blend(text: str) -> Mixture:
    """Return the Mixture of Megatron's flat blend, ``"W1 PATH1 W2 PATH2 ..."`` (source names: the paths)."""
    parts = text.split()
    if not parts or len(parts) % 2:
        raise SortpackError(f"--blend {text!r}: expected pairs of weight and path, e.g. \"70 data/web 30 data/code\"")
    spec_sources = []
    for w, path in zip(parts[0::2], parts[1::2]):
        try:
            weight = float(w)
        except ValueError:
            raise SortpackError(f"--blend: {w!r} is not a weight (expected pairs of weight and path)") from None
        spec_sources.append({"name": path, "inputs": [path], "weight": weight})
    return parse_mixture({"sources": spec_sources}, origin="--blend")
