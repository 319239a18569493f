"""What one in-memory batch packs: its sequences, or its groups of sequences that share a micro-batch (``Items``).

A sequence's room is its length rounded up to ``pad_to_multiple`` (context parallelism pads every
document to 2 x CP); a group is one item of its members' summed rooms, second sizes and targets.
Every input is checked here, each error naming its keyword and the first bad index.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SortpackError
from ..kernels import round_lengths
from ..stages.pack.balance import balance_of
from ..stages.pack.options import PackOptions
from .options import BatchOptions


@dataclass(frozen=True)
class Measures:
    """A batch's per-sequence inputs as checked int64 arrays (``size2``/``targets`` None when not given)."""

    lengths: np.ndarray
    targets: np.ndarray | None = None
    size2: np.ndarray | None = None
    cap2: int = 0  # the second cap's limit (0: none)
    cap2_name: str = ""  # its name in ``caps``, for messages
    groups: np.ndarray | None = None  # each sequence's group (0..G-1), None: every sequence alone


@dataclass(frozen=True)
class Items:
    """The units packed: sequences, or groups of them. Per item: raw size (the sort key), room, measures."""

    size: np.ndarray  # int64: the real tokens of the item (its members' lengths summed)
    room: np.ndarray  # int64: what it takes in a micro-batch (lengths rounded up to pad_to_multiple)
    size2: np.ndarray | None
    targets: np.ndarray | None
    count: np.ndarray | None  # sequences per item, None when every item is one sequence
    members: np.ndarray | None  # the sequences item by item (by index within an item), None: item i is sequence i
    offsets: np.ndarray | None  # where each item's members start in ``members``
    weight: np.ndarray | None = None  # float64: what the item weighs in the deal (``weight_of``)
    cap2: int = 0  # the limit of ``size2`` per micro-batch (0: no second cap)
    cap2_name: str = ""  # the keyword that set it, for messages

    def first_member(self, i: int) -> int:
        """Return the first sequence of item ``i``."""
        return i if self.members is None or self.offsets is None else int(self.members[self.offsets[i]])


def _integers(arr: np.ndarray, name: str) -> None:
    """Raise SortpackError unless ``arr`` holds integers that fit int64 (an integer or boolean dtype, or whole finite
    floats), naming the first bad index and its value."""
    if not len(arr) or np.issubdtype(arr.dtype, np.bool_):
        return
    if np.issubdtype(arr.dtype, np.unsignedinteger):
        past = np.flatnonzero(arr > np.iinfo(np.int64).max)
    elif np.issubdtype(arr.dtype, np.integer):
        return
    elif np.issubdtype(arr.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.rint(arr)))
        if len(bad):
            raise SortpackError(f"plan_batch: {name}[{int(bad[0])}] = {arr[bad[0]].item()!r}: must be an integer")
        past = np.flatnonzero(arr >= 2.0**63)
    else:
        raise SortpackError(f"plan_batch: {name} must hold integers, got dtype {arr.dtype}")
    if len(past):
        raise SortpackError(f"plan_batch: {name}[{int(past[0])}] = {arr[past[0]].item()!r}: past the largest int64")


def _column(values, name: str, n: int | None) -> np.ndarray:
    """Return ``values`` as a 1-d int64 array of non-negative integers (SortpackError naming ``name``)."""
    arr = np.asarray(values)
    if arr.ndim != 1 or (n is not None and len(arr) != n):
        shape = "1-d" if n is None else f"1-d of {n} values (one per length)"
        raise SortpackError(f"plan_batch: {name} must be {shape}, got shape {arr.shape}")
    _integers(arr, name)
    out = np.ascontiguousarray(arr, dtype=np.int64)
    bad = np.flatnonzero(out < 0)
    if len(bad):
        raise SortpackError(f"plan_batch: {name}[{int(bad[0])}] = {int(out[bad[0]])}: must be >= 0")
    return out


def _second_cap(caps: dict | None, n: int) -> tuple[np.ndarray | None, int, str]:
    """Return (values, limit, name) of the one second cap in ``caps`` (None, 0, "" without one)."""
    if not caps:
        return None, 0, ""
    if len(caps) > 1:
        raise SortpackError(f"plan_batch: caps holds {len(caps)} caps ({', '.join(map(str, caps))}); one second "
                            "cap beside max_tokens is supported")
    (name, spec), = caps.items()
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise SortpackError(f"plan_batch: caps[{name!r}] must be (values, limit)")
    limit = spec[1]
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise SortpackError(f"plan_batch: caps[{name!r}] limit {limit!r}: expected an integer >= 1")
    return _column(spec[0], f"caps[{name!r}] values", n), int(limit), str(name)


