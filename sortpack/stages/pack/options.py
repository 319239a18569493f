"""The pack stage's options (``PackOptions``): the budget, the shape rules, the oversize policy, the balance.

The bottom of the pack room: every other module of ``stages/pack/`` reads the options, and
they read only the two registries (``budgets``: ``--budget``; ``balance``: ``--balance``) to
check a name and ask a budget or a mode what it refuses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ... import kernels
from ...errors import SortpackError
from ..caps import CAP_FITS, MAX_CAPS
from .balance import balance_of
from .budgets import budget_of

__all__ = ["CAP_FITS", "FIT_WINDOW", "SEGMENT_SIZE", "PackOptions"]

# Sorted samples per packing segment: ranks own whole segments, so the packing does not
# depend on the rank count, and one segment is the sequential greedy.
SEGMENT_SIZE = 1 << 20

# Samples per best-fit window of the greedy budgets. On the vision-language set of
# docs/multimodal.md (1M samples, three caps) the binding cap's mean fill is 0.9913 at 1,024,
# 0.9958 at 4,096, 0.9979 at 16,384 and 0.9989 at 65,536, the kernel's time 0.44, 0.65, 0.78
# and 1.40 s (load 10 on 2 cores).
FIT_WINDOW = 16384


@dataclass(frozen=True)
class PackOptions:
    """How to cut micro-batches: budget, shape rules, oversize policy (read-only: ``with_shapes`` makes a copy)."""

    max_tokens: int | None = None
    budget: str = "padded"  # --budget NAME (budgets.BUDGETS)
    max_samples: int = 0
    batch_multiple: int = 1
    quadratic_scale: float | None = None
    pad_to_multiple: int = 0
    shapes: tuple[int, ...] = field(default_factory=tuple)
    group_size: int = 1
    same_shape: bool = False
    oversize: str = "error"
    segment_size: int = SEGMENT_SIZE
    rows: int = 0  # row length for row packing (0: off)
    rows_per_microbatch: int = 1
    max_segments: int = 0
    auto_shapes: int | None = None  # --shapes auto:K: K; pack_samples chooses the lengths (``Microbatches.shapes``)
    static_shapes: bool = False  # every micro-batch's batch size fixed by its padded length
    keep_empty: bool = False  # keep samples of size 0 (default: dropped, counted in stats["empty"])
    max_size2: int = 0  # --max-size2 N: a micro-batch's (and a row's) sum of the size2 measure (0: no cap)
    # caps on other measures, in order: (measure, N) of each --cap NAME=N and of the 2nd, 3rd.. --max-size2
    caps: tuple[tuple[str, int], ...] = ()
    cap_fit: str = "auto"  # --cap-fit: CAP_FITS
    # the vision encoder's cost under --balance compute (and in inspect): the measure of its patches, its
    # attention (full:MEASURE of the patches' squares, or window:W) and C_e of C_e*p + attention
    encoder_patches: str | None = None
    encoder_attention: str | None = None
    encoder_coeff: float = 7680.0
    balance: str = "none"  # --balance NAME: order micro-batches so consecutive ones cost alike (balance.BALANCE)
    cost_coeff: float = 6144.0  # --cost-coeff C of --balance compute: a sample costs C*s + s^2

    def __post_init__(self) -> None:
        """Give row packing its budget (rows per micro-batch times the row length) unless one is set; take caps
        as a mapping or pairs (a manifest's record)."""
        caps = self.caps.items() if isinstance(self.caps, dict) else self.caps
        object.__setattr__(self, "caps", tuple((str(name), int(n)) for name, n in caps))
        if self.rows and self.rows > 0 and not self.max_tokens:
            # a row-packed micro-batch holds R rows of ROW_LEN tokens: that is its budget
            object.__setattr__(self, "max_tokens", self.rows * max(self.rows_per_microbatch, 1))

    def with_shapes(self, shapes: tuple[int, ...]) -> PackOptions:
        """Return a copy whose ``shapes`` are ``shapes`` (the lengths a packing used, e.g. chosen by auto:K)."""
        return replace(self, shapes=tuple(shapes))

    @property
    def cap_list(self) -> tuple[tuple[str, int], ...]:
        """Return every cap beside the budget as (measure, N), ``--max-size2``'s (on ``size2``) first."""
        return ((("size2", self.max_size2),) if self.max_size2 else ()) + self.caps

    @property
    def best_fit(self) -> bool:
        """Return whether micro-batches (or rows) are packed by best fit over all caps (``--cap-fit``)."""
        return self.cap_fit == "best" or (self.cap_fit == "auto" and len(self.cap_list) >= 2)

    @property
    def limit(self) -> int:
        """Return ``--max-tokens``, the budget of one micro-batch (SortpackError while it is unset)."""
        if self.max_tokens is None:
            raise SortpackError("--max-tokens N is required (or --rows ROW_LEN for row packing)")
        return self.max_tokens

    @property
    def scale(self) -> float:
        """Return ``Q`` of the quadratic budget (1.0 unset: only that budget reads it, and it requires Q)."""
        return self.quadratic_scale or 1.0

    @property
    def rounding(self) -> bool:
        """Return whether padded lengths are rounded to a fixed set."""
        return self.pad_to_multiple > 1 or bool(self.shapes)

    @property
    def padded_layout(self) -> bool:
        """Return whether micro-batches train as padded tensors (every slot ``padded_size`` long).

        ``--budget padded``, ``--same-shape`` and ``--static-shapes`` pad; ``--budget tokens`` and
        ``quadratic`` (varlen training: ``cu_seqlens``) and ``--rows`` attend within each document.
        """
        return not self.rows and (budget_of(self).pads or self.same_shape or self.static_shapes)

    def window(self) -> int:
        """Return the best-fit window of row packing (samples), 0 when rows are off."""
        return kernels.DEFAULT_ROW_WINDOW if self.rows else 0

    def validate(self) -> None:
        """Raise SortpackError for option values that make no sense (the first, in a fixed order: one line)."""
        self._validate_budget()
        self._validate_shape_rules()
        if self.oversize not in ("error", "skip", "truncate", "split"):
            raise SortpackError(f"--oversize {self.oversize!r}: expected error, skip, truncate or split")
        if self.segment_size < 1:
            raise SortpackError("--segment-size must be positive")
        self._validate_balance()
        self._validate_caps()
        self._validate_encoder()
        if self.rows < 0:
            raise SortpackError(f"--rows {self.rows}: must be a positive row length")
        if self.rows:
            self._validate_rows()
        elif self.max_segments or self.rows_per_microbatch != 1:
            raise SortpackError("--max-segments and --rows-per-microbatch need --rows ROW_LEN")

    def _validate_budget(self) -> None:
        """Raise SortpackError for a budget that is not positive, unknown (the registry), or missing its scale."""
        if self.limit <= 0:
            raise SortpackError(f"--max-tokens {self.max_tokens}: must be a positive integer")
        budget = budget_of(self)  # the --budget registry: an unknown name is refused here
        q = self.quadratic_scale
        if q is not None and not (math.isfinite(q) and q > 0):
            raise SortpackError(f"--quadratic-scale {q}: must be a finite number > 0")
        budget.check()

    def _validate_shape_rules(self) -> None:
        """Raise SortpackError for counts, multiples, lengths and groups out of range or excluding each other."""
        if self.max_samples < 0:
            raise SortpackError(f"--max-samples {self.max_samples}: must be >= 0")
        if self.batch_multiple < 1:
            raise SortpackError(f"--batch-multiple {self.batch_multiple}: must be >= 1")
        if self.pad_to_multiple < 0:
            raise SortpackError(f"--pad-to-multiple {self.pad_to_multiple}: must be >= 0")
        if self.pad_to_multiple > 1 and self.shapes:
            raise SortpackError("--pad-to-multiple and --shapes exclude each other")
        if self.shapes and (any(s <= 0 for s in self.shapes) or list(self.shapes) != sorted(set(self.shapes))):
            raise SortpackError("--shapes: expected increasing positive lengths, e.g. 128,256,512")
        self._validate_auto_static()
        if self.group_size < 1:
            raise SortpackError(f"--group-size {self.group_size}: must be >= 1")
        if self.same_shape and self.group_size < 2:
            raise SortpackError("--same-shape needs --group-size G with G >= 2")

    def _validate_caps(self) -> None:
        """Raise SortpackError for caps out of range, named twice, too many, or with an option they cannot work
        with, and for an unknown ``--cap-fit``."""
        if self.max_size2 < 0:
            raise SortpackError(f"--max-size2 {self.max_size2}: must be a positive integer")
        names = [name for name, _ in self.cap_list]
        for name, n in self.caps:
            if n <= 0:
                raise SortpackError(f"--cap {name}={n}: the cap must be a positive integer")
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise SortpackError(f"--cap {twice[0]}: the measure is capped twice (--max-size2 caps size2, size3, ..."
                                " in order; --cap NAME=N any measure)")
        if len(names) > MAX_CAPS:
            raise SortpackError(f"{len(names)} caps: at most {MAX_CAPS} beside the budget")
        if self.cap_fit not in CAP_FITS:
            raise SortpackError(f"--cap-fit {self.cap_fit!r}: expected {', '.join(CAP_FITS)}")
        flag = "--max-size2" if self.max_size2 and len(names) == 1 else "--cap"
        if names and self.same_shape:
            # a group packed with G budgets is split evenly by count, not by the caps' measures
            raise SortpackError(f"{flag} and --same-shape exclude each other")
        if self.same_shape and self.cap_fit == "best":
            raise SortpackError("--cap-fit best and --same-shape exclude each other (a same-shape group is one "
                                "run of the sorted order, split evenly)")
        if names and self.oversize in ("truncate", "split"):
            what = "second size" if flag == "--max-size2" else "capped measures"
            raise SortpackError(f"{flag} with --oversize {self.oversize}: a sample's {what} cannot be "
                                "cut; use --oversize error or skip")

    def encoder_window(self) -> int:
        """Return W of ``--encoder-attention window:W`` (0: full attention, or no encoder)."""
        kind, _, value = (self.encoder_attention or "full").partition(":")
        return int(value) if kind == "window" and value.isdigit() else 0

    def encoder_squares(self) -> str | None:
        """Return the measure of the patches' squares of ``--encoder-attention full:MEASURE`` (None: windowed)."""
        kind, _, value = (self.encoder_attention or "").partition(":")
        return value if kind == "full" else None

    def _validate_encoder(self) -> None:
        """Raise SortpackError for encoder options that are incomplete or out of range."""
        att = self.encoder_attention
        if not self.encoder_patches:
            if att is not None:
                raise SortpackError("--encoder-attention needs --encoder-patches MEASURE (the encoder's patches)")
            return
        if att is None:
            raise SortpackError("--encoder-patches needs --encoder-attention full:MEASURE (a full-attention encoder: "
                                "the squares of each image's patches, summed) or window:W (windows of W patches)")
        kind, _, value = att.partition(":")
        if kind == "window" and not (value.isdigit() and int(value) > 0):
            raise SortpackError(f"--encoder-attention {att}: window:W needs W, the patches a window holds (> 0)")
        if kind == "full" and not value:
            raise SortpackError(f"--encoder-attention {att}: full:MEASURE names the measure of each sample's "
                                "patches squared, summed over its images")
        if kind not in ("full", "window"):
            raise SortpackError(f"--encoder-attention {att!r}: expected full:MEASURE (a full-attention encoder: the "
                                "squares of each image's patches, summed) or window:W (windows of W patches)")
        if not (math.isfinite(self.encoder_coeff) and self.encoder_coeff >= 0):
            raise SortpackError(f"--encoder-coeff {self.encoder_coeff}: must be a finite number >= 0")

    def _validate_rows(self) -> None:
        """Raise SortpackError for row-packing options that are out of range or do not apply to rows."""
        if self.rows_per_microbatch < 1:
            raise SortpackError(f"--rows-per-microbatch {self.rows_per_microbatch}: must be >= 1")
        if self.max_segments < 0:
            raise SortpackError(f"--max-segments {self.max_segments}: must be >= 0")
        clash = [name for name, on in (("--same-shape", self.same_shape), ("--shapes", bool(self.shapes)),
                                       ("--max-samples", self.max_samples > 0),
                                       ("--batch-multiple", self.batch_multiple > 1),
                                       ("--shapes auto", self.auto_shapes is not None),
                                       ("--static-shapes", self.static_shapes)) if on]
        if clash:
            raise SortpackError(f"--rows packs fixed-length rows; {clash[0]} does not apply to it")
        k = self.pad_to_multiple
        if k > 1 and self.rows % k:
            # each document is padded to a multiple of K inside its row: so is the row's padding tail
            raise SortpackError(f"--rows {self.rows} with --pad-to-multiple {k}: the row length must be a multiple "
                                f"of K (context parallelism pads every document and the row to 2 x CP)")

    def _validate_balance(self) -> None:
        """Raise SortpackError for an unknown ``--balance``, a cost coefficient out of range, or options the mode
        refuses."""
        balance = balance_of(self)  # the --balance registry: an unknown name is refused here
        if not (math.isfinite(self.cost_coeff) and self.cost_coeff >= 0):
            raise SortpackError(f"--cost-coeff {self.cost_coeff}: must be a finite number >= 0")
        balance.check()

    def _validate_auto_static(self) -> None:
        """Raise SortpackError for bad ``--shapes auto:K`` / ``--static-shapes`` combinations."""
        if self.auto_shapes is not None:
            if self.auto_shapes < 1:
                raise SortpackError(f"--shapes auto:{self.auto_shapes}: K must be >= 1 (how many lengths to choose)")
            if self.pad_to_multiple > 1:
                raise SortpackError("--pad-to-multiple and --shapes auto:K exclude each other")
        if self.static_shapes:
            if not self.rounding and self.auto_shapes is None:
                raise SortpackError("--static-shapes needs --shapes L1,L2,.. (or auto:K) or --pad-to-multiple K")
            if self.same_shape:
                raise SortpackError("--static-shapes and --same-shape exclude each other "
                                    "(static shapes already fix the shape of every micro-batch of a length)")

    def as_dict(self) -> dict:
        """Return the options as recorded in manifests."""
        extra: dict[str, object] = {}
        if self.auto_shapes is not None:
            extra["shapes_request"] = f"auto:{self.auto_shapes}"  # ``shapes`` holds the chosen lengths
        if self.static_shapes:
            extra["static_shapes"] = True
        if self.keep_empty:
            extra["keep_empty"] = True
        if self.max_size2:
            extra["max_size2"] = self.max_size2  # recorded only when set: other plans keep their hash
        if self.caps:
            extra["caps"] = [[name, n] for name, n in self.caps]
        if self.cap_fit != "auto":
            extra["cap_fit"] = self.cap_fit
        if self.encoder_patches:
            extra.update(encoder_patches=self.encoder_patches, encoder_attention=self.encoder_attention,
                         encoder_coeff=self.encoder_coeff)
        extra.update(balance_of(self).record())
        return {**extra, "max_tokens": self.max_tokens, "budget": self.budget, "max_samples": self.max_samples,
                "batch_multiple": self.batch_multiple, "quadratic_scale": self.quadratic_scale,
                "pad_to_multiple": self.pad_to_multiple, "shapes": list(self.shapes),
                "group_size": self.group_size, "same_shape": self.same_shape, "oversize": self.oversize,
                "segment_size": self.segment_size, "rows": self.rows,
                "rows_per_microbatch": self.rows_per_microbatch, "max_segments": self.max_segments,
                "row_window": self.window()}
