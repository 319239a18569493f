"""The blend: which micro-batches of each source a mixture plan uses, and in what order.

Input: per source, its packed units (a micro-batch, or a same-shape group of G of them) as
token counts and curriculum stages, in pack order; the schedule; the run's total tokens
(or None: the largest run that uses no sample twice); a seed. Output: the plan's sequence of
(source, unit, pass). Everything here works on unit-level arrays (a few per micro-batch,
never per sample) and is a pure function of them, so every rank computes the same plan.

Selection. A source used r times (r = tokens used / tokens held) gives ``whole`` passes over
its units, each in its own keyed permutation of (seed, source, pass) (``KeyedPermutation``:
the same on any machine), then a last pass: the units of its *part pass*, a seeded random
subset of its samples packed on their own (``part_pass.select_part``: chosen by sample, not
by micro-batch, so every length range gives its share), or, where the last pass needs every
sample, the source's units once more. What the source gives is a prefix of that stream, and
the stream holds at least the source's need, so every sample appears floor(r) or ceil(r)
times. The interleave decides the last units (within one unit of the need): the last pass
ends with its units of the fewest samples per token (2 units' worth), so the units left out
hold as few samples as possible and every length range keeps its share.

Order inside a source. With curriculum stages, the units the source surely gives (its
stream up to ``need - 2 * bound`` tokens) go in stage order (then pass, then the seeded
order); the last units, whose number the interleave decides, follow in the stream's order.
Without stages that is the stream itself.

Interleave: WF2Q (worst-case fair weighted fair queueing, Bennett and Zhang 1996) against
the schedule's fluid targets ``target_s(X)``. Unit j of source s *starts* at the prefix X where
its target reaches the tokens before it (``S``) and *finishes* where it reaches the tokens
through it (``F``); the next unit is, among the units that have started (``S <= X``), the
one that finishes first (ties: the lower source). This keeps every prefix within the
largest unit's tokens of every source's target, both ahead and behind. "The source most
behind goes next" (Megatron's rule) does not: with three or more sources a source with
large units can fall 1.4 units behind (docs/mixtures.md). The loop is O(units x sources):
``kernels.wf2q_interleave``, compiled (a few nanoseconds per source per unit), with the
Python loop as its fallback.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import SortpackError
from ...inputs.schedule import Schedule
from ...kernels import wf2q_interleave
from ...permutation import _M64, KeyedPermutation, _mix

# A source asked for more passes than this is a typo in total_tokens, not a plan: repeating data
# stops paying after a few dozen epochs, and the plan's arrays grow with the passes (docs/mixtures.md).
MAX_PASSES = 10_000
# The plan's micro-batches (units) every rank holds while blending: about 60 bytes each, so this
# many is over 100 GiB per rank, far past any machine's memory (docs/mixtures.md).
MAX_PLAN_UNITS = 2**31


@dataclass
class Blend:
    """A plan's units in order: source, unit within the source, pass; and the run's figures.

    A source's units are numbered as ``plan_blend`` took them: its whole packing's units, then
    its part pass's units (``parts``).
    """

    source: np.ndarray  # int16 per plan unit
    unit: np.ndarray  # int64, unit index within its source (pack order; part-pass units after the rest)
    passes: np.ndarray  # int32, the pass of that use of the unit
    total: float  # T of the targets: total_tokens, or the largest run without reuse
    bound: int  # the largest unit's tokens over every source (the prefix bound)

    def __len__(self) -> int:
        return len(self.source)


@dataclass
class Needs:
    """What each source must give: its tokens ``need``, its ``whole`` passes, and its last pass's tokens ``part``.

    ``part`` is in (0, held]: at ``held`` the last pass is one more pass over every sample.
    """

    total: float
    need: np.ndarray
    whole: np.ndarray
    part: np.ndarray


def pass_needs(held: np.ndarray, schedule: Schedule, total_tokens: int | None) -> Needs:
    """Return each source's need, whole passes and last pass's tokens for sources holding ``held`` tokens."""
    held = np.asarray(held, dtype=np.float64)
    shares = schedule.shares()
    total = float(np.min(held / shares)) if total_tokens is None else float(total_tokens)
    need = shares * total
    r = need / held
    if total_tokens is None:
        r = np.minimum(r, 1.0)  # the largest run without reuse: rounding must not start a second pass
    whole = np.maximum(np.ceil(r) - 1, 0).astype(np.int64)
    part = np.minimum(need - whole * held, held)
    return Needs(total, need, whole, part)


def pass_order(n: int, seed: int, source: int, pass_: int) -> np.ndarray:
    """Return the order in which pass ``pass_`` of a source visits its ``n`` units (a keyed permutation)."""
    key = _mix((int(seed) & _M64) ^ _mix(0x6D697874 + int(source)))  # "mixt": apart from the reader's shuffles
    return KeyedPermutation(n, key, pass_).array(np.arange(n, dtype=np.int64))


def _sparse_last(order: np.ndarray, tokens: np.ndarray, samples: np.ndarray | None,
                 reserve: int) -> tuple[np.ndarray, int]:
    """Return (a pass's ``order`` with its units of fewest samples per token last, how many are last).

    The last units hold at least ``reserve`` tokens (all of the pass where it holds fewer).
    """
    if samples is None or len(order) < 2:
        return order, 0
    t = tokens[order].astype(np.float64)
    density = samples[order] / np.maximum(t, 1.0)
    rank = np.lexsort((np.arange(len(order)), density))
    cut = min(int(np.searchsorted(np.cumsum(t[rank]), reserve, side="left")) + 1, len(order))
    last = np.zeros(len(order), dtype=bool)
    last[rank[:cut]] = True
    return np.concatenate((order[~last], order[last])), cut


@dataclass
class _Units:
    """One source's units: the whole packing's, then its part pass's (the last ``part`` of them; 0: none)."""

    tokens: np.ndarray
    stages: np.ndarray
    samples: np.ndarray | None  # samples per unit (None: not known; the last pass keeps its pack order)
    part: int


def _pass_orders(units: _Units, whole: int, seed: int, source: int) -> list[np.ndarray]:
    """Return the order of each pass over a source's units: ``whole`` passes over the whole packing, then the last
    pass (over the part pass's units where there are some, else over the whole packing again)."""
    n = len(units.tokens) - units.part
    orders = [pass_order(n, seed, source, p) for p in range(whole)]
    if units.part:
        orders.append(n + pass_order(units.part, seed, source, whole))
    else:
        orders.append(pass_order(n, seed, source, whole))
    return orders


def _stream(units: _Units, needs: Needs, source: int, bound: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (units, pass) of a source's stream: whole passes, the last pass, the sure head in stage order.

    Units ``[0, n)`` are the whole packing's, ``[n, n + part)`` the part pass's (none: the last
    pass visits the whole packing again).
    """
    tokens, stages, samples = units.tokens, units.stages, units.samples
    need = float(needs.need[source])
    orders = _pass_orders(units, int(needs.whole[source]), seed, source)
    # the interleave leaves out at most 2 units' worth at the stream's end: units holding few samples
    reserve = 2 * bound
    orders[-1], sparse = _sparse_last(orders[-1], tokens, samples, reserve)
    last_tokens = int(tokens[orders[-1]].sum())
    one_pass_tail = not (len(orders) > 1 and last_tokens < reserve)
    if not one_pass_tail:
        orders[-2], sparse = _sparse_last(orders[-2], tokens, samples, reserve - last_tokens)
        sparse += len(orders[-1]) if sparse else 0
    visit = np.concatenate(orders)
    pass_of = np.repeat(np.arange(len(orders), dtype=np.int32), [len(o) for o in orders])
    cum = np.cumsum(tokens[visit])
    # the sure head: before the sparse tail (which holds the 2 units' worth left out at most)
    head = len(visit) - sparse if sparse else int(np.searchsorted(cum, need - 2 * bound, side="right"))
    if np.any(stages != stages[0]):
        order = np.lexsort((np.arange(head), pass_of[:head], stages[visit[:head]]))
        visit[:head], pass_of[:head] = visit[:head][order], pass_of[:head][order]
        if sparse and one_pass_tail:  # one pass: the stage order holds to the end, the drop stays sparse
            order = head + np.lexsort((np.arange(sparse), stages[visit[head:]]))
            visit[head:], pass_of[head:] = visit[order], pass_of[order]
    return visit, pass_of


def _check_size(tokens: list[np.ndarray], need: np.ndarray, held: np.ndarray, total_tokens: int | None,
                names: list[str]) -> None:
    """Raise a one-line SortpackError when the run asks a source for absurdly many passes or the plan is too large.

    Checked before any per-unit array is built, so a typo in total_tokens fails at once
    instead of allocating for ever.
    """
    passes = need / held
    worst = int(np.argmax(passes))
    what = f"total_tokens {total_tokens} (MIX.json, or --total-tokens)"
    if passes[worst] > MAX_PASSES:
        raise SortpackError(f"{what} asks source {names[worst]!r} for {passes[worst]:.3g} passes over its "
                            f"{int(held[worst])} tokens; at most {MAX_PASSES} (docs/mixtures.md): a typo?",
                            collective=True)
    units = float(sum(p * len(t) for p, t in zip(passes, tokens)))
    if units > MAX_PLAN_UNITS:
        raise SortpackError(f"{what} makes a plan of about {units:.3g} micro-batches; at most {MAX_PLAN_UNITS} "
                            f"(docs/mixtures.md): a typo?", collective=True)


def _with_parts(tokens: list[np.ndarray], stages: list[np.ndarray], samples: list[np.ndarray] | None,
                parts: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None], needs: Needs) -> list[_Units]:
    """Return each source's units with its part pass's after them."""
    out = []
    for s in range(len(tokens)):
        t, st = np.asarray(tokens[s], dtype=np.int64), np.asarray(stages[s])
        n_s = None if samples is None else np.asarray(samples[s], dtype=np.int64)
        p = parts[s]
        if p is not None and len(p[0]):
            if int(np.sum(p[0])) < needs.part[s]:
                raise ValueError(f"plan_blend: source {s}'s part pass holds {int(np.sum(p[0]))} tokens, "
                                 f"below its need {needs.part[s]}")
            t = np.concatenate((t, np.asarray(p[0], dtype=np.int64)))
            st = np.concatenate((st, np.asarray(p[1], dtype=st.dtype)))
            if n_s is not None:
                n_s = np.concatenate((n_s, np.asarray(p[2], dtype=np.int64)))
            out.append(_Units(t, st, n_s, len(p[0])))
        else:
            out.append(_Units(t, st, n_s, 0))
    return out


def _picks(source: np.ndarray, units: list[np.ndarray], pass_ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Return (unit, pass) of each pick of the interleave: the j-th pick of source s is position j of its stream."""
    rank_in_source = np.zeros(len(source), dtype=np.int64)
    for s in range(len(units)):
        mine = source == s
        rank_in_source[mine] = np.arange(int(mine.sum()))
    unit = np.zeros(len(source), dtype=np.int64)
    passes_out = np.zeros(len(source), dtype=np.int32)
    for s in range(len(units)):
        mine = np.flatnonzero(source == s)
        unit[mine] = units[s][rank_in_source[mine]]
        passes_out[mine] = pass_ids[s][rank_in_source[mine]]
    return unit, passes_out


def _held(tokens: list[np.ndarray], names: list[str]) -> np.ndarray:
    """Return each source's tokens (float64), refusing a source that holds none (one line naming it)."""
    held = np.array([int(np.asarray(t, np.int64).sum()) for t in tokens], dtype=np.float64)
    empty = np.flatnonzero(held <= 0)
    if len(empty):
        raise SortpackError(f"mixture source {names[int(empty[0])]!r}: no tokens to plan (every sample skipped or "
                            "empty)", collective=True)
    return held


def plan_blend(tokens: list[np.ndarray], stages: list[np.ndarray], schedule: Schedule,
               total_tokens: int | None, seed: int, names: list[str] | None = None,
               samples: list[np.ndarray] | None = None,
               parts: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] | None = None) -> Blend:
    """Return the blend of the sources' units (see the module docstring).

    ``tokens``/``stages``/``samples`` describe each source's packed units; ``parts[s]`` its
    part pass's units as (tokens, stages, samples), None where the last pass is the whole
    packing's (without ``parts``, every source's). The part pass must hold at least the
    source's ``pass_needs(...).part`` tokens.
    """
    k = len(tokens)
    names = names or [str(s) for s in range(k)]
    held = _held(tokens, names)
    needs = pass_needs(held, schedule, total_tokens)
    _check_size(tokens, needs.need, held, total_tokens, names)
    per_source = _with_parts(tokens, stages, samples, parts or [None] * k, needs)
    bound = max(int(np.max(u.tokens)) for u in per_source)
    total = needs.total
    starts, finishes, sizes, units, pass_ids = [], [], [], [], []
    for s in range(k):
        visit, pass_of = _stream(per_source[s], needs, s, bound, seed)
        sizes.append(per_source[s].tokens[visit])
        cum = np.concatenate(([0], np.cumsum(sizes[s])))
        starts.append(schedule.inverse(s, cum[:-1], total))
        finishes.append(schedule.inverse(s, cum[1:], total))
        units.append(visit)
        pass_ids.append(pass_of)
    # every stream holds at least its source's need, so a source that gave its whole stream is
    # not behind its target, and the run ends before the first unit that would pass the total
    source = wf2q_interleave(starts, finishes, sizes, total, [len(u) for u in units])
    if not len(source):
        raise SortpackError(f"total_tokens {total_tokens} is smaller than the first micro-batch's tokens "
                            f"({bound} tokens at most): nothing to plan", collective=True)
    unit, passes_out = _picks(source, units, pass_ids)
    return Blend(source, unit, passes_out, total, bound)
