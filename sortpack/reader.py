"""Train-time reader: open an index, plan steps for every rank, scale the learning rate.

Depends on numpy and pyarrow only (no torch, no MPI); ``sortpack.torch`` wraps it for
``DataLoader``. The step plan is a pure function of (index, world size, accumulation,
order, seed, epoch), so every rank computes the same plan without communication.
See docs/reader.md.
"""
from __future__ import annotations

import bisect
import math
import os
import weakref
from pathlib import Path

import numpy as np

from .errors import SortpackError
from .format import open_shard, read_manifest

ORDERS = ("index", "shuffle", "curriculum")
LR_METHODS = ("linear", "sqrt", "none")
_SCALAR_COLUMNS = ("microbatch", "num_samples", "batch_size", "max_size", "padded_size",
                   "tokens", "min_key", "max_key", "stage")
_M64 = (1 << 64) - 1


class PackedIndex:
    """A memory-mapped sortpack index: micro-batch metadata and sample ids without a full read."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.manifest = read_manifest(self.path, expect="index")
        self.options = dict(self.manifest.get("options") or {})
        self.num_microbatches = int(self.manifest["num_microbatches"])
        self.num_samples = int(self.manifest["num_samples"])
        entries = self.manifest["shards"]
        firsts = [int(e["first"]) for e in entries]
        if sum(int(e["rows"]) for e in entries) != self.num_microbatches or any(
                firsts[k] != firsts[k - 1] + int(entries[k - 1]["rows"]) for k in range(1, len(firsts))):
            raise SortpackError(f"{self.path}: manifest shards do not tile its micro-batches")
        # Refuse a damaged index now (a stat per shard); map a shard when a step first needs
        # it. Only Arrow footers and batch headers are read then, column pages on use.
        for entry in entries:
            shard = self.path / entry["file"]
            size = shard.stat().st_size if shard.is_file() else None
            if size != int(entry["bytes"]):
                found = "missing" if size is None else f"{size} bytes"
                raise SortpackError(f"{shard}: {found}, the manifest says {entry['bytes']} bytes")
        self._entries = entries
        self._shards: list = [None] * len(entries)
        self._firsts = firsts
        self._starts = np.array(firsts + [self.num_microbatches], dtype=np.int64)
        self._views: dict = {}
        self._columns: dict = {}
        names = list(self.manifest.get("schema") or {}) or (self._shard(0).schema.names if entries else [])
        missing = {"sample_ids", "num_samples", "batch_size", "padded_size", "tokens"} - set(names)
        if missing:
            raise SortpackError(f"{self.path}: index lacks column(s) {', '.join(sorted(missing))}")
        self.has_rows = "row_splits" in names
        self._stored = None

    @property
    def stored(self):
        """Return the index's ``StoredData`` (built with ``--store``/``--store-tokens``), or None."""
        if self._stored is None and self.manifest.get("data"):
            from .stored import StoredData

            self._stored = StoredData(self)
        return self._stored

    def _shard(self, k: int):
        batch = self._shards[k]
        if batch is None:
            entry = self._entries[k]
            batch = open_shard(self.path, entry)
            if batch.num_rows != int(entry["rows"]):
                raise SortpackError(f"{self.path / entry['file']}: {batch.num_rows} rows, "
                                    f"the manifest says {entry['rows']}")
            self._shards[k] = batch
        return batch

    def __reduce__(self):
        return (PackedIndex, (str(self.path),))

    def __repr__(self) -> str:
        return (f"PackedIndex({str(self.path)!r}, microbatches={self.num_microbatches}, "
                f"samples={self.num_samples})")

    def __len__(self) -> int:
        return self.num_microbatches

    @property
    def content_hash(self) -> str:
        """Return the manifest's content hash (identifies the index's contents)."""
        return str(self.manifest.get("content_hash", ""))

    # --- zero-copy views -----------------------------------------------------------
    def _view(self, k: int, name: str) -> np.ndarray:
        key = (k, name)
        view = self._views.get(key)
        if view is None:
            col = self._shard(k).column(name)
            if name in ("sample_ids", "row_splits"):
                view = (col.offsets.to_numpy(zero_copy_only=True), col.values.to_numpy(zero_copy_only=True))
            else:
                view = col.to_numpy(zero_copy_only=True)
            self._views[key] = view
        return view

    def _locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.num_microbatches:
            raise IndexError(f"micro-batch {i} out of range [0, {self.num_microbatches})")
        k = bisect.bisect_right(self._firsts, i) - 1
        return k, i - self._firsts[k]

    def _list_item(self, name: str, i: int) -> np.ndarray:
        k, j = self._locate(int(i))
        offsets, values = self._view(k, name)
        return values[offsets[j]:offsets[j + 1]]

    def microbatch(self, i: int) -> np.ndarray:
        """Return the sample ids (int64, a read-only zero-copy view) of micro-batch ``i``."""
        return self._list_item("sample_ids", i)

    def row_splits(self, i: int) -> np.ndarray | None:
        """Return the offsets of micro-batch ``i``'s packed rows into its sample ids (None without rows)."""
        return self._list_item("row_splits", i) if self.has_rows else None

    def value(self, name: str, i: int):
        """Return one scalar of column ``name`` for micro-batch ``i``."""
        k, j = self._locate(int(i))
        return self._view(k, name)[j]

    def record(self, i: int) -> tuple[list, int, int, list | None]:
        """Return (sample ids, batch_size, padded_size, row_splits or None) of micro-batch ``i``."""
        k, j = self._locate(int(i))
        offsets, values = self._view(k, "sample_ids")
        splits = None
        if self.has_rows:
            so, sv = self._view(k, "row_splits")
            splits = sv[so[j]:so[j + 1]].tolist()
        return (values[offsets[j]:offsets[j + 1]].tolist(), int(self._view(k, "batch_size")[j]),
                int(self._view(k, "padded_size")[j]), splits)

    def shape(self, i: int) -> tuple[int, int]:
        """Return ``(batch_size, padded_size)`` of micro-batch ``i``."""
        k, j = self._locate(int(i))
        return int(self._view(k, "batch_size")[j]), int(self._view(k, "padded_size")[j])

    # --- column access ----------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        """Return a whole per-micro-batch column (read and cached on first use)."""
        if name not in _SCALAR_COLUMNS:
            raise KeyError(f"{name!r} is not a scalar column of the index ({', '.join(_SCALAR_COLUMNS)})")
        col = self._columns.get(name)
        if col is None:
            parts = [self._view(k, name) for k in range(len(self._shards))]
            col = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            col.flags.writeable = False
            self._columns[name] = col
        return col

    def take(self, name: str, positions) -> np.ndarray:
        """Return column ``name`` at the given micro-batch positions, reading only those rows."""
        positions = np.asarray(positions, dtype=np.int64)
        if name in self._columns:
            return self._columns[name][positions]
        if positions.size == 0:
            return self._view(0, name)[:0].copy() if self._shards else np.zeros(0, dtype=np.int64)
        shard = np.searchsorted(self._starts, positions, side="right") - 1
        lo, hi = int(shard.min()), int(shard.max())
        if lo == hi:
            return self._view(lo, name)[positions - self._firsts[lo]]
        out = np.empty(positions.shape, dtype=self._view(lo, name).dtype)
        for k in np.unique(shard):
            sel = shard == k
            out[sel] = self._view(int(k), name)[positions[sel] - self._firsts[k]]
        return out

    def range_sum(self, name: str, start: int, stop: int) -> int:
        """Return the sum of column ``name`` over micro-batches ``[start, stop)``."""
        if not 0 <= start <= stop <= self.num_microbatches:
            raise IndexError(f"range [{start}, {stop}) outside [0, {self.num_microbatches}]")
        k = bisect.bisect_right(self._firsts, start) - 1
        if stop <= self._starts[k + 1]:  # one shard: the usual case
            first = self._firsts[k]
            part = self._view(k, name)[start - first:stop - first]
            # numpy's reduction has a fixed cost of ~1 us; short steps sum faster in Python
            return sum(part.tolist()) if len(part) <= 32 else int(part.sum())
        total = 0
        while start < stop:
            first = self._firsts[k]
            end = min(stop, int(self._starts[k + 1]))
            total += int(self._view(k, name)[start - first:end - first].sum())
            start, k = end, k + 1
        return total


