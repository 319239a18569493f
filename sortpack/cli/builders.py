"""The library's option objects built from a command's parsed options (each ``make_*`` pops or reads ``kw``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SortpackError

if TYPE_CHECKING:
    from ..inputs.mixture import Mixture
    from ..pipeline.dataset import HoldoutRequest
    from ..stages.analyze import AnalyzeOptions
    from ..stages.pack import PackOptions
    from ..stages.sort import SortOptions
    from ..write.store import StoreOptions


def make_analyze(kw: dict) -> AnalyzeOptions:
    """Return the AnalyzeOptions of the analyze options in ``kw``."""
    from ..stages.analyze import AnalyzeOptions

    return AnalyzeOptions(column=kw["column"], size=kw["size_spec"], difficulty=kw["difficulty_spec"],
                          tokenizer=kw["tokenizer"], input_format=kw["input_format"],
                          special_tokens=kw["special_tokens"], split=kw["split"], size2=kw.get("size2_spec"),
                          measures=kw.get("measures") or (),
                          labels_column=kw.get("labels_column"), prompt_column=kw.get("prompt_column"),
                          completion_column=kw.get("completion_column"), chat_template=kw.get("chat_template"),
                          train_on=tuple(r.strip() for r in kw["train_on"].split(",")) if kw.get("train_on") else None)


def make_sort(kw: dict) -> SortOptions:
    """Return the SortOptions of the sort options in ``kw``."""
    from ..stages.sort import SortOptions

    return SortOptions(key=kw["key"], descending=kw["descending"], stages=kw["stages"])


def make_pack(kw: dict) -> PackOptions:
    """Return the PackOptions of the pack options in ``kw``."""
    from ..stages.pack import SEGMENT_SIZE, PackOptions

    return PackOptions(max_tokens=kw["max_tokens"], budget=kw["budget"], max_samples=kw["max_samples"],
                       batch_multiple=kw["batch_multiple"], quadratic_scale=kw["quadratic_scale"],
                       pad_to_multiple=kw["pad_to_multiple"], shapes=kw["shapes"][0], group_size=kw["group_size"],
                       same_shape=kw["same_shape"], oversize=kw["oversize"],
                       segment_size=kw["segment_size"] or SEGMENT_SIZE, rows=kw["rows"],
                       rows_per_microbatch=kw["rows_per_microbatch"], max_segments=kw["max_segments"],
                       auto_shapes=kw["shapes"][1], static_shapes=kw["static_shapes"],
                       keep_empty=kw["keep_empty"], max_size2=kw["max_size2"], balance=kw["balance"],
                       cost_coeff=kw["cost_coeff"])


def make_store(kw: dict) -> StoreOptions:
    """Return the StoreOptions of --store, --store-tokens, --memory-limit (popped from ``kw``) and the tokenizer."""
    from ..write.store import StoreOptions, parse_memory, parse_store

    return StoreOptions(columns=parse_store(kw.pop("store_columns")), tokens=kw.pop("store_tokens"),
                        memory_limit=parse_memory(kw.pop("memory_limit")), tokenizer=kw.pop("store_tokenizer", None),
                        chat_template=kw.pop("store_chat_template", None))


def make_holdout(kw: dict, mixture: bool = False) -> HoldoutRequest | None:
    """Return the HoldoutRequest of --holdout and --holdout-seed (popped from ``kw``; None without either).

    A mixture may take --holdout-seed alone (its MIX.json names what each source holds out).
    Every rank parses the same arguments, so every rank raises the same error.
    """
    from ..permutation import check_seed
    from ..pipeline.dataset import HoldoutRequest

    value, seed = kw.pop("holdout"), kw.pop("holdout_seed")
    try:
        if seed is not None:
            check_seed(seed, "--holdout-seed", SortpackError)
        if value is None:
            if seed is not None and not mixture:
                raise SortpackError("--holdout-seed applies to a held-out plan (--holdout N|FRACTION)")
            return None if seed is None else HoldoutRequest(None, seed)
        from ..stages.holdout import parse_holdout  # with --holdout only

        return HoldoutRequest(parse_holdout(value), seed)
    except SortpackError as exc:
        raise SortpackError(str(exc), collective=True) from None


def make_mixture(inputs: tuple[str, ...], kw: dict, keep_intermediate: bool) -> Mixture | None:
    """Return the Mixture of --mixture/--blend (None without either), refusing what does not go with it.

    Every rank parses the same arguments and files, so every rank raises the same error.
    """
    path, blend = kw.pop("mixture"), kw.pop("blend")
    total, seed = kw.pop("total_tokens"), kw.pop("seed")
    if path is None and blend is None:
        if total is not None or seed is not None:
            raise SortpackError("--total-tokens and --seed apply to a mixture (--mixture or --blend)", collective=True)
        if not inputs:
            raise SortpackError("Missing argument 'INPUTS...' (or --mixture MIX.json, or --blend)", collective=True)
        return None
    from ..inputs.mixture import check_total_tokens, load_mixture, parse_blend
    from ..permutation import check_seed

    try:
        if path is not None and blend is not None:
            raise SortpackError("--mixture and --blend exclude each other")
        if inputs:
            raise SortpackError(f"{'--mixture' if path else '--blend'} names the inputs: give no INPUTS "
                                f"(got {inputs[0]!r})")
        if keep_intermediate:
            raise SortpackError("--keep-intermediate does not apply to a mixture")
        mix = load_mixture(path) if path is not None else parse_blend(blend)
        if total is not None:
            if total <= 0:
                raise SortpackError(f"--total-tokens {total}: must be a positive integer")
            mix.total_tokens = check_total_tokens(total, "--total-tokens")
        if seed is not None:
            mix.seed = check_seed(seed, "--seed", SortpackError)
    except SortpackError as exc:
        raise SortpackError(str(exc), collective=True) from None
    return mix
