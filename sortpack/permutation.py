"""The keyed permutation: a seeded bijection of ``[0, n)`` evaluated per element, same on every machine."""
from __future__ import annotations

import numpy as np

_M64 = (1 << 64) - 1


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
    """A seeded bijection of ``[0, n)`` computed per element in O(1) (Feistel + cycle walking).

    The shuffle of a plan's steps: the same ``(n, seed, epoch)`` gives the same order on every
    rank and in every process, without storing it.

    Examples
    --------
    >>> from sortpack.reader import KeyedPermutation
    >>> order = KeyedPermutation(10, seed=0, epoch=0)
    >>> [order(i) for i in range(10)]
    [7, 2, 5, 4, 0, 8, 3, 9, 1, 6]
    >>> order.array([0, 1, 2]).tolist(), sorted(order.array(range(10)).tolist()) == list(range(10))
    ([7, 2, 5], True)
    """

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


SEED_LIMIT = 1 << 64  # seeds are 64-bit keys: a larger one would alias a smaller one


def check_seed(seed, flag: str, error: type[Exception] = ValueError) -> int:
    """Return ``seed`` as an int, or raise ``error`` (one line naming ``flag``) unless 0 <= seed < 2^64.

    One rule for every seed a user gives (``run --seed``, ``--holdout-seed``, ``inspect --seed``,
    MIX.json's ``seed``): a negative seed or one of 2^64 or more would be the same key as another
    (the keys are taken modulo 2^64), so two spellings would name one order. Callers pass
    ``SortpackError`` (this module stands alone).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise error(f"{flag} {seed!r}: must be an integer")
    if seed < 0:
        raise error(f"{flag} {seed}: must be >= 0")
    if seed >= SEED_LIMIT:
        raise error(f"{flag} {seed}: must be below 2^64 ({SEED_LIMIT})")
    return int(seed)
