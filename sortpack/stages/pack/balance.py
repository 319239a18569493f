"""The ``--balance`` registry: how packed micro-batches are ordered so that a step costs alike on every rank.

A ``Balance`` is everything the package knows of a mode: its name and ``--help`` line, the
per-sample weight whose sum is a micro-batch's cost, the order it lays the micro-batches in
(``order.circle_order``: by cost, as a circle), whether row packing composes the rows by that
weight (``composes_rows``), the options it refuses, and what the manifest records of it.
``PackOptions.validate``, the packing (``cut.pack_rows``, ``microbatches.pack_samples``), a
mixture's check and the CLI's ``--balance`` choices ask this table; nothing outside it
compares a mode's name. Adding a mode is adding its class to ``BALANCE``.

Importing this module loads neither numpy nor pyarrow (``--help`` lists the modes); the orders
import them when they run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from ...errors import SortpackError

if TYPE_CHECKING:
    import numpy as np

    from ...parallel import Comm
    from .packed import Packed


class BalanceOptions(Protocol):
    """What a balance mode reads of the pack options (``PackOptions`` is one)."""

    @property
    def balance(self) -> str:
        """Return ``--balance``, the mode's name."""

    @property
    def cost_coeff(self) -> float:
        """Return ``--cost-coeff C``."""

    @property
    def rows(self) -> int:
        """Return ``--rows``, the row length (0: off)."""

    @property
    def same_shape(self) -> bool:
        """Return ``--same-shape``."""

    @property
    def max_size2(self) -> int:
        """Return ``--max-size2`` (0: no second cap)."""

    @property
    def limit(self) -> int:
        """Return ``--max-tokens``."""

    @property
    def padded_layout(self) -> bool:
        """Return whether micro-batches train as padded tensors."""


class Balance:
    """``--balance none``: the micro-batches in packed order (two caps under ``--budget tokens``: by both fills)."""

    name: ClassVar[str] = "none"
    help: ClassVar[str] = ""  # its ``--balance`` help, after ``NAME:`` ("": none)
    # --rows: each window's rows composed so that their weights come near the mean (``compose``: integer weights)
    composes_rows: ClassVar[bool] = False

    def __init__(self, opts: BalanceOptions):
        self.opts = opts

    @property
    def orders(self) -> bool:
        """Return whether the mode reorders the micro-batches by their cost: it says a sample's weight or a
        micro-batch's cost (``none`` says neither)."""
        return type(self).weight is not Balance.weight or type(self).cost is not Balance.cost

    def check(self) -> None:
        """Raise SortpackError for options this mode cannot work with (one line)."""
        if self.orders and self.opts.same_shape:
            raise SortpackError(f"--balance {self.name} and --same-shape exclude each other (a same-shape group "
                                "is G consecutive micro-batches; balance reorders them)")

    def record(self) -> dict[str, object]:
        """Return what a manifest's options record of the mode (nothing for ``none``: plans keep their hash)."""
        return {"balance": self.name} if self.orders else {}

    def weight(self, sizes: np.ndarray, measures: dict[str, np.ndarray]) -> np.ndarray:
        """Return each sample's weight (sizes and measures in packed order): a micro-batch costs their sum.

        A mode that defines it orders the micro-batches (``orders``); int64 where it composes rows.
        """
        raise NotImplementedError("--balance none weighs nothing")

    def cost(self, packed: Packed) -> np.ndarray:
        """Return each micro-batch's cost: the sum of its samples' weights."""
        import numpy as np

        from .packed import segment_reduce

        assert packed.sizes is not None
        return segment_reduce(np.add, self.weight(packed.sizes, packed.measures), packed.batches.offsets)

    def arrange(self, comm: Comm, packed: Packed, two_caps: bool) -> Packed:
        """Return this rank's part of the micro-batches in the mode's order (collective).

        A mode that weighs lays them out as a circle of their costs (``order.circle_order``):
        neighbours cost alike and the plan ends where it starts, so the short last step the
        reader fills from the start joins micro-batches of like cost. ``none`` keeps the packed
        order, or, with ``two_caps``, orders by both fills (``order.both_fills_order``).
        """
        from .order import both_fills_order, circle_order

        if self.orders:
            return circle_order(comm, packed, self.cost(packed))
        if two_caps:
            return both_fills_order(comm, packed, self.opts.limit, self.opts.max_size2)
        return packed


class ComputeBalance(Balance):
    """``--balance compute``: a sample weighs its compute ``C*s + s^2`` (``--cost-coeff C``), its matrix products and
    its attention; a padded micro-batch costs every slot at its padded length."""

    name: ClassVar[str] = "compute"
    help: ClassVar[str] = "C*s + s^2 per document (docs/step-costs.md)"

    def record(self) -> dict[str, object]:
        """Return the mode and its cost coefficient."""
        return {"balance": self.name, "cost_coeff": self.opts.cost_coeff}

    def weight(self, sizes: np.ndarray, measures: dict[str, np.ndarray]) -> np.ndarray:
        """Return each sample's ``C*s + s^2`` (float64)."""
        s = sizes.astype("float64")
        return self.opts.cost_coeff * s + s * s

    def cost(self, packed: Packed) -> np.ndarray:
        """Return each micro-batch's compute; a padded one ``batch_size * padded_size * (C + padded_size)``, as
        ``inspect`` counts it."""
        if not self.opts.padded_layout:
            return super().cost(packed)
        mb = packed.batches
        padded = mb.padded_size.astype("float64")
        return mb.batch_size.astype("float64") * padded * (self.opts.cost_coeff + padded)


class TargetsBalance(Balance):
    """``--balance targets``: a sample weighs its loss targets (fine-tuning data); row packing composes its rows
    so each carries about the same targets (``compose``)."""

    name: ClassVar[str] = "targets"
    help: ClassVar[str] = "the loss targets of fine-tuning data, rows composed by them (docs/fine-tuning.md)"
    composes_rows: ClassVar[bool] = True

    def check(self) -> None:
        """Refuse a second cap on rows too: the rows it composes could no longer hold it."""
        super().check()
        if self.opts.rows and self.opts.max_size2:
            raise SortpackError("--balance targets composes rows by their loss targets, which --max-size2 would "
                                "no longer hold: drop --max-size2, or use --balance compute")

    def weight(self, sizes: np.ndarray, measures: dict[str, np.ndarray]) -> np.ndarray:
        """Return each sample's loss targets (int64): what it adds to its step's gradient."""
        if "targets" not in measures:
            raise SortpackError("--balance targets balances the loss targets of fine-tuning data (--chat-template, "
                                "--prompt-column or --labels-column); this plan counts none", collective=True)
        return measures["targets"]


# --balance NAME -> the mode (``PackOptions.balance``); a new mode is one class here
BALANCE: dict[str, type[Balance]] = {cls.name: cls for cls in (Balance, ComputeBalance, TargetsBalance)}


def balance_of(opts: BalanceOptions) -> Balance:
    """Return the ``Balance`` of ``opts`` (SortpackError, one line: an unknown ``--balance``)."""
    cls = BALANCE.get(opts.balance)
    if cls is None:
        raise SortpackError(f"--balance {opts.balance!r}: expected {', '.join(BALANCE)}")
    return cls(opts)


def balance_help() -> str:
    """Return the ``--balance`` help: what each mode balances."""
    modes = ", ".join(f"{name} {cls.help}" for name, cls in BALANCE.items() if cls.help)
    return ("Order micro-batches so that consecutive ones cost alike, so any W x A deal of a step is balanced: "
            f"{modes}.")
