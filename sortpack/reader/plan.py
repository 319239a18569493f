"""Epoch planning: the order of steps in an epoch and the one layout of steps over ranks.

A step is ``W * A`` consecutive flat positions of the epoch; rank ``r`` takes positions
``s*W*A + a*W + r`` for ``a`` in ``0..A-1`` (rank-interleaved). ``step_positions`` is the
only place that layout is written; the sampler and ``sortpack inspect`` both use it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..permutation import KeyedPermutation

ORDERS = ("index", "shuffle", "curriculum")


@dataclass(frozen=True)
class StepOrder:
    """How an epoch's steps are ordered: ``order`` and ``seed``, and the flags that drop or move steps.

    The sampler's options of the same names (``PackedSampler``, ``EpochPlan``); ``sortpack
    inspect --step/--sample`` traces under one.
    """

    order: str = "index"
    seed: int = 0
    drop_last: bool = False
    largest_first: bool = False
    warmup_shapes: bool = False

    def epoch_plan(self, index, world: int, accum: int, epoch: int = 0) -> EpochPlan:
        """Return the ``EpochPlan`` of ``epoch`` for ``world`` ranks accumulating ``accum`` under this order."""
        return EpochPlan(index, world, accum, self.order, self.seed, epoch, self.drop_last, self.largest_first,
                         self.warmup_shapes)


def step_positions(count: int, world_size: int, grad_accum: int, start: int = 0,
                   drop_last: bool = False) -> np.ndarray:
    """Return the flat positions of the steps covering ``[start, count)`` as an array (steps, A, W).

    Entry ``[s, a, r]`` is what rank ``r`` takes as micro-batch ``a`` of step ``s``:
    ``start + s*W*A + a*W + r``. A short tail is one more step reaching past ``count``
    (the caller wraps those positions: they repeat micro-batches from the start), or is left
    out with ``drop_last``.

    Examples
    --------
    >>> from sortpack.reader import step_positions
    >>> step_positions(5, world_size=2, grad_accum=1).tolist()  # step 2 reaches past 5: it repeats 0
    [[[0, 1]], [[2, 3]], [[4, 5]]]
    >>> step_positions(5, world_size=2, grad_accum=1, drop_last=True).tolist()
    [[[0, 1]], [[2, 3]]]
    >>> step_positions(8, world_size=2, grad_accum=2)[0]  # step 0: rank r takes column r
    array([[0, 1],
           [2, 3]])
    """
    width = world_size * grad_accum
    left = max(0, count - start)
    steps = left // width if drop_last else -(-left // width)
    flat = start + np.arange(steps * width, dtype=np.int64)
    return flat.reshape(steps, grad_accum, world_size)


def steps_moved(index, order: str, largest_first: bool, warmup_shapes: bool) -> list[str]:
    """Return the settings (``order=...``, ``largest_first``, ``warmup_shapes``) that would move a mixture plan's steps.

    Empty for a plan that is not a mixture: its order is free. A mixture plan's order is its
    schedule, so the sampler refuses these, and ``inspect --step/--sample`` with them too.
    """
    if index.mixture is None:
        return []
    moved = [f"order={order!r}"] if order != "index" else []
    return moved + [name for name, on in (("largest_first", largest_first), ("warmup_shapes", warmup_shapes)) if on]


def check_group_alignment(options: dict, width: int) -> None:
    """Raise ValueError when steps of ``width`` micro-batches would split same-shape groups."""
    group = int(options.get("group_size") or 1)
    if not options.get("same_shape") or group <= 1:
        return
    if width % group and group % width:
        raise ValueError(
            f"world_size * grad_accum = {width} does not fit the index's same-shape groups of "
            f"{group} micro-batches: use a multiple of {group} (each step is whole groups) "
            f"or a divisor of {group} (each step lies inside one group)")


def warmup_order(batch_size: np.ndarray, padded_size: np.ndarray, base: np.ndarray, world: int,
                 width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (head, rest, synthetic steps) of a ``warmup_shapes`` epoch over block order ``base``.

    ``base`` is every packed block (of ``width`` micro-batches) in the epoch's order. ``head``
    lists, costliest shape first, one block per distinct (batch_size, padded_size) not yet
    shown to every rank: the first block of ``base`` showing it to every rank, or ``-k`` for
    synthetic step k-1 (row k-1 of the third array: a step made of that shape alone) when no
    block does. ``rest`` is ``base`` without the moved blocks.
    """
    bs = np.asarray(batch_size).astype(np.int64)
    ps = np.asarray(padded_size).astype(np.int64)
    m = len(bs)
    keys, codes = np.unique((ps << 31) | bs, return_inverse=True)
    d = len(keys)
    shape_ps, shape_bs = keys >> 31, keys & ((1 << 31) - 1)
    by_cost = np.lexsort((-shape_ps, -(shape_bs * shape_ps)))  # largest first
    # Which blocks show shape c to every rank: unique (block, shape, rank) triples,
    # then count ranks per (block, shape).
    s, w, g = len(base), world, width
    flat = np.arange(s * g, dtype=np.int64)
    c = codes[flat % m].astype(np.int64)
    bc = (flat // g) * d + c
    triples = np.unique(bc * w + (flat % w))
    pairs, counts = np.unique(triples // w, return_counts=True)
    covering = pairs[counts == w]
    cov_block, cov_shape = covering // d, covering % d
    rank_of = np.empty(s, dtype=np.int64)
    rank_of[base] = np.arange(s)
    # first covering block (in this epoch's order) of each shape
    sel = np.lexsort((rank_of[cov_block], cov_shape))
    shapes_sorted, first_idx = np.unique(cov_shape[sel], return_index=True)
    first_block = dict(zip(shapes_sorted.tolist(), cov_block[sel][first_idx].tolist()))
    by_block = np.argsort(cov_block, kind="stable")
    blocks_sorted = cov_block[by_block]
    members = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[members], np.arange(d + 1))
    covered = np.zeros(d, dtype=bool)
    head, synth, moved = [], [], []
    for shape in by_cost.tolist():
        if covered[shape]:
            continue
        block = first_block.get(shape)
        if block is not None:
            lo, hi = np.searchsorted(blocks_sorted, [block, block + 1])
            covered[cov_shape[by_block[lo:hi]]] = True
            head.append(block)
            moved.append(block)
        else:
            # no block shows this shape to every rank: add a step made of it alone
            mine = members[bounds[shape]:bounds[shape + 1]]
            synth.append(mine[np.arange(g) % len(mine)])
            head.append(-len(synth))
            covered[shape] = True
    rest = base[~np.isin(base, np.asarray(moved, dtype=np.int64))]
    synth_steps = np.stack(synth).astype(np.int64) if synth else np.zeros((0, g), dtype=np.int64)
    return np.asarray(head, dtype=np.int64), rest, synth_steps


class EpochPlan:
    """One epoch's flat sequence of micro-batches, cut into blocks of ``world * accum``.

    Block ``b`` of the packed order is micro-batches ``b*G .. b*G+G-1`` (modulo the count,
    which pads the tail from the start); the epoch visits blocks in its order. A sampler
    cuts this sequence into steps from any position, with any width.

    Examples
    --------
    The 6 micro-batches of ``plan/`` (``PackedIndex``'s example) for 2 ranks: blocks of 2,
    in packed order or shuffled whole:

    >>> from sortpack.reader import EpochPlan, PackedIndex
    >>> plan = EpochPlan(PackedIndex("plan/"), world=2, accum=1)
    >>> [plan.packed(flat) for flat in range(plan.length)]
    [0, 1, 2, 3, 4, 5]
    >>> plan = EpochPlan(PackedIndex("plan/"), world=2, accum=1, order="shuffle", seed=1)
    >>> [plan.packed(flat) for flat in range(plan.length)]
    [2, 3, 0, 1, 4, 5]
    """

    def __init__(self, index, world: int, accum: int, order: str = "index",
                 seed: int = 0, epoch: int = 0, drop_last: bool = False,
                 largest_first: bool = False, warmup_shapes: bool = False):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
        self.index, self.world, self.accum = index, int(world), int(accum)
        self.width = g = self.world * self.accum
        self.m = m = index.num_microbatches
        self.num_packed_blocks = (m // g) if drop_last else -(-m // g)
        self._perm = KeyedPermutation(self.num_packed_blocks, seed, epoch) if order != "index" else None
        self._order: np.ndarray | None = None
        self._last_t, self._last_block = -1, -1  # the latest block() asked for, kept
        self._synth = np.zeros((0, g), dtype=np.int64)
        if order == "curriculum" or largest_first or warmup_shapes:
            self._materialise(order, largest_first, warmup_shapes)
        self.num_blocks = self.num_packed_blocks if self._order is None else len(self._order)
        self.length = self.num_blocks * g
        self._flat: tuple | None = None  # per flat position: micro-batch, repeat, running samples/tokens
        self._runs: dict[str, np.ndarray] = {}  # running sums of index columns over the flat positions

    def _base_order(self, order: str) -> np.ndarray:
        s = self.num_packed_blocks
        if order == "index":
            return np.arange(s, dtype=np.int64)
        assert self._perm is not None  # every order but "index" has its permutation
        shuffled = self._perm.array(np.arange(s))
        if order == "shuffle":
            return shuffled
        # A block belongs to the stage of its first micro-batch. Sorting by (stage, place in
        # the shuffle) keeps stages ascending and the shuffle's order inside each stage, so
        # an index without stages gets exactly the "shuffle" order.
        place = np.empty(s, dtype=np.int64)
        place[shuffled] = np.arange(s)
        stages = self.index.take("stage", (np.arange(s, dtype=np.int64) * self.width) % self.m)
        return np.lexsort((place, stages)).astype(np.int64)

    def _packed_block_positions(self) -> np.ndarray:
        flat = np.arange(self.num_packed_blocks * self.width, dtype=np.int64) % max(self.m, 1)
        return flat.reshape(self.num_packed_blocks, self.width)

    def _materialise(self, order: str, largest_first: bool, warmup_shapes: bool) -> None:
        base = self._base_order(order)
        if base.size == 0:
            self._order = base
            return
        head = np.zeros(0, dtype=np.int64)
        if warmup_shapes:
            head, base = self._warmup(base)
        if largest_first and base.size:
            pos = self._packed_block_positions()[base]
            bs = self.index["batch_size"].astype(np.int64)
            ps = self.index["padded_size"].astype(np.int64)
            cost, length = (bs * ps)[pos].max(axis=1), ps[pos].max(axis=1)
            # padded tokens decide, the longer sequence breaks ties, the earlier block wins
            first = int(np.lexsort((-np.arange(base.size), length, cost))[-1])
            base = np.concatenate((base[first:first + 1], base[:first], base[first + 1:]))
        self._order = np.concatenate((head, base))

    def _warmup(self, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        head, rest, synth = warmup_order(self.index["batch_size"], self.index["padded_size"], base,
                                         self.world, self.width)
        if len(synth):
            self._synth = synth
        return head, rest

    def block(self, t: int) -> int:
        """Return the packed block (negative: a synthetic warm-up block) visited t-th."""
        if self._order is not None:
            return int(self._order[t])
        if self._perm is None:
            return t
        # the sampler asks for the same block for the step's ids and for its LR
        if t != self._last_t:
            self._last_t, self._last_block = t, self._perm(t)
        return self._last_block

    def packed(self, flat: int) -> int:
        """Return the micro-batch number at flat position ``flat`` of the epoch."""
        t, off = divmod(flat, self.width)
        b = self.block(t)
        if b < 0:
            return int(self._synth[-b - 1, off])
        return (b * self.width + off) % self.m

    def packed_array(self, flat) -> np.ndarray:
        """Return the micro-batch numbers at an array of flat positions."""
        flat = np.asarray(flat, dtype=np.int64)
        t, off = np.divmod(flat, self.width)
        if self._order is not None:
            b = self._order[t]
        elif self._perm is not None:
            uniq, inv = np.unique(t, return_inverse=True)
            b = self._perm.array(uniq)[inv].reshape(t.shape)
        else:
            b = t
        out = (b * self.width + off) % max(self.m, 1)
        neg = b < 0
        if neg.any():
            out[neg] = self._synth[-b[neg] - 1, off[neg]]
        return out

    def is_repeat(self, flat: int) -> bool:
        """Return whether flat position ``flat`` repeats a micro-batch to fill a step (see ``repeated``)."""
        if flat >= self.length:
            return True
        t, off = divmod(flat, self.width)
        b = self.block(t)
        return b < 0 or b * self.width + off >= self.m

    def repeated(self, flat) -> np.ndarray:
        """Return, per flat position, whether it repeats a micro-batch to fill a step (bool array).

        True past the packed order's end (the tail padded from the start), past the epoch's
        end (a step that straddles it after ``set_grad_accum``) and in a warm-up step made
        of copies (its micro-batches come again later in the epoch).
        """
        flat = np.asarray(flat, dtype=np.int64)
        t = np.minimum(flat // self.width, max(self.num_blocks - 1, 0))
        if self._order is not None:
            b = self._order[t] if self._order.size else np.zeros_like(t)
        elif self._perm is not None:
            uniq, inv = np.unique(t, return_inverse=True)
            b = self._perm.array(uniq)[inv].reshape(t.shape)
        else:
            b = t
        return (flat >= self.length) | (b < 0) | (b * self.width + flat % self.width >= self.m)

    def _flat_table(self) -> tuple:
        """Return, per flat position of the epoch, (micro-batch, repeat flag, running sums of samples and tokens).

        Built once per plan with a few vectorised passes (O(length)), so the sampler hands out
        a step with array lookups instead of a block lookup per micro-batch and a sum per step.
        """
        if self._flat is None:
            flat = np.arange(self.length, dtype=np.int64)
            packed = self.packed_array(flat)
            self._flat = (packed, self.repeated(flat), self.running("num_samples", packed),
                          self.running("tokens", packed))
        return self._flat

    def running(self, name: str, packed: np.ndarray | None = None) -> np.ndarray:
        """Return the running sum of index column ``name`` over the epoch's flat positions (length + 1, from 0)."""
        run = self._runs.get(name)
        if run is None:
            if packed is None:
                packed = self._flat_table()[0]
            run = np.zeros(self.length + 1, dtype=np.int64)
            if self.length:
                np.cumsum(self.index.take(name, packed), out=run[1:])
            self._runs[name] = run
        return run

    def step_parts(self, pos: int, world: int, accum: int, rank: int) -> tuple[list, list, int, int]:
        """Return rank ``rank``'s part of the step of ``world * accum`` positions from flat ``pos``.

        That is (its micro-batch numbers, whether each repeats one to fill a step, the step's
        samples and tokens over all ranks): what ``packed``, ``is_repeat`` and ``span_sum``
        give, read from the epoch's flat table.
        """
        packed, repeat, samples, tokens = self._flat_table()
        length, width = self.length, world * accum
        mine = [pos + k * world + rank for k in range(accum)]
        ids = [int(packed[f % length]) for f in mine]
        rep = [f >= length or bool(repeat[f]) for f in mine]
        start = pos % length
        if start + width <= length:
            return ids, rep, int(samples[start + width] - samples[start]), int(tokens[start + width] - tokens[start])
        return ids, rep, int(self.span_sum("num_samples", start, width)), int(self.span_sum("tokens", start, width))

    def steps_ahead(self, pos: int, world: int, accum: int, rank: int, count: int) -> tuple[list, list, list, list]:
        """Return rank ``rank``'s parts of up to ``count`` steps from flat ``pos``, as ``step_parts`` gives each.

        That is (micro-batch numbers, repeat flags: ``accum`` per step, one after another; the
        steps' samples; their tokens), as Python lists, computed in a few vectorised passes.
        Only steps that end inside the epoch are given (none when the first does not): a step
        that straddles its end comes from ``step_parts``.
        """
        packed, repeat, samples, tokens = self._flat_table()
        width = world * accum
        steps = min(count, (self.length - pos) // width) if pos >= 0 else 0
        if steps <= 0:
            return [], [], [], []
        starts = pos + np.arange(steps, dtype=np.int64) * width
        mine = (starts[:, None] + np.arange(accum, dtype=np.int64)[None, :] * world + rank).reshape(-1)
        return (packed[mine].tolist(), repeat[mine].tolist(), (samples[starts + width] - samples[starts]).tolist(),
                (tokens[starts + width] - tokens[starts]).tolist())

    def span_sum(self, name: str, start: int, count: int) -> int:
        """Return the sum of column ``name`` over flat positions ``[start, start+count)`` (mod length)."""
        if name in self._runs and 0 <= start and start + count <= self.length:
            run = self._runs[name]  # the sampler's steps: two lookups in the epoch's running sums
            return int(run[start + count] - run[start])
        if count == self.width and start % self.width == 0 and start + count <= self.length:
            b = self.block(start // self.width)
            if b >= 0:  # the common case: one whole packed block, contiguous on disk
                lo = b * self.width
                hi = lo + self.width
                if hi <= self.m:
                    return self.index.range_sum(name, lo, hi)
                return (self.index.range_sum(name, lo, self.m)
                        + self._wrapped_sum(name, hi - self.m))
        flat = (start + np.arange(count, dtype=np.int64)) % self.length
        return int(self.index.take(name, self.packed_array(flat)).sum())

    def _wrapped_sum(self, name: str, count: int) -> int:
        whole, rest = divmod(count, self.m)
        total = whole * self.index.range_sum(name, 0, self.m) if whole else 0
        return total + self.index.range_sum(name, 0, rest)
