"""Rows composed by their loss targets (``--rows --balance targets``): best fit's rows, with samples
exchanged between rows so that every row carries about the window's mean targets.

Best fit packs a window by sizes alone (``window_rows``); here the samples of each size are
first spread by their targets (``targets_spread``), equal-size samples then swap between rows
(``compose_rows``: the rows keep their sizes exactly), and last the heaviest rows trade samples
of different sizes with lighter rows within the room both rows have free (``exchange_heavy``):
the number of rows, their fill and their padding stay those of best fit. Every step is a pure
function of one window's sizes and targets, so the plan is the same at any rank count.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...kernels.compose import NONE, compose_groups, min_subsets, subset_of
from ...kernels.gather import run_indices

_REVERSED_BYTES = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], dtype=np.uint32)


def _bit_reversed(i: np.ndarray) -> np.ndarray:
    """Return each non-negative integer under 2^32 with its 32 bits reversed (the van der Corput order)."""
    u = i.astype(np.uint32)
    b = _REVERSED_BYTES
    return (b[u & 255] << 24) | (b[(u >> 8) & 255] << 16) | (b[(u >> 16) & 255] << 8) | b[u >> 24]


def _classes(values: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (each element's rank in its run of equal ``values`` along ``order``, where each run starts)."""
    v = values[order]
    n = len(v)
    starts = np.flatnonzero(np.concatenate(([True], v[1:] != v[:-1]))) if n else np.zeros(0, np.int64)
    lengths = np.diff(np.concatenate((starts, [n])))
    return np.arange(n, dtype=np.int64) - np.repeat(starts, lengths), starts