# --- keyed permutation --------------------------------------------------------------
def _mix(z: int) -> int:
    # splitmix64 finaliser: a fixed, version-independent hash, so the shuffle of a given
    # (seed, epoch) is the same on every rank, machine and numpy release.
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix_vec(z: np.ndarray) -> np.ndarray:
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class KeyedPermutation:
    """A seeded bijection of ``[0, n)`` computed per element in O(1) (Feistel + cycle walking)."""

    ROUNDS = 4

    def __init__(self, n: int, seed: int, epoch: int):
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        bits += bits & 1
        self.half = bits // 2
        self.mask = (1 << self.half) - 1
        key = _mix(_mix(int(seed) & _M64) ^ (int(epoch) & _M64))
        self.keys = [_mix(key + r) for r in range(self.ROUNDS)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            left, right = right, left ^ (_mix(right ^ k) & self.mask)
        return (left << self.half) | right

    def __call__(self, x: int) -> int:
        """Return the image of ``x``."""
        if self.n <= 1:
            return x
        y = self._encrypt(x)
        while y >= self.n:  # cycle walking: the domain is < 4n, so ~2 rounds on average
            y = self._encrypt(y)
        return y

    def _encrypt_vec(self, x: np.ndarray) -> np.ndarray:
        half, mask = np.uint64(self.half), np.uint64(self.mask)
        left, right = x >> half, x & mask
        for k in self.keys:
            left, right = right, left ^ (_mix_vec(right ^ np.uint64(k)) & mask)
        return (left << half) | right

    def array(self, x) -> np.ndarray:
        """Return the images of an array of elements."""
        x = np.asarray(x, dtype=np.int64)
        if self.n <= 1:
            return x.copy()
        with np.errstate(over="ignore"):
            y = self._encrypt_vec(x.astype(np.uint64))
            bad = np.flatnonzero(y >= np.uint64(self.n))
            while bad.size:
                y[bad] = self._encrypt_vec(y[bad])
                bad = bad[y[bad] >= np.uint64(self.n)]
        return y.astype(np.int64)


# --- the epoch plan -------------------------------------------------------------------
class EpochPlan:
    """One epoch's flat sequence of micro-batches, cut into blocks of ``world * accum``.

    Block ``b`` of the packed order is micro-batches ``b*G .. b*G+G-1`` (modulo the count,
    which pads the tail from the start); the epoch visits blocks in its order. A sampler
    cuts this sequence into steps from any position, with any width.
    """

    def __init__(self, index: PackedIndex, world: int, accum: int, order: str = "index",
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
        self._last = (-1, -1)
        self._synth = np.zeros((0, g), dtype=np.int64)
        if order == "curriculum" or largest_first or warmup_shapes:
            self._materialise(order, largest_first, warmup_shapes)
        self.num_blocks = self.num_packed_blocks if self._order is None else len(self._order)
        self.length = self.num_blocks * g

    def _base_order(self, order: str) -> np.ndarray:
        s = self.num_packed_blocks
        if order == "index":
            return np.arange(s, dtype=np.int64)
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
        bs = self.index["batch_size"].astype(np.int64)
        ps = self.index["padded_size"].astype(np.int64)
        keys, codes = np.unique((ps << 31) | bs, return_inverse=True)
        d = len(keys)
        shape_ps, shape_bs = keys >> 31, keys & ((1 << 31) - 1)
        by_cost = np.lexsort((-shape_ps, -(shape_bs * shape_ps)))  # largest first
        # Which blocks show shape c to every rank: unique (block, shape, rank) triples,
        # then count ranks per (block, shape).
        s, w, g = self.num_packed_blocks, self.world, self.width
        flat = np.arange(s * g, dtype=np.int64)
        c = codes[flat % self.m].astype(np.int64)
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
        if synth:
            self._synth = np.stack(synth).astype(np.int64)
        rest = base[~np.isin(base, np.asarray(moved, dtype=np.int64))]
        return np.asarray(head, dtype=np.int64), rest

    def block(self, t: int) -> int:
        """Return the packed block (negative: a synthetic warm-up block) visited t-th."""
        if self._order is not None:
            return int(self._order[t])
        if self._perm is None:
            return t
        # the sampler asks for the same block for the step's ids and for its LR
        if t != self._last[0]:
            self._last = (t, self._perm(t))
        return self._last[1]

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

    def span_sum(self, name: str, start: int, count: int) -> int:
        """Return the sum of column ``name`` over flat positions ``[start, start+count)`` (mod length)."""
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


# --- learning-rate scaling --------------------------------------------------------------
def lr_scale(step_batch: float, ref_batch_size: float, method: str = "linear") -> float:
    """Return the LR multiplier for a step of ``step_batch``: k, sqrt(k) or 1 with k = batch/ref."""
    if method not in LR_METHODS:
        raise ValueError(f"method must be one of {', '.join(LR_METHODS)}, not {method!r}")
    if ref_batch_size <= 0:
        raise ValueError("ref_batch_size must be positive")
    k = float(step_batch) / float(ref_batch_size)
    return k if method == "linear" else math.sqrt(k) if method == "sqrt" else 1.0


class MicroBatch(list):
    """The sample ids of one micro-batch (a list) with its shape, as a sampler yields it."""

    def __init__(self, ids, microbatch: int = -1, batch_size: int | None = None,
                 padded_size: int | None = None, row_splits=None, epoch: int = 0, position: int = 0):
        super().__init__(ids)
        self.microbatch = microbatch
        self.batch_size = len(self) if batch_size is None else batch_size
        self.padded_size = padded_size
        self.row_splits = row_splits
        self.epoch = epoch
        self.position = position


class Samples(list):
    """Dataset items of one micro-batch (a list) and the ``MicroBatch`` they came from, for collate."""

    def __init__(self, items, microbatch: MicroBatch | None = None):
        super().__init__(items)
        self.microbatch = microbatch


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


class PackedSampler:
    """One rank's view of an index: steps of ``world_size * grad_accum`` micro-batches.

    Iterating yields ``MicroBatch`` lists of sample ids, ``grad_accum`` per step; every
    rank gets the same number of steps. The state (epoch, position, ...) resumes exactly,
    at the same or another world size. Framework-free; see ``sortpack.torch``.
    """

    STATE_VERSION = 1

    def __init__(self, index, rank: int = 0, world_size: int = 1, grad_accum: int = 1,
                 order: str = "index", seed: int = 0, drop_last: bool = False,
                 largest_first: bool = False, warmup_shapes: bool = False):
        self.index = index if isinstance(index, PackedIndex) else PackedIndex(index)
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
        if not (isinstance(world_size, int) and world_size >= 1):
            raise ValueError(f"world_size must be a positive integer, not {world_size!r}")
        if not (isinstance(rank, int) and 0 <= rank < world_size):
            raise ValueError(f"rank must be in [0, {world_size}), not {rank!r}")
        self.rank, self.world_size = rank, world_size
        self.order, self.seed, self.drop_last = order, int(seed), bool(drop_last)
        self.largest_first, self.warmup_shapes = bool(largest_first), bool(warmup_shapes)
        self.grad_accum = self._checked_accum(grad_accum)
        self.epoch = 0
        self._layout = (world_size, self.grad_accum)  # (W, A) that laid out this epoch
        self._position = 0      # flat position after the steps completed (``step()``)
        self._issued = 0        # flat position after the steps handed out
        self._track = False
        self._generation = 0
        self._plan_cache: tuple | None = None
        self._listeners: list = []

    # --- configuration ---------------------------------------------------------------
    def _checked_accum(self, a) -> int:
        if not (isinstance(a, (int, np.integer)) and a >= 1):
            raise ValueError(f"grad_accum must be a positive integer, not {a!r}")
        check_group_alignment(self.index.options, self.world_size * int(a))
        return int(a)

    @property
    def width(self) -> int:
        """Return the micro-batches per step over all ranks (world_size * grad_accum)."""
        return self.world_size * self.grad_accum

    @property
    def track_steps(self) -> bool:
        """Return whether ``step()`` calls, not hand-outs, move the position (the LR wrapper turns it on)."""
        return self._track

    @track_steps.setter
    def track_steps(self, on: bool) -> None:
        """Switch between following ``step()`` calls and following hand-outs, from the current position."""
        if on and not self._track:
            self._position = self._issued
        elif not on and self._track:
            self._issued = self._position
        self._track = bool(on)

    @property
    def position(self) -> int:
        """Return the epoch's flat micro-batch position where the next step starts."""
        return self._position if self._track else self._issued

    def plan(self) -> EpochPlan:
        """Return the current epoch's plan (built once per epoch)."""
        key = (self.epoch, self._layout, self.order, self.seed, self.drop_last,
               self.largest_first, self.warmup_shapes)
        if self._plan_cache is None or self._plan_cache[0] != key:
            w, a = self._layout
            plan = EpochPlan(self.index, w, a, self.order, self.seed, self.epoch, self.drop_last,
                             self.largest_first, self.warmup_shapes)
            self._plan_cache = (key, plan)
        return self._plan_cache[1]

    def _steps_from(self, position: int) -> int:
        left = self.plan().length - position
        if left <= 0:
            return 0
        return left // self.width if self.drop_last else -(-left // self.width)

    @property
    def num_steps(self) -> int:
        """Return the steps left in this epoch from ``position``."""
        return self._steps_from(self.position)

    @property
    def steps_per_epoch(self) -> int:
        """Return the steps of a whole epoch at the current world size and accumulation."""
        w, a = self.world_size, self.grad_accum
        plan = EpochPlan(self.index, w, a, self.order, self.seed, self.epoch, self.drop_last,
                         self.largest_first, self.warmup_shapes) if (w, a) != self._layout else self.plan()
        return plan.num_blocks

    def __len__(self) -> int:
        """Return the micro-batches this rank yields from ``position`` to the end of the epoch."""
        return self.num_steps * self.grad_accum

    def _notify(self) -> None:
        alive = []
        for ref in self._listeners:
            fn = ref()
            if fn is not None:
                fn()
                alive.append(ref)
        self._listeners = alive

    def add_listener(self, method) -> None:
        """Call the bound ``method`` whenever the position or plan changes other than by a step."""
        self._listeners.append(weakref.WeakMethod(method))

    def _start_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._layout = (self.world_size, self.grad_accum)
        self._position = self._issued = 0
        self._generation += 1
        self._notify()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning; a no-op for the current epoch (a resume keeps its place)."""
        if int(epoch) != self.epoch:
            self._start_epoch(epoch)

    def set_grad_accum(self, grad_accum: int) -> None:
        """Change the accumulation between steps; the epoch continues from the same position."""
        self.grad_accum = self._checked_accum(grad_accum)
        self._notify()

    # --- stepping ---------------------------------------------------------------------
    def step(self) -> None:
        """Record one completed optimizer step (so the state ignores DataLoader prefetch).

        Turns on ``track_steps`` (counting from where the current pass started); the step
        that ends the epoch moves the state to the next epoch.
        """
        self._track = True
        self._position += self.width
        if self._steps_from(self._position) == 0:
            self._start_epoch(self.epoch + 1)

    def step_microbatches(self, position: int | None = None) -> np.ndarray:
        """Return the micro-batch numbers of every rank in the step at ``position``, as (A, W)."""
        pos = self.position if position is None else position
        flat = (pos + np.arange(self.width, dtype=np.int64)) % max(self.plan().length, 1)
        return self.plan().packed_array(flat).reshape(self.grad_accum, self.world_size)

    def step_batch(self, by: str = "samples", position: int | None = None) -> int:
        """Return the samples (or tokens, ``by="tokens"``) of the step at ``position`` over all ranks."""
        if by not in ("samples", "tokens"):
            raise ValueError(f"by must be 'samples' or 'tokens', not {by!r}")
        pos = self.position if position is None else position
        plan = self.plan()
        if plan.length == 0:
            return 0
        return plan.span_sum("num_samples" if by == "samples" else "tokens", pos % plan.length, self.width)

    def lr_scale(self, ref_batch_size: float, method: str = "linear", by: str = "samples",
                 position: int | None = None) -> float:
        """Return the LR multiplier of the step at ``position`` (identical on every rank)."""
        return lr_scale(self.step_batch(by, position), ref_batch_size, method)

    def schedule(self) -> np.ndarray:
        """Return this rank's micro-batch numbers for the rest of the epoch, shaped (steps, A)."""
        n, plan = self.num_steps, self.plan()
        offs = np.arange(self.grad_accum, dtype=np.int64) * self.world_size + self.rank
        flat = self.position + np.arange(n, dtype=np.int64)[:, None] * self.width + offs[None, :]
        return plan.packed_array(flat % max(plan.length, 1)).reshape(n, self.grad_accum)

    def step_batches(self, by: str = "samples") -> np.ndarray:
        """Return the step batch (samples or tokens over all ranks) of every step left in the epoch."""
        n, plan = self.num_steps, self.plan()
        flat = self.position + np.arange(n * self.width, dtype=np.int64)
        col = "num_samples" if by == "samples" else "tokens"
        values = self.index.take(col, plan.packed_array(flat % max(plan.length, 1)))
        return values.reshape(n, self.width).sum(axis=1).astype(np.int64)

    # --- iteration ----------------------------------------------------------------------
    def __iter__(self):
        """Yield this rank's micro-batches (``MicroBatch``) from ``position`` to the end of the epoch."""
        if self.num_steps == 0 and self.position > 0:
            self._start_epoch(self.epoch + 1)
        return self._iterate(self._generation, self.position)

    def _iterate(self, generation: int, pos: int):
        while generation == self._generation and self._steps_from(pos) > 0:
            plan, w, a, epoch = self.plan(), self.world_size, self.grad_accum, self.epoch
            length = plan.length
            packed = [plan.packed((pos + k * w + self.rank) % length) for k in range(a)]
            step_start, pos = pos, pos + w * a
            last = False
            if not self.track_steps:
                # without recorded steps the state follows what was handed out; handing out
                # an epoch's last step moves the state to the next epoch
                self._issued = pos
                if self._steps_from(pos) == 0:
                    self._start_epoch(epoch + 1)
                    generation, last = self._generation, True
            for p in packed:
                ids, bs, ps, splits = self.index.record(p)
                yield MicroBatch(ids, p, bs, ps, splits, epoch, step_start)
                if generation != self._generation:
                    return
            if last:
                return

    # --- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Return the resume state: epoch, flat position, order, seed, W, A and the epoch layout."""
        return {
            "version": self.STATE_VERSION, "epoch": self.epoch, "position": int(self.position),
            "seed": self.seed, "order": self.order, "drop_last": self.drop_last,
            "largest_first": self.largest_first, "warmup_shapes": self.warmup_shapes,
            "world_size": self.world_size, "grad_accum": self.grad_accum,
            "layout": list(self._layout), "num_microbatches": self.index.num_microbatches,
            "content_hash": self.index.content_hash,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; W and rank stay this job's, A and the order come from the state."""
        if state.get("version") != self.STATE_VERSION:
            raise ValueError(f"unknown sampler state version {state.get('version')!r}")
        if (state["num_microbatches"] != self.index.num_microbatches
                or state.get("content_hash", "") != self.index.content_hash):
            raise ValueError("the sampler state belongs to another index (content hash differs)")
        self.order, self.seed = state["order"], int(state["seed"])
        self.drop_last = bool(state["drop_last"])
        self.largest_first, self.warmup_shapes = bool(state["largest_first"]), bool(state["warmup_shapes"])
        self.grad_accum = self._checked_accum(int(state["grad_accum"]))
        self.epoch = int(state["epoch"])
        self._layout = tuple(int(v) for v in state["layout"])
        self._position = self._issued = int(state["position"])
        self._generation += 1
        self._notify()