def measures_of(lengths, targets, caps: dict | None, groups) -> Measures:
    """Return the checked per-sequence inputs of ``plan_batch`` (SortpackError, one line, on the first bad one)."""
    lengths = _column(lengths, "lengths", None)
    n = len(lengths)
    t = None if targets is None else _column(targets, "targets", n)
    size2, cap2, name2 = _second_cap(caps, n)
    group_of = None
    if groups is not None:
        ids = np.asarray(groups)
        if ids.ndim != 1 or len(ids) != n:
            raise SortpackError(f"plan_batch: groups must be 1-d of {n} ids (one per length), got shape {ids.shape}")
        try:
            group_of = np.unique(ids, return_inverse=True)[1].astype(np.int64).reshape(-1)
        except TypeError as err:  # ids that do not compare (None beside ints): numpy's unique sorts them
            raise SortpackError(f"plan_batch: groups must hold ids of one kind that compare (ints or strings), "
                                f"got dtype {ids.dtype}: {err}") from None
    return Measures(lengths, t, size2, cap2, name2, group_of)


def items_of(m: Measures, opts: BatchOptions) -> Items:
    """Return the items to pack: each sequence, or each group with its members (``Measures.groups``)."""
    room = round_lengths(m.lengths, opts.pad_to_multiple) if opts.pad_to_multiple > 1 else m.lengths
    cap2, name2 = m.cap2, f"caps[{m.cap2_name!r}]"
    weight = weight_of(room, m.targets, opts)
    if m.groups is None:
        return Items(m.lengths, room, m.size2, m.targets, None, None, None, weight, cap2, name2)
    group = m.groups
    g = int(group.max()) + 1 if len(group) else 0
    members = np.argsort(group, kind="stable")
    count = np.bincount(group, minlength=g).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(count))).astype(np.int64)

    def summed(values: np.ndarray) -> np.ndarray:
        return np.bincount(group, values, minlength=g).astype(np.int64)

    size2 = None if m.size2 is None else summed(m.size2)
    if opts.max_samples:
        if size2 is not None:
            raise SortpackError("plan_batch: groups with max_samples and a second cap: a group counts its "
                                "sequences through the second cap, so give one or the other")
        size2, cap2, name2 = count, opts.max_samples, "max_samples"  # a group's sequences, capped as a measure
    return Items(summed(m.lengths), summed(room), size2, None if m.targets is None else summed(m.targets), count,
                 members, offsets, np.bincount(group, weight, minlength=g), cap2, name2)


def weight_of(room: np.ndarray, targets: np.ndarray | None, opts: BatchOptions) -> np.ndarray:
    """Return what each sequence weighs in the deal (float64): the weight of the pack stage's ``--balance`` mode
    (``C*s + s^2`` of its room, or its targets), or its room where plan_batch balances tokens."""
    mode = balance_of(PackOptions(max_tokens=opts.max_tokens, balance=opts.stage_mode, cost_coeff=opts.coeff))
    if not mode.orders:  # balance="tokens"
        return room.astype(np.float64)
    if mode.composes_rows and targets is None:
        raise SortpackError("plan_batch: balance='targets' balances the loss targets: pass targets=")
    measures = {} if targets is None else {"targets": targets}
    return np.asarray(mode.weight(room, measures), dtype=np.float64)


def oversize_of(items: Items, opts: BatchOptions) -> np.ndarray:
    """Return which items fit no micro-batch alone; SortpackError naming the first under ``oversize="error"``."""
    over = items.room > opts.max_tokens
    if items.size2 is not None:
        over |= items.size2 > items.cap2
    if opts.oversize == "alone" or not over.any():
        return over
    i = int(np.flatnonzero(over)[0])
    what = f"the group of sequence {items.first_member(i)}" if items.count is not None else f"sequence {i}"
    if items.room[i] > opts.max_tokens:
        padded = f" ({int(items.size[i])} tokens padded to multiples of {opts.pad_to_multiple})" \
            if opts.pad_to_multiple > 1 else ""
        reason = f"holds {int(items.room[i])} tokens{padded}, over max_tokens={opts.max_tokens}"
    else:
        assert items.size2 is not None
        reason = f"holds {int(items.size2[i])} of {items.cap2_name}, over its limit {items.cap2}"
    raise SortpackError(f"plan_batch: {what} {reason} ({int(over.sum())} over the caps in all); raise the cap or "
                        f"pass oversize='alone' (a micro-batch of its own)")
