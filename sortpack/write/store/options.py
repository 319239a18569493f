"""The ``--store``, ``--store-tokens`` and ``--memory-limit`` options, parsed and checked."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import SortpackError
from ...parallel import Comm

if TYPE_CHECKING:
    from ...stages.analyze import AnalyzeOptions
    from ...stages.plan_options import PlanOptions

TOKENS_COLUMN = "input_ids"
LABELS_COLUMN = "labels"  # fine-tuning data: the labels stored beside the ids (-100: no target)
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_memory(text: str | int | None) -> int | None:
    """Return a byte count from ``text`` such as ``512M``, ``4G`` or ``1000000`` (None stays None)."""
    if text is None or text == "":
        return None
    if isinstance(text, int):
        value = text
    else:
        s = str(text).strip().lower().removesuffix("ib").removesuffix("b")
        scale = _UNITS.get(s[-1:], 1)
        try:
            value = int(float(s[:-1] if s[-1:] in _UNITS else s) * scale)
        except ValueError:
            raise SortpackError(f"--memory-limit {text!r}: expected bytes such as 512M, 4G or 1000000",
                                collective=True) from None
    if value <= 0:
        raise SortpackError(f"--memory-limit {text!r}: must be positive", collective=True)
    return value


def default_memory_limit(comm: Comm) -> int:
    """Return half of this node's physical memory divided by the ranks on this node."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 8 << 30
    hosts = comm.allgather_obj(socket.gethostname())
    per_node = max(1, hosts.count(hosts[comm.rank]))
    return max(1 << 20, phys // 2 // per_node)


@dataclass(frozen=True)
class StoreOptions:
    """What to store with the index.

    ``columns``: input columns to store; ``tokens``: also store ``input_ids`` (the token
    ids of ``--size tokens``); ``memory_limit``: bytes per rank for the exchange (None: the
    default, see ``default_memory_limit``); ``tokenizer``: the tokenizer file (``pack``
    needs it again, ``run`` reuses ``--tokenizer``).
    """

    columns: tuple[str, ...] = ()
    tokens: bool = False
    memory_limit: int | None = None
    tokenizer: str | None = None
    chat_template: str | None = None  # pack --store-tokens of chats: the template they were rendered with

    @property
    def enabled(self) -> bool:
        """Return whether anything is stored."""
        return bool(self.columns) or self.tokens

    def validate(self) -> None:
        """Raise SortpackError on inconsistent options."""
        if len(set(self.columns)) != len(self.columns):
            raise SortpackError(f"--store {','.join(self.columns)}: a column is named twice")
        if any(not c for c in self.columns):
            raise SortpackError("--store: empty column name")
        if self.tokens and TOKENS_COLUMN in self.columns:
            raise SortpackError(f"--store {TOKENS_COLUMN} and --store-tokens both write {TOKENS_COLUMN!r}")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise SortpackError("--memory-limit must be positive")


def parse_store(text: str | None) -> tuple[str, ...]:
    """Return the column names of ``--store COL[,COL...]``."""
    if not text:
        return ()
    return tuple(c.strip() for c in text.split(","))


@dataclass(frozen=True)
class TokenIds:
    """How ``--store-tokens`` gets the ids it stores.

    ``column``: the text column the sizes were counted from; ``tokenizer``: the loaded
    tokenizer and ``tokenizer_file`` the name the manifest records; ``special_tokens``:
    whether the counts included the special tokens; ``truncate``: the length stored ids are
    cut to (``--oversize truncate``), 0 for none.
    """

    column: str
    tokenizer: Any
    tokenizer_file: str
    special_tokens: bool
    truncate: int
    shape: Any = None  # fine-tuning texts (inputs.finetune.FineTuneShape): labels are stored beside the ids
    labels_column: str | None = None  # ids without a tokenizer (``tokenizer`` None): the labels column stored with them

    @property
    def labels(self) -> bool:
        """Return whether labels are stored beside the ids."""
        return self.shape is not None or self.labels_column is not None


def token_ids_options(opts: StoreOptions, plan: PlanOptions, tokenizer_path: str | None) -> TokenIds | None:
    """Return how ``--store-tokens`` gets its ids (None without it), raising SortpackError on bad options.

    Parameters
    ----------
    opts : StoreOptions
        The store options (validated here).
    plan : PlanOptions
        What the plan measured (column, size, tokenizer, special tokens) and how it packs
        (``--oversize truncate`` cuts stored ids to the truncated size).
    tokenizer_path : str or None
        ``run``'s ``--tokenizer``, used when ``opts.tokenizer`` is not set.
    """
    opts.validate()
    if not opts.tokens:
        return None
    measured = plan.analyze
    shape = measured.shape
    if not (opts.tokenizer or tokenizer_path or measured.tokenizer) and measured.size == "tokens":
        # no tokenizer counted the sizes: the column holds token ids (a Megatron dataset), stored as they are
        return TokenIds(measured.column or TOKENS_COLUMN, None, "", measured.special_tokens, _truncated_to(plan),
                        labels_column=shape.stored_labels if shape is not None else None)
    if shape is not None and not shape.encodes_text:
        raise SortpackError(f"--store-tokens stores ids a tokenizer made; this plan's ids and labels are columns: "
                            f"--store {','.join(shape.stored_columns())}")
    if shape is not None:
        return _fine_tune_ids(opts, plan, tokenizer_path)
    if measured.size != "tokens":
        raise SortpackError(f"--store-tokens stores the ids of --size tokens; this plan's size is "
                            f"{measured.size!r}")
    column = measured.column
    if not column:
        raise SortpackError("--store-tokens needs --column (the text column the tokens were counted from)")
    path, tokenizer = _recorded_tokenizer(opts, measured, tokenizer_path)
    return TokenIds(column, tokenizer, Path(path).name, measured.special_tokens, _truncated_to(plan))


def _truncated_to(plan: PlanOptions) -> int:
    """Return the length stored ids are cut to: ``--oversize truncate``'s, else 0 (kept whole)."""
    from ...stages.pack import truncate_length

    popts = plan.pack
    return truncate_length(popts) if popts is not None and popts.oversize == "truncate" else 0


def _recorded_tokenizer(opts: StoreOptions, measured: AnalyzeOptions, tokenizer_path: str | None) -> tuple[str, Any]:
    """Return (path, loaded tokenizer) of ``--store-tokens``: the file the plan's sizes were counted with."""
    from ...inputs.finetune import check_recorded_file
    from ...inputs.specs import load_tokenizer

    path = opts.tokenizer or tokenizer_path
    if not path:
        raise SortpackError("--store-tokens needs --tokenizer (the tokenizer.json the sizes were counted with)")
    check_recorded_file("--tokenizer", path, measured.tokenizer, "the plan's sizes were counted with")
    return path, load_tokenizer(path, "--store-tokens")


def _fine_tune_ids(opts: StoreOptions, plan: PlanOptions, tokenizer_path: str | None) -> TokenIds:
    """Return how ``--store-tokens`` gets the ids and labels of prompt/completion texts or chats."""
    assert plan.analyze.shape is not None
    path, tokenizer = _recorded_tokenizer(opts, plan.analyze, tokenizer_path)
    plan.analyze.shape.check_tokenizer(path)
    # run takes the ids from analyze's own rendering; pack renders the chats again with the same template
    why = "--store-tokens of chats: pack" if tokenizer_path is None else None
    shape = plan.analyze.shape.loaded(tokenizer, opts.chat_template, why)
    return TokenIds(shape.columns()[0], tokenizer, Path(path).name, True, _truncated_to(plan), shape)
