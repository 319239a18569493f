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


def _caps(kw: dict) -> list:
    """Return the parsed ``--cap`` options of ``kw`` (``CapSpec`` each; SortpackError, every rank, on a bad one)."""
    from ..stages.caps import parse_cap

    try:
        return [parse_cap(text) for text in kw.get("cap_specs") or ()]
    except SortpackError as exc:
        raise SortpackError(str(exc), collective=True) from None


def _measures(kw: dict) -> tuple[tuple[str, str], ...]:
    """Return the named measures the analyze options of ``kw`` make: ``--measure NAME=SPEC`` (parsed by its
    option) and ``--cap NAME=SPEC:N`` (a name given twice is refused, on every rank)."""
    named = list(kw.get("measures") or ()) + [(c.name, c.spec) for c in _caps(kw) if c.spec is not None]
    names = [name for name, _ in named]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SortpackError(f"--measure/--cap {twice[0]}: the measure is given twice", collective=True)
    return tuple(named)


def make_analyze(kw: dict) -> AnalyzeOptions:
    """Return the AnalyzeOptions of the analyze options in ``kw`` (its fine-tuning shape from the options that name
    one; every rank parses the same arguments, so every rank raises the same error)."""
    from ..stages.analyze import AnalyzeOptions

    train_on = tuple(r.strip() for r in kw["train_on"].split(",")) if kw.get("train_on") else None
    shape = None
    named = ("labels_column", "prompt_column", "completion_column", "chat_template", "eos_token", "pair_encoding")
    try:
        if train_on is not None or any(kw.get(k) is not None for k in named):  # a plain run loads no shape
            from ..inputs.finetune import fine_tune_shape

            shape = fine_tune_shape(kw["column"], kw.get("labels_column"), kw.get("prompt_column"),
                                    kw.get("completion_column"), kw.get("chat_template"), train_on,
                                    eos_token=kw.get("eos_token"), pair_encoding=kw.get("pair_encoding"))
    except SortpackError as exc:
        raise SortpackError(str(exc), collective=True) from None
    size2 = kw.get("size2_spec") or ()
    return AnalyzeOptions(column=kw["column"], size=kw["size_spec"], difficulty=kw["difficulty_spec"],
                          tokenizer=kw["tokenizer"], input_format=kw["input_format"],
                          special_tokens=kw["special_tokens"], split=kw["split"],
                          size2=size2[0] if size2 else None, sizes=tuple(size2[1:]), measures=_measures(kw),
                          shape=shape)


def make_sort(kw: dict) -> SortOptions:
    """Return the SortOptions of the sort options in ``kw``."""
    from ..stages.sort import SortOptions

    return SortOptions(key=kw["key"], descending=kw["descending"], stages=kw["stages"])


def _pack_caps(kw: dict) -> tuple[int, tuple[tuple[str, int], ...]]:
    """Return (``--max-size2``'s first N, the other caps) of ``kw``, refusing on every rank what the command line
    already shows wrong: a cap of a measure no option of this command makes (``run``), a SPEC to measure
    where nothing is measured (``pack``)."""
    from ..inputs.measures import size_name
    from ..stages.caps import size2_caps

    caps = _caps(kw)
    sized = size2_caps(kw.get("max_size2") or ())
    first = dict(sized).get("size2", 0)
    named = [(c.name, c.limit) for c in caps]
    try:
        if "size2_spec" in kw:  # run: every measure is made here, so every name must be
            made = {size_name(k) for k in range(len(kw["size2_spec"]))} | {name for name, _ in _measures(kw)}
            given = len(kw.get("max_size2") or ())
            if given > len(kw["size2_spec"]):
                raise SortpackError(f"{given} --max-size2 for {len(kw['size2_spec'])} --size2: the k-th --max-size2 "
                                    "caps the k-th --size2 SPEC")
            enc = [kw.get("encoder_patches"), (kw.get("encoder_attention") or "").partition("full:")[2] or None]
            for name in [n for n, _ in named] + [e for e in enc if e]:
                if name not in made:
                    raise SortpackError(f"--cap/--encoder-* {name}: no option measures {name!r} (give --cap "
                                        f"{name}=SPEC:N or --measure {name}=SPEC)")
        else:
            spec = next((c for c in caps if c.spec is not None), None)
            if spec is not None:
                raise SortpackError(f"--cap {spec.name}={spec.spec}:{spec.limit}: pack caps the measures of its "
                                    f"sorted input (--cap {spec.name}={spec.limit}); SPECs are measured by analyze "
                                    "or run")
    except SortpackError as exc:
        raise SortpackError(str(exc), collective=True) from None
    return first, tuple((n, c) for n, c in sized if n != "size2") + tuple(named)


def make_pack(kw: dict) -> PackOptions:
    """Return the PackOptions of the pack options in ``kw``."""
    from ..stages.pack import SEGMENT_SIZE, PackOptions

    max_size2, caps = _pack_caps(kw)
    return PackOptions(max_tokens=kw["max_tokens"], budget=kw["budget"], max_samples=kw["max_samples"],
                       batch_multiple=kw["batch_multiple"], quadratic_scale=kw["quadratic_scale"],
                       pad_to_multiple=kw["pad_to_multiple"], shapes=kw["shapes"][0], group_size=kw["group_size"],
                       same_shape=kw["same_shape"], oversize=kw["oversize"],
                       segment_size=kw["segment_size"] or SEGMENT_SIZE, rows=kw["rows"],
                       rows_per_microbatch=kw["rows_per_microbatch"], max_segments=kw["max_segments"],
                       auto_shapes=kw["shapes"][1], static_shapes=kw["static_shapes"],
                       keep_empty=kw["keep_empty"], max_size2=max_size2, caps=caps, cap_fit=kw["cap_fit"],
                       balance=kw["balance"], cost_coeff=kw["cost_coeff"], encoder_patches=kw["encoder_patches"],
                       encoder_attention=kw["encoder_attention"], encoder_coeff=kw["encoder_coeff"])


def make_store(kw: dict) -> StoreOptions | None:
    """Return the StoreOptions of --store, --store-tokens, --memory-limit (popped from ``kw``) and the tokenizer; None
    where none of them is given (what ``StoreOptions()`` would say: nothing stored, and no store code loaded)."""
    given = {name: kw.pop(name, None) for name in ("store_columns", "store_tokens", "memory_limit", "store_tokenizer",
                                                  "store_chat_template")}
    if not any(given.values()):
        return None
    from ..write.store import StoreOptions, parse_memory, parse_store

    return StoreOptions(columns=parse_store(given["store_columns"]), tokens=given["store_tokens"],
                        memory_limit=parse_memory(given["memory_limit"]), tokenizer=given["store_tokenizer"],
                        chat_template=given["store_chat_template"])


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
