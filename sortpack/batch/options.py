"""The options of one in-memory plan (``BatchOptions``), checked before any work, each error naming its keyword."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..errors import SortpackError

# plan_batch's balance= -> the pack stage's --balance mode that weighs a sequence so (stages/pack/balance.py's
# table: compute C*s + s^2, targets its loss targets, which also compose the rows); "tokens" weighs its tokens, a
# weight the stage's table has no mode for (its "none" weighs nothing)
BALANCE = {"tokens": "none", "compute": "compute", "targets": "targets"}
OVERSIZE = ("error", "alone")
DEFAULT_COST_COEFF = 6144.0  # C of C*s + s^2 when the caller gives none (d_model 1024; docs/step-costs.md)


@dataclass(frozen=True)
class BatchOptions:
    """How ``plan_batch`` packs and deals one batch (read-only; ``check`` refuses what makes no sense)."""

    world_size: int
    max_tokens: int
    cost_coeff: float | None = None
    balance_by: str | None = None  # plan_batch's balance=; None: "compute" when cost_coeff is given, else "tokens"
    pad_to_multiple: int = 0
    equal_counts: bool = True
    count_multiple: int = 1
    min_microbatches: int = 0
    max_samples: int = 0
    oversize: str = "error"

    @property
    def balanced(self) -> str:
        """Return what the deal balances: ``balance=``, or ``compute`` with a ``cost_coeff``, else ``tokens``."""
        if self.balance_by is not None:
            return self.balance_by
        return "compute" if self.cost_coeff is not None else "tokens"

    @property
    def stage_mode(self) -> str:
        """Return the pack stage's ``--balance`` mode that weighs sequences as ``balanced`` says (``BALANCE``)."""
        return BALANCE[self.balanced]

    @property
    def coeff(self) -> float:
        """Return C of the compute cost ``C*s + s^2`` (the caller's, else the default the stats report with)."""
        return DEFAULT_COST_COEFF if self.cost_coeff is None else float(self.cost_coeff)

    @property
    def per_rank_multiple(self) -> int:
        """Return the multiple every rank's count of micro-batches must be (1 without equal counts)."""
        return self.count_multiple if self.equal_counts else 1

    def check(self) -> None:
        """Raise SortpackError (one line, naming the keyword) for the first option out of range."""
        self._check_counts()
        c = self.cost_coeff
        if c is not None and (isinstance(c, bool) or not isinstance(c, numbers.Real) or not math.isfinite(c) or c < 0):
            raise SortpackError(f"plan_batch: cost_coeff={c!r}: expected a finite number >= 0")
        if self.balance_by is not None and not (isinstance(self.balance_by, str) and self.balance_by in BALANCE):
            raise SortpackError(f"plan_batch: balance={self.balance_by!r}: expected one of {', '.join(BALANCE)}")
        if not (isinstance(self.oversize, str) and self.oversize in OVERSIZE):
            raise SortpackError(f"plan_batch: oversize={self.oversize!r}: expected 'error' (refuse a sequence over "
                                f"the cap) or 'alone' (a micro-batch of its own)")
        self._check_together()

    def _check_together(self) -> None:
        """Raise SortpackError for two options that do not go together."""
        k = self.pad_to_multiple
        if k > 1 and self.max_tokens < k:
            raise SortpackError(f"plan_batch: pad_to_multiple={k} is more than max_tokens={self.max_tokens}")
        if self.min_microbatches and not self.equal_counts:
            raise SortpackError("plan_batch: min_microbatches counts every rank's micro-batches: it needs "
                                "equal_counts=True")

    def _check_counts(self) -> None:
        """Raise SortpackError for the first integer option that is not an integer in its range."""
        for name, value, least in (("world_size", self.world_size, 1), ("max_tokens", self.max_tokens, 1),
                                   ("count_multiple", self.count_multiple, 1),
                                   ("pad_to_multiple", self.pad_to_multiple, 0),
                                   ("min_microbatches", self.min_microbatches, 0),
                                   ("max_samples", self.max_samples, 0)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise SortpackError(f"plan_batch: {name}={value!r}: expected an integer >= {least}")
