"""The loss targets of fine-tuning samples cut by ``--oversize split`` (or ``truncate``): each piece counts its own,
exactly, from the labels (``TargetPieces``), where ``split_samples`` would give it a share in proportion."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .samples import SampleColumns, exact_sum


class TargetPieces:
    """The loss targets of each piece of fine-tuning samples under ``run --oversize split`` (or of the part
    ``--oversize truncate`` keeps), counted exactly.

    A piece is a document of its own: its first position has no target, and a piece of prompt
    only trains nothing. The labels are in memory only while analyze reads them, so ``analyze``
    hands each read's labels to ``keep_labels`` (then calls the object as its ``keep_pieces``,
    which counts the rows) and ``exact`` later puts each piece's own count in place of the
    share ``split_samples`` gives it. Pieces hold ``cap`` tokens each but the last, as
    ``piece_table`` cuts them.
    """

    def __init__(self, cap: int):
        self.cap = int(cap)
        self.seen = 0  # samples measured so far on this rank
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (local position, begin, targets)

    def keep_labels(self, labels, size: np.ndarray) -> None:
        """Count the targets of the pieces of this read's samples over ``cap`` (before ``__call__`` of the read)."""
        size = np.asarray(size, dtype=np.int64)
        over = np.flatnonzero(size > self.cap)
        if len(over):
            self._keep(labels.take(over), size[over], self.seen + over)

    def _keep(self, labels, lengths: np.ndarray, positions: np.ndarray) -> None:
        """Count the targets of the pieces of samples over ``cap`` (their ``labels``, at ``positions``)."""
        from .. import arrow_compute as ac
        from ..inputs.finetune import IGNORE_INDEX

        flags = ac.list_flatten(labels).to_numpy(zero_copy_only=False) != IGNORE_INDEX
        cum = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
        count = -(-lengths // self.cap)
        first = np.repeat(np.cumsum(lengths) - lengths, count)  # each piece's sample's first label
        ordinal = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        begin = ordinal * self.cap
        end = np.minimum(begin + self.cap, np.repeat(lengths, count))
        targets = cum[first + end] - cum[first + np.minimum(begin + 1, end)]
        self.parts.append((np.repeat(positions, count), begin, targets))

    @classmethod
    def read_back(cls, samples: SampleColumns, shape, cap: int, by_id: bool) -> tuple[TargetPieces, np.ndarray]:
        """Return (the pieces of ``samples`` over ``cap``, their labels read back from the input files and encoded
        again with ``shape``; the sample ids in ascending order).

        ``pack`` of a sorted directory: the labels are not in memory. Positions count in the
        ascending ids (``by_id``: for ``exact`` with those ids) or in ``samples``' own order
        (for ``truncated``).
        """
        from ..inputs.finetune import read_labels

        order = np.argsort(samples.sample_id, kind="stable")
        ids = samples.sample_id[order]
        size = np.asarray(samples.size, dtype=np.int64)[order]
        pieces = cls(cap)
        over = np.flatnonzero(size > cap)
        if len(over):
            labels = read_labels(shape, samples.files, ids[over], size[over])
            pieces._keep(labels, size[over], over if by_id else order[over])
        pieces.seen = len(ids)
        return pieces, ids

    def __call__(self, table, size: np.ndarray, where: str) -> None:
        """Count this read's samples (``analyze``'s ``keep_pieces``)."""
        self.seen += len(size)

    def exact(self, before: np.ndarray, samples: SampleColumns) -> SampleColumns:
        """Return ``samples`` (pieces of the samples whose ids are ``before``) with every piece's own targets."""
        if not self.parts or samples.begin is None or "targets" not in samples.measures:
            return samples
        pos, begin, targets = (np.concatenate(x) for x in zip(*self.parts))
        key = (pos << 32) | (begin // self.cap)  # (local position, piece ordinal), ascending as kept
        want = (np.searchsorted(before, samples.sample_id).astype(np.int64) << 32) | (samples.begin // self.cap)
        at = np.clip(np.searchsorted(key, want), 0, len(key) - 1)
        found = key[at] == want  # pieces of a cut sample (the others keep their own count)
        exact = samples.measures["targets"].copy()
        exact[found] = targets[at[found]]
        return replace(samples, measures={**samples.measures, "targets": exact})

    def truncated(self, samples: SampleColumns) -> tuple[SampleColumns, int]:
        """Return ``samples`` (as analyze measured them) with each oversize sample's targets those of its first
        ``cap`` tokens (``--oversize truncate`` keeps them), and the targets cut away on this rank."""
        if not self.parts or "targets" not in samples.measures:
            return samples, 0
        pos, begin, targets = (np.concatenate(x) for x in zip(*self.parts))
        first = begin == 0
        kept = samples.measures["targets"].copy()
        lost = exact_sum(kept[pos[first]] - targets[first])
        kept[pos[first]] = targets[first]
        return replace(samples, measures={**samples.measures, "targets": kept}), lost