def targets_spread(sizes: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Return a permutation of one row window's samples that spreads each size's targets along it.

    The samples of one size keep the positions that size had, and take them in the van der
    Corput order of their targets (the most, then the median, the quartiles, ...): best fit,
    which sees only sizes, packs the same rows, and a row that takes several samples of one
    size (consecutive there) gets a spread of their targets rather than the extremes.
    """
    n = len(sizes)
    at = np.lexsort((np.arange(n), sizes))  # the positions of each size, in order
    by_targets = np.lexsort((np.arange(n), -targets, sizes))  # each size's samples, most targets first
    rank, _ = _classes(sizes, by_targets)
    spread = by_targets[np.lexsort((_bit_reversed(rank), sizes[by_targets]))]
    perm = np.empty(n, dtype=np.int64)
    perm[at] = spread
    return perm


def compose_rows(sizes: np.ndarray, targets: np.ndarray, order: np.ndarray, splits: np.ndarray,
                 sweeps: int = 2) -> np.ndarray:
    """Return ``order`` (rows ``order[splits[r]:splits[r+1]]`` of one window) with samples of equal size
    exchanged between rows so that every row's targets come near the window's mean.

    Rows keep their sizes exactly (the same fill, padding and shapes): only which sample of a
    size sits in which of that size's slots changes. Slots are grouped by (size, how many slots
    of that size its row already has before it); each group holds a row at most once, so giving
    the group's samples, most targets first, to its rows, fewest targets elsewhere first, is the
    best exchange for that group given the rest (the sum of squares of the rows' targets never
    grows). ``sweeps`` passes over the groups, largest sizes first (``kernels.compose_groups``).
    Samples in each row end in their window order.
    """
    n_rows = len(splits) - 1
    row = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(splits))
    slot = order.astype(np.int64, copy=True)
    size = sizes[slot]
    by_row = np.lexsort((np.arange(len(slot)), row, -size))  # slots by size (largest first), row, position
    nth, _ = _classes(size[by_row] * (n_rows + 1) + row[by_row], np.arange(len(slot)))
    grouped = by_row[np.lexsort((nth, -size[by_row]))]  # by (size, nth), rows ascending inside each group
    key = np.empty(len(slot), np.int64)
    key[by_row] = nth
    g = size[grouped] * (len(slot) + 1) + key[grouped]
    bounds = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1], [True]))) if len(g) else np.zeros(1, np.int64)
    compose_groups(slot, row, targets, (grouped, bounds), sweeps if targets.any() else 0)
    return slot[np.lexsort((slot, row))]


# Exchanges between rows of different sizes (``exchange_heavy``). Each constant is the value that
# ``python -m benchmarks --only compose --scale full`` (``benchmarks/bench_compose.py``) measures against a
# smaller and a larger one on 100k generated chats in rows of 4096, the others at theirs; its row in
# ``benchmarks/RESULTS-compose.md`` (W = 64 p99 / max targets imbalance; shipped: 1.040 / 1.066) is why.
HEAVY = 1.1  # rows above 1.1x the window's mean are heavy: 1.05 1.048 / 1.114 and three times the time, 1.2 1.068
PAIR_PLACES = 24  # pairs among each row's 24 largest samples: 12 and 48 the same on these chats (a bound, not a knob)
PAIR_WIDTH = 64  # the 64 lightest candidates of each room: 16 1.048 / 1.114, 256 no better (1.041 / 1.073)
PAIR_SLACK = 4  # full rows absorb a room difference of 4: 0 1.091 / 1.398, 16 no better (1.040 / 1.076)
PAIR_ROUNDS = 64  # rounds of pair swaps at most: 16 and 256 the same (the rounds end before; a bound)
SUBSET_PARTNERS = 256  # knapsack over the 256 lightest partners: 64 1.064 / 1.168; 1024 1.027 / 1.028 at 8x the time
SUBSET_PLACES = 16  # and their 16 largest samples: 8 1.084 / 1.271; 24 1.029 / 1.034 at about twice the time
SUBSET_ROUNDS = 8  # rounds of subset exchanges at most: 2 1.052 / 1.143, 32 the same as 8
# derived, where used: what the pairs leave above HEAVY^2 the subsets take on, and rows below 1 / HEAVY^2 take
# subsets of most targets; a subset's room is tried within PAIR_SLACK of the sample's


@dataclass
class _Rows:
    """One window's rows while samples move between them (mutable scratch of ``exchange_heavy``)."""

    rooms: np.ndarray  # each window sample's room in a row
    targets: np.ndarray  # each window sample's targets
    slot: np.ndarray  # the window sample at each position
    row: np.ndarray  # the row of each position
    total: np.ndarray  # each row's targets
    used: np.ndarray  # each row's rooms
    count: np.ndarray  # each row's samples
    was_heavy: np.ndarray  # rows that were heavy: never partners

    def move(self, h: int, w: int, out_of_h: np.ndarray, out_of_w: np.ndarray) -> None:
        """Move the positions ``out_of_h`` from row ``h`` to row ``w`` and ``out_of_w`` back, with the rows' sums."""
        t = int(self.targets[self.slot[out_of_w]].sum()) - int(self.targets[self.slot[out_of_h]].sum())
        r = int(self.rooms[self.slot[out_of_w]].sum()) - int(self.rooms[self.slot[out_of_h]].sum())
        c = len(out_of_w) - len(out_of_h)
        self.row[out_of_h], self.row[out_of_w] = w, h
        self.total[h] += t
        self.total[w] -= t
        self.used[h] += r
        self.used[w] -= r
        self.count[h] += c
        self.count[w] -= c


