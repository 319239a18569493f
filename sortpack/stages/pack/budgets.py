"""The ``--budget`` registry: what a micro-batch costs, one class per budget.

A ``Budget`` is everything the package knows of a budget: its name and ``--help`` line, the
kernel cost the greedy packs it with (a name of ``kernels.budget.COSTS`` or a ``KernelCost``:
per padded slot or per sample, linear or quadratic: the one table the numpy and C kernels
read), whether its micro-batches train padded, the options it needs, a sample's cost alone,
the longest sample that fits alone, why a sample does not, and how a same-shape group packs.
``PackOptions.validate``, the oversize filters (``fits``), the greedy (``cut.piece_bounds``),
``--static-shapes`` and the CLI's ``--budget`` choices ask this table. Adding a budget is
adding its class to ``BUDGETS``.

Importing this module loads neither numpy nor pyarrow (``--help`` lists the budgets); the
costs import them when they run.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, Protocol

from ...errors import SortpackError

if TYPE_CHECKING:
    import numpy as np

    from ...kernels.budget import KernelCost


class BudgetOptions(Protocol):
    """What a budget reads of the pack options (``PackOptions`` is one)."""

    @property
    def budget(self) -> str:
        """Return ``--budget``, the budget's name."""

    @property
    def limit(self) -> int:
        """Return ``--max-tokens``."""

    @property
    def scale(self) -> float:
        """Return ``Q`` of a quadratic cost (1.0 when unset)."""

    @property
    def quadratic_scale(self) -> float | None:
        """Return ``--quadratic-scale`` as given."""

    @property
    def rounding(self) -> bool:
        """Return whether padded lengths are rounded to a fixed set."""


class Budget:
    """``--budget padded``: a micro-batch of ``c`` samples whose longest is ``L`` costs ``c*L`` (fairseq's rule).

    The base class of the budgets: each answers for one set of pack options.
    """

    name: ClassVar[str] = "padded"
    help: ClassVar[str] = "count*max_size"  # its ``--budget`` help, after ``NAME:``
    kernel: ClassVar[str | KernelCost] = "padded"  # the kernel cost that packs it (``kernels.budget.COSTS``)
    pads: ClassVar[bool] = True  # its micro-batches train as padded tensors (else varlen: ``cu_seqlens``)

    def __init__(self, opts: BudgetOptions):
        self.opts = opts

    def check(self) -> None:
        """Raise SortpackError for options this budget cannot use (one line)."""

    def cost_is_size(self) -> bool:
        """Return whether a sample's cost alone is its size (no rounding): oversize is then a size above the limit."""
        return not self.opts.rounding

    def cost_alone(self, lengths: np.ndarray) -> np.ndarray:
        """Return each (padded) length's cost alone in a micro-batch (never less for a longer one: the largest
        sample decides whether any is oversize, as ``longest_alone`` says)."""
        from ... import kernels

        return kernels.sample_cost(lengths, self.kernel, self.opts.scale)

    def longest_alone(self) -> int:
        """Return the longest sample (before rounding) whose cost alone fits the limit."""
        return self.opts.limit

    def over_reason(self, largest: int) -> str | None:
        """Return why a sample of size ``largest`` costs more than the limit when its size does not (None: it does)."""
        return None

    def same_shape(self, sizes: np.ndarray, shapes: np.ndarray | None) -> tuple[str | KernelCost, np.ndarray | None]:
        """Return (the kernel cost, the rounding lengths) a same-shape group of unrounded samples packs with."""
        return self.kernel, shapes


class TokensBudget(Budget):
    """``--budget tokens``: a micro-batch costs the sum of its sizes (``c*L`` when lengths are rounded)."""

    name: ClassVar[str] = "tokens"
    help: ClassVar[str] = "sum of sizes"
    kernel: ClassVar[str | KernelCost] = "tokens"
    pads: ClassVar[bool] = False

    def same_shape(self, sizes: np.ndarray, shapes: np.ndarray | None) -> tuple[str | KernelCost, np.ndarray | None]:
        """Return the padded rule: a same-shape group pads every sample to one length, so each costs that length."""
        return "padded", shapes


class QuadraticBudget(Budget):
    """``--budget quadratic``: a micro-batch costs ``sum(s + s*s/Q)`` (``c*(L + L*L/Q)`` rounded), lhotse's rule."""

    name: ClassVar[str] = "quadratic"
    help: ClassVar[str] = "sum of size+size^2/Q"
    kernel: ClassVar[str | KernelCost] = "quadratic"
    pads: ClassVar[bool] = False

    def check(self) -> None:
        """Refuse the quadratic budget without its scale."""
        if not (self.opts.quadratic_scale and self.opts.quadratic_scale > 0):
            raise SortpackError("--budget quadratic needs --quadratic-scale Q > 0 (cost = size + size^2/Q)")

    def cost_is_size(self) -> bool:
        """Return False: a sample's cost alone is ``s + s*s/Q``, above its size."""
        return False

    def longest_alone(self) -> int:
        """Return the longest ``s`` with ``s + s*s/Q`` within the limit."""
        b, q = self.opts.limit, self.opts.scale
        cap = int(math.floor(q * (math.sqrt(1.0 + 4.0 * b / q) - 1.0) / 2.0)) + 2
        while cap > 0 and cap + cap * cap / q > b:
            cap -= 1
        return cap

    def over_reason(self, largest: int) -> str | None:
        """Return the quadratic cost that puts a sample within the limit by size over it, naming both options."""
        b, q = self.opts.limit, self.opts.scale
        if largest > b:
            return None
        return (f"cost more than --max-tokens {b} alone under --budget quadratic with --quadratic-scale {q:g} "
                f"(largest size {largest}, cost {largest + largest * largest / q:.4g}); raise --quadratic-scale "
                f"or --max-tokens")

    def same_shape(self, sizes: np.ndarray, shapes: np.ndarray | None) -> tuple[str | KernelCost, np.ndarray | None]:
        """Return the quadratic rule over each sample rounded to itself: every sample costs as the group's length."""
        import numpy as np

        return self.kernel, np.unique(sizes)


# --budget NAME -> the budget (``PackOptions.budget``); a new budget is one class here
BUDGETS: dict[str, type[Budget]] = {cls.name: cls for cls in (Budget, TokensBudget, QuadraticBudget)}


def budget_of(opts: BudgetOptions) -> Budget:
    """Return the ``Budget`` of ``opts`` (SortpackError, one line: an unknown ``--budget``)."""
    cls = BUDGETS.get(opts.budget)
    if cls is None:
        raise SortpackError(f"--budget {opts.budget!r}: expected {', '.join(BUDGETS)}")
    return cls(opts)


def budget_help() -> str:
    """Return the ``--budget`` help: each budget's name and cost."""
    return "; ".join(f"{name}: {cls.help}" for name, cls in BUDGETS.items()) + "."
