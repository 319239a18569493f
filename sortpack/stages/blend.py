"""The blend: which micro-batches of each source a mixture plan uses, and in what order.

Input: per source, its packed units (a micro-batch, or a same-shape group of G of them) as
token counts and curriculum stages, in pack order; the schedule; the run's total tokens
(or None: the largest run that uses no sample twice); a seed. Output: the plan's sequence of
(source, unit, pass). Everything here works on unit-level arrays (a few per micro-batch,
never per sample) and is a pure function of them, so every rank computes the same plan.

Selection. A source's units are visited pass after pass, each pass in its own keyed
permutation of (seed, source, pass) (``KeyedPermutation``: the same on any machine). What a
source gives is always a prefix of that visiting order: whole passes plus a seeded part-pass,
so every sample appears floor(r) or ceil(r) times (r = tokens used / tokens held).

Order inside a source. With curriculum stages, the units the source surely gives (its
selection prefix up to ``need - 2 * bound`` tokens) go in stage order (then pass, then the
seeded order); the last units, whose number the interleave decides, follow in the visiting
order. Without stages that is the visiting order itself.

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

from ..errors import SortpackError
from ..inputs.schedule import Schedule
from ..kernels import wf2q_interleave
from ..permutation import _M64, KeyedPermutation, _mix

# A source asked for more passes than this is a typo in total_tokens, not a plan: repeating data
# stops paying after a few dozen epochs, and the plan's arrays grow with the passes (docs/mixtures.md).
MAX_PASSES = 10_000
# The plan's micro-batches (units) every rank holds while blending: about 60 bytes each, so this
# many is over 100 GiB per rank, far past any machine's memory (docs/mixtures.md).
MAX_PLAN_UNITS = 2**31


@dataclass
class Blend:
    """A plan's units in order: source, unit within the source, pass; and the run's figures."""

    source: np.ndarray  # int16 per plan unit
    unit: np.ndarray  # int64, unit index within its source (pack order)
    passes: np.ndarray  # int32, the pass of that use of the unit
    total: float  # T of the targets: total_tokens, or the largest run without reuse
    bound: int  # the largest unit's tokens over every source (the prefix bound)

    def __len__(self) -> int:
        return len(self.source)


def pass_order(n: int, seed: int, source: int, pass_: int) -> np.ndarray:
    """Return the order in which pass ``pass_`` of a source visits its ``n`` units (a keyed permutation)."""
    key = _mix((int(seed) & _M64) ^ _mix(0x6D697874 + int(source)))  # "mixt": apart from the reader's shuffles
    return KeyedPermutation(n, key, pass_).array(np.arange(n, dtype=np.int64))


def _stream(tokens: np.ndarray, stages: np.ndarray, need: float, bound: int, seed: int, source: int,
            passes: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (units, pass) of a source's stream: its visiting order with the sure head in stage order."""
    n = len(tokens)
    visit = np.concatenate([pass_order(n, seed, source, p) for p in range(passes)])
    pass_of = np.repeat(np.arange(passes, dtype=np.int32), n)
    cum = np.cumsum(tokens[visit])
    head = int(np.searchsorted(cum, need - 2 * bound, side="right"))
    if head and np.any(stages != stages[0]):
        order = np.lexsort((np.arange(head), pass_of[:head], stages[visit[:head]]))
        visit = np.concatenate((visit[:head][order], visit[head:]))
        pass_of = np.concatenate((pass_of[:head][order], pass_of[head:]))
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


def plan_blend(tokens: list[np.ndarray], stages: list[np.ndarray], schedule: Schedule,
               total_tokens: int | None, seed: int, names: list[str] | None = None) -> Blend:
    """Return the blend of the sources' units (see the module docstring)."""
    k = len(tokens)
    names = names or [str(s) for s in range(k)]
    held = np.array([int(np.asarray(t, np.int64).sum()) for t in tokens], dtype=np.float64)
    for s in range(k):
        if held[s] <= 0:
            raise SortpackError(f"mixture source {names[s]!r}: no tokens to plan (every sample skipped or empty)",
                                collective=True)
    bound = max(int(np.max(t)) for t in tokens)
    shares = schedule.shares()
    if total_tokens is None:
        total = float(np.min(held / shares))
    else:
        total = float(total_tokens)
    need = shares * total
    _check_size(tokens, need, held, total_tokens, names)
    starts, finishes, sizes, units, pass_ids = [], [], [], [], []
    for s in range(k):
        t = np.asarray(tokens[s], dtype=np.int64)
        passes = max(2, int((need[s] + 3 * bound) // held[s]) + 1)
        visit, pass_of = _stream(t, np.asarray(stages[s]), need[s], bound, seed, s, passes)
        sizes.append(t[visit])
        cum = np.concatenate(([0], np.cumsum(sizes[s])))
        starts.append(schedule.inverse(s, cum[:-1], total))
        finishes.append(schedule.inverse(s, cum[1:], total))
        units.append(visit)
        pass_ids.append(pass_of)
    # without total_tokens, a source that gave its whole first pass gives no more: with the
    # largest run without reuse as the total, its target never rises above what it gave (the
    # sum of the targets is the prefix, so some other source is then behind and has a unit
    # that started)
    first_pass_end = [int(np.searchsorted(pass_ids[s], 1)) for s in range(k)]
    source = wf2q_interleave(starts, finishes, sizes, total, None if total_tokens is not None else first_pass_end)
    if not len(source):
        raise SortpackError(f"total_tokens {total_tokens} is smaller than the first micro-batch's tokens "
                            f"({bound} tokens at most): nothing to plan", collective=True)
    # the j-th pick of source s is position j of its stream
    rank_in_source = np.zeros(len(source), dtype=np.int64)
    for s in range(k):
        mine = source == s
        rank_in_source[mine] = np.arange(int(mine.sum()))
    unit = np.zeros(len(source), dtype=np.int64)
    passes_out = np.zeros(len(source), dtype=np.int32)
    for s in range(k):
        mine = np.flatnonzero(source == s)
        unit[mine] = units[s][rank_in_source[mine]]
        passes_out[mine] = pass_ids[s][rank_in_source[mine]]
    return Blend(source, unit, passes_out, total, bound)