def exchange_heavy(rooms: np.ndarray, targets: np.ndarray, order: np.ndarray, splits: np.ndarray,
                   fit: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, splits) of one window's rows with the samples of the heaviest rows exchanged for lighter ones.

    After equal sizes are exchanged (``compose_rows``), a row of a few long samples that are
    mostly answer still carries up to twice the mean targets: no other samples of its sizes
    exist. Samples of different sizes are exchanged here instead, within what both rows have
    free, so each row still fits ``fit = (cap, max_segments)`` (0: no segment cap); the number
    of rows, their fill and their padding do not change. First one or two samples of each
    heavy row (above ``HEAVY`` times the mean) swap with one or two of one lighter row of
    about their room (``_pair_rounds``); then what is still above ``HEAVY^2`` swaps one
    sample for any subset of a light row's samples of its room, or moves it to a row with room
    to spare (``_subset_rounds``); last, the rows below ``1 / HEAVY^2`` times the mean take the
    subsets of most targets the same way. Each exchange is the one that brings the larger of its
    two rows' targets lowest (the smaller highest, for the light rows); each round is vectorised
    over all heavy rows or their partners.
    """
    n_rows = len(splits) - 1
    if n_rows < 2 or not targets.any():
        return order, splits
    slot = order.astype(np.int64, copy=True)
    row = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(splits))
    st = _Rows(rooms, targets, slot, row, np.bincount(row, targets[slot], minlength=n_rows).astype(np.int64),
               np.bincount(row, rooms[slot], minlength=n_rows).astype(np.int64), np.diff(splits).astype(np.int64),
               np.zeros(n_rows, bool))
    mean = float(st.total.mean())
    _pair_rounds(st, fit, mean * HEAVY)
    _subset_rounds(st, fit, mean * (HEAVY * HEAVY))
    # the lightest rows, the same way with the targets negated: they take the subsets of most targets
    light = _Rows(st.rooms, -st.targets, st.slot, st.row, -st.total, st.used, st.count, np.zeros(n_rows, bool))
    _subset_rounds(light, fit, -mean * (1 / (HEAVY * HEAVY)), take=True)
    new_splits = np.concatenate(([0], np.cumsum(np.bincount(st.row, minlength=n_rows)))).astype(splits.dtype)
    return st.slot[np.lexsort((st.slot, st.row))], new_splits


def _row_pairs(row_of: np.ndarray, slots: np.ndarray, rooms: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (first, second): every pair of ``slots`` sharing a row, among each row's ``most`` largest rooms."""
    n = len(slots)
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    by_room = np.lexsort((slots, -rooms, row_of))  # each row's slots, largest rooms first
    rank, starts = _classes(row_of, by_room)
    counts = np.diff(np.concatenate((starts, [n])))
    # a row of many small samples adds at most most*(most-1)/2 pairs
    keep = by_room[rank < most]
    kept_counts = np.minimum(counts, most)
    kept_starts = np.concatenate(([0], np.cumsum(kept_counts)[:-1]))
    firsts = run_indices(kept_starts, kept_counts)
    after = np.repeat(kept_starts + kept_counts, kept_counts) - firsts - 1
    return slots[keep[np.repeat(firsts, after)]], slots[keep[run_indices(firsts + 1, after)]]


