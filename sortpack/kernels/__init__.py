"""Numeric kernels: greedy packing, merging of sorted runs, bin packing into rows, the choice
of padded lengths, a byte gather, a mixture's interleave and the token collate; the public
names here are the contract the stages (and the reader's collate) use.

Each runs the compiled C kernels (``_ckernels``, built by ``pip install``; called through
ctypes, with the GIL released) when present, and otherwise falls back, after one warning,
to a numpy implementation in the same file that gives identical results, more slowly.
Set ``SORTPACK_NO_CKERNELS=1`` to force the fallback; ``backend()`` says which is in use.

``_loader`` loads the library and holds the backend state; ``budget`` the packing-budget
policy; ``greedy``, ``fit`` (best fit over the budget and every cap),
``merge``, ``radix``, ``rows``, ``lengths``, ``gather``, ``interleave``, ``tokens`` and
``utf8`` one kernel family each; ``compose`` (rows composed by their targets) and ``bpe`` (the GPT-2-pattern
BPE of ASCII text, whose fallback is tiktoken itself) are imported by their module paths.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._loader import backend

if TYPE_CHECKING:
    from .budget import BUDGETS, COSTS, KernelCost, batch_capacity, round_lengths, sample_cost
    from .fit import fit_pack, fit_pack_reference
    from .gather import gather_bytes
    from .greedy import greedy_pack, greedy_pack_reference
    from .interleave import wf2q_interleave, wf2q_reference
    from .lengths import optimal_lengths
    from .merge import merge_sorted_keys, merge_sorted_runs, merge_sorted_runs2
    from .radix import merge_runs_between, merge_sorted_keys_into, merge_with_own_run, sort_id_ordered
    from .rows import DEFAULT_ROW_WINDOW, pack_rows, pack_rows_reference, pack_rows_windows
    from .tokens import pad_tokens, varlen_tokens
    from .utf8 import utf8_cuts

# each public name -> the module of its kernel family, loaded when the name is first used: a job loads the
# families it runs (a plain run neither the mixture's interleave, the collate's tokens nor the rows' best fit)
_HOMES = {
    **dict.fromkeys(("BUDGETS", "COSTS", "KernelCost", "batch_capacity", "round_lengths", "sample_cost"), "budget"),
    **dict.fromkeys(("fit_pack", "fit_pack_reference"), "fit"), "gather_bytes": "gather",
    **dict.fromkeys(("greedy_pack", "greedy_pack_reference"), "greedy"),
    **dict.fromkeys(("wf2q_interleave", "wf2q_reference"), "interleave"), "optimal_lengths": "lengths",
    **dict.fromkeys(("merge_sorted_keys", "merge_sorted_runs", "merge_sorted_runs2"), "merge"),
    **dict.fromkeys(("merge_runs_between", "merge_sorted_keys_into", "merge_with_own_run", "sort_id_ordered"),
                    "radix"),
    **dict.fromkeys(("DEFAULT_ROW_WINDOW", "pack_rows", "pack_rows_reference", "pack_rows_windows"), "rows"),
    **dict.fromkeys(("pad_tokens", "varlen_tokens"), "tokens"), "utf8_cuts": "utf8",
}


def __getattr__(name: str) -> Any:
    """Return the public name ``name`` from its kernel family's module (PEP 562), loading it on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "BUDGETS", "COSTS", "DEFAULT_ROW_WINDOW", "KernelCost", "backend", "batch_capacity", "fit_pack",
    "fit_pack_reference", "gather_bytes", "greedy_pack",
    "greedy_pack_reference", "merge_runs_between", "merge_sorted_keys", "merge_sorted_keys_into",
    "merge_sorted_runs", "merge_sorted_runs2", "merge_with_own_run", "optimal_lengths", "pack_rows",
    "pack_rows_reference", "pack_rows_windows", "pad_tokens", "round_lengths", "sample_cost", "sort_id_ordered",
    "utf8_cuts", "varlen_tokens", "wf2q_interleave", "wf2q_reference",
]
