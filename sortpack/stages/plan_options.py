"""The options a plan is made with, as one record: written to a manifest once, read back from it once.

A metrics directory records what analyze measured, a sorted directory that and how sort
ordered, an index all three and how pack cut. ``PlanOptions.to_manifest`` is the one place
the manifest's ``options`` object is written; ``PlanOptions.from_manifest`` the one place it
is read back (a later stage's typed options, never the dict).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .analyze import AnalyzeOptions
from .pack import PackOptions
from .samples import SampleColumns
from .sort import SortOptions


@dataclass(frozen=True)
class PlanOptions:
    """What analyze measured, how sort ordered and how pack cut a plan (None: that stage has not run yet).

    ``empty_size`` is what analyze decided rather than was told: the tokens an empty text
    measures (``analyze.empty_token_count``), recorded when it is not 0.
    """

    analyze: AnalyzeOptions
    sort: SortOptions | None = None
    pack: PackOptions | None = None
    empty_size: int = 0

    def to_manifest(self) -> dict[str, Any]:
        """Return the manifest's ``options`` object (one flat object: analyze's, then sort's, then pack's keys)."""
        out = self.analyze.as_dict()
        if self.empty_size:  # recorded only when not 0: plans that count no special tokens keep their hash
            out["empty_size"] = self.empty_size
        if self.sort is not None:
            out.update(self.sort.as_dict())
        if self.pack is not None:
            out.update(self.pack.as_dict())
        return out

    @classmethod
    def from_manifest(cls, recorded: dict[str, Any]) -> PlanOptions:
        """Return the options a manifest's ``options`` object records (``to_manifest`` gives it back unchanged).

        The tokenizer and chat template are their file names, as recorded; a difficulty that is
        the size reads back as None (the default, which records the size).
        """
        sort = None
        if "key" in recorded:
            sort = SortOptions(key=recorded["key"], descending=bool(recorded.get("descending", False)),
                               stages=int(recorded.get("stages", 1)))
        pack = _pack_options(recorded) if "max_tokens" in recorded else None
        return cls(_analyze_options(recorded), sort, pack, int(recorded.get("empty_size", 0)))

    def with_analyze(self, **changes: Any) -> PlanOptions:
        """Return a copy whose analyze options have ``changes`` (e.g. the ``column`` a split plan names)."""
        return replace(self, analyze=replace(self.analyze, **changes))

    def with_pack(self, pack: PackOptions | None) -> PlanOptions:
        """Return a copy with ``pack`` (the pack options as used, e.g. the lengths ``--shapes auto:K`` chose)."""
        return replace(self, pack=pack)


def measured_options(opts: AnalyzeOptions, samples: SampleColumns) -> PlanOptions:
    """Return the options a metrics manifest records: ``opts`` and what analyze decided (``empty_size``)."""
    return PlanOptions(opts, empty_size=samples.empty_size)


def _analyze_options(recorded: dict[str, Any]) -> AnalyzeOptions:
    """Return the analyze options a manifest records (``AnalyzeOptions.as_dict`` read back)."""
    size = recorded.get("size", "length")
    difficulty = recorded.get("difficulty")
    column = recorded.get("column")
    shape = None
    if recorded.get("fine_tune"):  # fine-tuning data only: a plain run loads none of the shapes
        from ..inputs.finetune.registry import shape_from_record

        shape = shape_from_record(recorded["fine_tune"], column)
    return AnalyzeOptions(
        column=column, size=size, difficulty=None if difficulty == size else difficulty,
        tokenizer=recorded.get("tokenizer"), input_format=recorded.get("input_format", "auto"),
        special_tokens=bool(recorded.get("special_tokens", True)), split=recorded.get("split"),
        size2=recorded.get("size2"), sizes=tuple(recorded.get("sizes") or ()),
        measures=tuple((recorded.get("measures") or {}).items()),
        shape=shape)


def _pack_options(recorded: dict[str, Any]) -> PackOptions:
    """Return the pack options a manifest records (``PackOptions.as_dict`` read back)."""
    names = {f.name for f in fields(PackOptions)} - {"shapes", "auto_shapes"}
    given = {name: recorded[name] for name in names if name in recorded}
    request = str(recorded.get("shapes_request") or "")
    auto = int(request.removeprefix("auto:")) if request.startswith("auto:") else None
    return PackOptions(**given, shapes=tuple(recorded.get("shapes") or ()), auto_shapes=auto)