def _groups(st: _Rows, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (a, b, room, targets) of the singles (b = -1) and same-row pairs of positions ``at``, by room, targets."""
    first, second = _row_pairs(st.row[at], at, st.rooms[st.slot[at]], PAIR_PLACES)
    a = np.concatenate((at, first))
    b = np.concatenate((np.full(len(at), -1, np.int64), second))
    two = b >= 0
    room = st.rooms[st.slot[a]] + np.where(two, st.rooms[st.slot[np.where(two, b, a)]], 0)
    t = st.targets[st.slot[a]] + np.where(two, st.targets[st.slot[np.where(two, b, a)]], 0)
    by = np.lexsort((t, room))
    return a[by], b[by], room[by], t[by]


def _pair_rounds(st: _Rows, fit: tuple[int, int], limit: float) -> None:
    """Swap one or two samples of each row above ``limit`` with one or two of a lighter row of about their room.

    The candidates are the singles and same-row pairs of the rows at most ``limit``, by room and
    then targets. Each round gives every heavy row its best swap among the ``PAIR_WIDTH``
    candidates of fewest targets near each of its singles' and pairs' rooms; a candidate row
    goes to the heaviest row that wants it, and gives only once (its candidates are then stale).
    """
    n_rows = len(st.total)
    groups = _groups(st, np.flatnonzero(st.total[st.row] <= limit))
    cands = (*groups, st.row[groups[0]])  # and each candidate's row, as it was
    taken = np.zeros(n_rows, bool)
    done = np.zeros(n_rows, bool)  # a heavy row with no swap left
    for _ in range(PAIR_ROUNDS):
        heavy = (st.total > limit) & ~done
        if not heavy.any():
            return
        taken |= heavy
        st.was_heavy |= heavy
        heavies = _groups(st, np.flatnonzero(heavy[st.row]))
        owner, cand, gain, delta, worst = _swap_costs(st, heavies, cands, taken, fit)
        ch, cw = st.row[heavies[0]][owner], cands[4][cand]
        better = worst < st.total[ch]
        done |= heavy & (np.bincount(ch[better], minlength=n_rows) == 0)
        pick = np.flatnonzero(better)
        if not len(pick):
            return
        # each heavy row's best, then each candidate row to the heaviest row that wants it
        pick = pick[np.lexsort((pick, worst[pick], ch[pick]))]
        pick = pick[np.concatenate(([True], ch[pick][1:] != ch[pick][:-1]))]
        pick = pick[np.lexsort((pick, -st.total[ch[pick]], cw[pick]))]
        pick = pick[np.concatenate(([True], cw[pick][1:] != cw[pick][:-1]))]
        taken[_swap(st, heavies, cands, (owner[pick], cand[pick], delta[pick], gain[pick]))] = True


def _swap_costs(st: _Rows, heavies: tuple, cands: tuple, taken: np.ndarray, fit: tuple[int, int]) -> tuple:
    """Return (owner, candidate, samples the heavy row gains, targets it gains, the larger row's targets after) of
    every swap of a heavy group (``heavies``, by ``owner``) with a candidate group near its room that both rows
    hold (``worst``: ``int64`` max where they cannot)."""
    cap, max_segments = fit
    x_a, x_b, x_room, x_t = heavies
    _, c_b, c_room, c_t, c_row = cands
    h = st.row[x_a]
    free = cap - st.used
    lo = np.searchsorted(c_room, x_room - min(int(free.max()), PAIR_SLACK), "left")
    hi = np.searchsorted(c_room, x_room + free[h], "right")
    span = np.minimum(hi - lo, PAIR_WIDTH)
    cand = run_indices(lo, span)
    owner = np.repeat(np.arange(len(x_a)), span)
    ch, cw, cr = h[owner], c_row[cand], c_room[cand]
    ok = ~taken[cw] & (cr - x_room[owner] <= free[ch]) & (x_room[owner] - cr <= free[cw])
    gain = (c_b[cand] >= 0).astype(np.int64) - (x_b[owner] >= 0)  # samples the heavy row gains
    if max_segments:
        ok &= (st.count[ch] + gain <= max_segments) & (st.count[cw] - gain <= max_segments)
    delta = c_t[cand] - x_t[owner]
    worst = np.where(ok, np.maximum(st.total[ch] + delta, st.total[cw] - delta), np.iinfo(np.int64).max)
    return owner, cand, gain, delta, worst


def _swap(st: _Rows, heavies: tuple, cands: tuple, chosen: tuple) -> np.ndarray:
    """Make the ``chosen`` swaps (owner, candidate, targets and samples the heavy row gains); return the candidates'
    rows."""
    x_a, x_b, x_room, _ = heavies
    c_a, c_b, c_room, _, c_row = cands
    xo, j, delta, g = chosen
    hh, w = st.row[x_a][xo], c_row[j]
    np.add.at(st.total, hh, delta)
    np.add.at(st.total, w, -delta)
    np.add.at(st.used, hh, c_room[j] - x_room[xo])
    np.add.at(st.used, w, x_room[xo] - c_room[j])
    np.add.at(st.count, hh, g)
    np.add.at(st.count, w, -g)
    # the firsts of both sides swap samples; the seconds swap too, or one moves to the other row
    xa, xb, ya, yb = x_a[xo], x_b[xo], c_a[j], c_b[j]
    st.slot[xa], st.slot[ya] = st.slot[ya], st.slot[xa].copy()
    both = (xb >= 0) & (yb >= 0)
    st.slot[xb[both]], st.slot[yb[both]] = st.slot[yb[both]], st.slot[xb[both]].copy()
    st.row[yb[(yb >= 0) & (xb < 0)]] = hh[(yb >= 0) & (xb < 0)]
    st.row[xb[(xb >= 0) & (yb < 0)]] = w[(xb >= 0) & (yb < 0)]
    return w


@dataclass
class _Offer:
    """What one round's partner rows can give: their rows, their samples' places, rooms and targets, the knapsack."""

    rows: np.ndarray  # the partner rows
    where: np.ndarray  # (partners, SUBSET_PLACES): the positions of their largest samples, -1 none
    rooms: np.ndarray  # those samples' rooms (0: none)
    targets: np.ndarray  # and targets
    fewest: np.ndarray  # (partners, top + 1): the fewest targets of a subset of each room (kernels.knapsack)
    open: np.ndarray  # partners no row took this round

    def subset(self, i: int, room: int) -> np.ndarray:
        """Return the positions of partner ``i``'s subset of room ``room`` with the fewest targets (none for 0)."""
        if not room:
            return np.zeros(0, np.int64)
        return self.where[i, subset_of(self.rooms[i], self.targets[i], room)]


def _offer(st: _Rows, cap: int, reach: int) -> _Offer | None:
    """Return the round's ``_Offer``: the ``SUBSET_PARTNERS`` lightest rows under the mean, never heavy, whose
    ``SUBSET_PLACES`` largest samples and free room reach ``reach`` (None: no such row).
    """
    most = SUBSET_PLACES
    rows = np.flatnonzero(~st.was_heavy & (st.total <= st.total.mean()))
    free = cap - st.used[rows]
    at = np.flatnonzero(np.isin(st.row, rows))
    at = at[np.lexsort((at, -st.rooms[st.slot[at]], st.row[at]))]  # each row's largest first
    i_of = np.searchsorted(rows, st.row[at])
    place, _ = _classes(i_of, np.arange(len(at)))
    keep = place < most
    where = np.full((len(rows), most), -1, np.int64)
    where[i_of[keep], place[keep]] = at[keep]
    has = where >= 0
    p_room = np.where(has, st.rooms[st.slot[np.maximum(where, 0)]], 0)
    p_t = np.where(has, st.targets[st.slot[np.maximum(where, 0)]], 0)
    # a row of many small samples is where subsets of every room are; of those, the lightest
    use = np.flatnonzero(p_room.sum(axis=1) + free >= reach)
    use = np.sort(use[np.lexsort((use, st.total[rows[use]]))][:SUBSET_PARTNERS])
    if not len(use):
        return None
    top = min(reach + int((cap - st.used).max()), cap)
    return _Offer(rows[use], where[use], p_room[use], p_t[use], min_subsets(p_room[use], p_t[use], top),
                  np.ones(len(use), bool))


def _best_exchange(st: _Rows, offer: _Offer, heavy: tuple[int, np.ndarray], free: np.ndarray, take: bool
                   ) -> tuple[int, int, np.ndarray] | None:
    """Return (partner, subset room, positions out of ``h``) of the exchange that brings the larger of row ``h``
    and its partner lowest, below ``h``'s targets now (None: there is none; ``heavy``: ``h`` and ``mine``).

    One of ``h``'s samples (``mine``) for a partner's subset of about its room; or the sample alone into a
    partner with room for it (never emptying ``h``); or, with ``take``, a partner's subset into ``h``'s free room.
    """
    h, mine = heavy
    top = offer.fewest.shape[1] - 1
    rows = offer.rows
    xr, xt = st.rooms[st.slot[mine]], st.targets[st.slot[mine]]
    offsets = np.arange(-PAIR_SLACK, PAIR_SLACK + 1)  # subset rooms this near a sample's: what full rows absorb
    size = xr[:, None] + offsets[None, :]  # (samples, offsets): the subset rooms tried
    ok = (size >= 0) & (size <= top) & (size - xr[:, None] <= free[h])
    got = offer.fewest[:, np.clip(size, 0, top)]  # (partners, samples, offsets)
    fits = ok[None] & (xr[:, None] - size <= free[rows][:, None, None]) & (got < NONE) & offer.open[:, None, None]
    t_w = st.total[rows][:, None, None] - got + xt[None, :, None]
    swap = np.where(fits, np.maximum(st.total[h] - xt[None, :, None] + got, t_w), NONE)
    moves = offer.open[:, None] & (free[rows][:, None] >= xr[None, :]) & (len(mine) > 1)
    move = np.where(moves, np.maximum(st.total[h] - xt[None, :], st.total[rows][:, None] + xt[None, :]), NONE)
    into = min(int(free[h]), top) if take else 0
    got = offer.fewest[:, 1:into + 1]
    takes = np.where((got < NONE) & offer.open[:, None], np.maximum(st.total[h] + got, st.total[rows][:, None] - got),
                     NONE)
    j_swap, j_move = int(np.argmin(swap)), int(np.argmin(move))
    j_take = int(np.argmin(takes)) if into else -1
    best = min(swap.flat[j_swap], move.flat[j_move], takes.flat[j_take] if into else NONE)
    if best >= st.total[h]:
        return None
    if into and takes.flat[j_take] == best:
        i, room = np.unravel_index(j_take, takes.shape)
        return int(i), int(room) + 1, mine[:0]
    if move.flat[j_move] == best:
        i, k = np.unravel_index(j_move, move.shape)
        return int(i), 0, mine[k:k + 1]
    i, k, d = np.unravel_index(j_swap, swap.shape)
    return int(i), int(size[k, d]), mine[k:k + 1]


def _subset_rounds(st: _Rows, fit: tuple[int, int], limit: float, take: bool = False) -> None:
    """Exchange one sample of each row above ``limit`` for the subset of a light row of about its room with fewest
    targets, or move it to a light row with room for it (``_best_exchange``).

    What pairs cannot reach (a row of two long, mostly-answer samples: no one or two samples of
    any row sum to their rooms): the partners (``_offer``) offer every subset room through one
    knapsack of fewest targets per round (``kernels.compose``). Each heavy row, heaviest first,
    makes its best exchange with a partner no other row took this round: one vectorised step
    per heavy row.
    """
    cap, max_segments = fit
    stuck = np.zeros(len(st.total), bool)
    for _ in range(SUBSET_ROUNDS):
        heavy = np.flatnonzero((st.total > limit) & ~stuck)
        if not len(heavy):
            return
        heavy = heavy[np.lexsort((heavy, -st.total[heavy]))]
        st.was_heavy[heavy] = True
        xs = np.flatnonzero(np.isin(st.row, heavy))
        xs = xs[np.argsort(st.row[xs], kind="stable")]
        offer = _offer(st, cap, int(st.rooms[st.slot[xs]].max()))
        if offer is None:
            return
        free = cap - st.used
        at, ends = np.searchsorted(st.row[xs], heavy), np.searchsorted(st.row[xs], heavy, "right")
        for h, a, b in zip(heavy.tolist(), at.tolist(), ends.tolist()):  # the few rows still heavy
            found = _best_exchange(st, offer, (h, xs[a:b]), free, take)
            if found is None:
                stuck[h] = True
                continue
            i, room, out = found
            back, w = offer.subset(i, room), int(offer.rows[i])
            offer.open[i] = False
            counts = (st.count[h] - len(out) + len(back), st.count[w] + len(out) - len(back))
            if min(counts) < 1 or (max_segments and max(counts) > max_segments):
                continue
            st.move(h, w, out, back)
