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
    def cap_list(self) -> tuple[tuple[str, int], ...]:
        """Return the caps beside the budget, (measure, N) each."""

    @property
    def best_fit(self) -> bool:
        """Return whether micro-batches are packed by best fit over all caps (``--cap-fit``)."""

    @property
    def encoder_patches(self) -> str | None:
        """Return ``--encoder-patches``, the measure of the vision encoder's patches (None: no encoder)."""

    @property
    def encoder_coeff(self) -> float:
        """Return ``--encoder-coeff``, C_e of the encoder's cost ``C_e*p + attention``."""

    def encoder_window(self) -> int:
        """Return W of ``--encoder-attention window:W`` (0: full attention)."""

    def encoder_squares(self) -> str | None:
        """Return the measure of the patches' squares (``--encoder-attention full:MEASURE``)."""

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

    def arrange(self, comm: Comm, packed: Packed, by_fills: bool) -> Packed:
        """Return this rank's part of the micro-batches in the mode's order (collective).

        A mode that weighs lays them out as a circle of their costs (``order.circle_order``):
        neighbours cost alike and the plan ends where it starts, so the short last step the
        reader fills from the start joins micro-batches of like cost. ``none`` keeps the packed
        order, or, with ``by_fills`` (varlen micro-batches under caps), orders them so that
        neighbours are alike in the fills that vary most (``order.both_fills_order`` for one cap,
        ``order.fills_order`` for several or a best fit).
        """
        if self.orders:
            from .order import circle_order  # each order where it is used: --balance none keeps the packed one

            return circle_order(comm, packed, self.cost(packed))
        if by_fills and len(self.opts.cap_list) == 1 and not self.opts.best_fit:
            from .order import both_fills_order

            name, cap = self.opts.cap_list[0]
            return both_fills_order(comm, packed, self.opts.limit, cap, name)
        if by_fills:
            from .order import fills_order

            return fills_order(comm, packed, self.opts.limit, self.opts.cap_list)
        return packed


class ComputeBalance(Balance):
    """``--balance compute``: a sample weighs its compute ``C*s + s^2`` (``--cost-coeff C``), its matrix products and
    its attention; a padded micro-batch costs every slot at its padded length. With ``--encoder-patches`` the
    vision encoder's work is balanced too (``encoder_parts``): micro-batches alike in both are neighbours."""

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

    def arrange(self, comm: Comm, packed: Packed, by_fills: bool) -> Packed:
        """Return the micro-batches as a circle of their LLM cost; with an encoder, along a closed curve over both
        costs (``order.two_cost_key``), so that any run of them is alike in both."""
        if not self.opts.encoder_patches:
            return super().arrange(comm, packed, by_fills)
        from .order import global_order, two_cost_key

        return global_order(comm, packed, two_cost_key(comm, self.llm_parts(packed), encoder_parts(self.opts, packed)))

    def llm_parts(self, packed: Packed) -> list[tuple[float, np.ndarray]]:
        """Return each micro-batch's LLM compute as terms (coefficient, int64 per micro-batch): ``C*tokens +
        sum of s^2``, padded ``C*slots*L + slots*L^2`` (exact integer sums: the same total at any rank count)."""
        import numpy as np

        from .packed import segment_reduce

        mb = packed.batches
        if self.opts.padded_layout:
            slots = mb.batch_size.astype(np.int64) * np.asarray(mb.padded_size, np.int64)
            return [(self.opts.cost_coeff, slots), (1.0, slots * np.asarray(mb.padded_size, np.int64))]
        assert packed.sizes is not None
        s = packed.sizes.astype(np.int64)
        return [(self.opts.cost_coeff, mb.tokens.astype(np.int64)), (1.0, segment_reduce(np.add, s * s, mb.offsets))]


def encoder_parts(opts: BalanceOptions, packed: Packed) -> list[tuple[float, np.ndarray]]:
    """Return each micro-batch's vision-encoder work as terms (coefficient, int64 per micro-batch): per image
    ``C_e*p + p^2`` for a full-attention encoder (``p`` its patches), ``(C_e + W)*p`` for one that attends within
    windows of W patches.

    The measures are per sample, summed over its images (the patches, and their squares for full
    attention); a micro-batch's work is their sum over its samples.
    """
    import numpy as np

    from .packed import segment_reduce

    name = opts.encoder_patches
    assert name is not None
    squares = opts.encoder_squares()
    missing = [m for m in (name, squares) if m and m not in packed.measures]
    if missing:
        raise SortpackError(f"--encoder-patches/--encoder-attention name the measure {missing[0]!r}, which this plan "
                            f"does not measure (give --measure {missing[0]}=SPEC or --cap at analyze or run)",
                            collective=True)
    offsets = packed.batches.offsets
    patches = segment_reduce(np.add, packed.measures[name].astype(np.int64), offsets)
    window = opts.encoder_window()
    if window:
        return [(opts.encoder_coeff + window, patches)]
    assert squares is not None
    return [(opts.encoder_coeff, patches), (1.0, segment_reduce(np.add, packed.measures[squares].astype(np.int64),
                                                                 offsets))]


class TargetsBalance(Balance):
    """``--balance targets``: a sample weighs its loss targets (fine-tuning data); row packing composes its rows
    so each carries about the same targets (``compose``)."""

    name: ClassVar[str] = "targets"
    help: ClassVar[str] = "the loss targets of fine-tuning data, rows composed by them (docs/fine-tuning.md)"
    composes_rows: ClassVar[bool] = True

    def check(self) -> None:
        """Refuse caps on rows too: the rows it composes could no longer hold them."""
        super().check()
        caps = self.opts.cap_list
        if self.opts.rows and caps:
            flag = "--max-size2" if caps[0][0] == "size2" and len(caps) == 1 else "--cap"
            raise SortpackError(f"--balance targets composes rows by their loss targets, which {flag} would "
                                f"no longer hold: drop {flag}, or use --balance compute")

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
