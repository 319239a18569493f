"""What ``plan_batch`` returns (``BatchPlan``): each rank's micro-batches, their layouts for the collates, the stats."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SortpackError


@dataclass(frozen=True)
class BatchPlan:
    """One batch planned for ``world_size`` ranks: micro-batches of sequence indices, rank after rank.

    ``rank(r)`` gives rank r's micro-batches in the order to train them (costliest first), each an
    int64 array of indices into the planned ``lengths`` (ascending); ``layout(r)`` the
    ``cu_seqlens`` and shapes of each, as ``varlen_collate`` lays a micro-batch out;
    ``microbatches(r)`` the reader's ``MicroBatch`` records, which the collates and ``step_loss``
    read; ``stats`` the plan's figures (``docs/plan-batch.md``).
    """

    world_size: int
    indices: np.ndarray  # every sequence once: micro-batch after micro-batch, rank after rank
    offsets: np.ndarray  # micro-batch j holds indices[offsets[j]:offsets[j + 1]]
    firsts: np.ndarray  # rank r holds micro-batches firsts[r]:firsts[r + 1]
    lengths: np.ndarray  # the planned lengths (int64)
    pad_to_multiple: int = 0
    targets: np.ndarray | None = None  # loss targets per sequence, when given
    size2: np.ndarray | None = None  # the second cap's values per sequence, when given
    stats: dict = field(default_factory=dict)

    @property
    def num_microbatches(self) -> int:
        """Return the micro-batches over all ranks."""
        return len(self.offsets) - 1

    def counts(self) -> list[int]:
        """Return each rank's number of micro-batches."""
        return np.diff(self.firsts).tolist()

    def _check_rank(self, r: int) -> range:
        if not 0 <= r < self.world_size:
            raise IndexError(f"rank {r} out of range for world_size={self.world_size}")
        return range(int(self.firsts[r]), int(self.firsts[r + 1]))

    def rank(self, r: int) -> list[np.ndarray]:
        """Return rank ``r``'s micro-batches in order, each an int64 array of indices into ``lengths``."""
        return [self.indices[self.offsets[j]:self.offsets[j + 1]] for j in self._check_rank(r)]

    def layout(self, r: int) -> list[dict]:
        """Return, per micro-batch of rank ``r``, what a varlen kernel needs, keyed as ``varlen_collate`` keys them.

        ``cu_seqlens`` (int32: the real tokens' bounds), ``max_seqlen``, ``lengths``, ``tokens``,
        ``num_samples``, ``padded_size`` (the micro-batch's length laid out: its documents each
        padded to ``pad_to_multiple``) and, with ``pad_to_multiple``, ``cu_seqlens_padded`` (the
        padded documents' bounds, Transformer Engine's THD layout). A micro-batch past 2^31 - 1 tokens
        (``oversize="alone"``, or a ``max_tokens`` of 2^31 or more) is refused: int32 cannot bound it.
        """
        out = []
        k = self.pad_to_multiple
        for i, ids in enumerate(self.rank(r)):
            lengths = self.lengths[ids]
            cu = np.concatenate(([0], np.cumsum(lengths)))  # int64 until checked: a cast first would wrap
            bounds = np.concatenate(([0], np.cumsum(-(-lengths // k) * k))) if k > 1 else cu
            if bounds[-1] > np.iinfo(np.int32).max:
                # flash-attention and Transformer Engine take int32 cu_seqlens: no layout of this micro-batch works
                raise SortpackError(f"BatchPlan.layout: rank {r}'s micro-batch {i} holds "
                                    f"{int(bounds[-1])} tokens{' padded' if k > 1 else ''}, past int32 cu_seqlens' "
                                    f"2147483647: keep max_tokens (and every sequence) under 2^31")
            one = {"cu_seqlens": cu.astype(np.int32), "max_seqlen": int(lengths.max(initial=0)), "lengths": lengths,
                   "tokens": int(cu[-1]), "num_samples": len(ids), "padded_size": int(bounds[-1])}
            if k > 1:
                one["cu_seqlens_padded"] = bounds.astype(np.int32)
            out.append(one)
        return out

    def microbatches(self, r: int) -> list:
        """Return rank ``r``'s micro-batches as the reader's ``MicroBatch`` records of this one step.

        Each carries its ids, tokens, attention (sum of s^2), loss targets (the given ``targets``,
        else every token but each sequence's first) and the step's facts over all ranks
        (``step_tokens``, ``step_targets``, ``world_size``): ``pad_collate``/``varlen_collate``
        collate ``Samples(items, mb)`` and ``step_loss`` divides by the step's targets.
        """
        from ..reader.microbatch import MicroBatch, StepFacts

        s = self.stats
        facts = StepFacts(step_batch=int(s["samples"]), step_tokens=int(s["tokens"]), world_size=self.world_size,
                          step_attention=int(s["attention"]), step_targets=int(s["targets"]))
        out = []
        span = self._check_rank(r)
        for j, ids in zip(span, self.rank(r)):
            lengths = self.lengths[ids]
            tokens = int(lengths.sum())
            targets = int(self.targets[ids].sum()) if self.targets is not None else \
                tokens - int(np.count_nonzero(lengths))  # every token but each sequence's first, none of an empty one
            out.append(MicroBatch(ids.tolist(), j, facts=facts, last=j == span[-1], tokens=tokens,
                                  attention=int((lengths * lengths).sum()), targets=targets,
                                  size2=None if self.size2 is None else int(self.size2[ids].sum())))
        return out
