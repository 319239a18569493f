"""``sortpack export``: a plan written in the formats other training stacks read.

``export_plan`` is what the CLI calls (collective). The targets, one entry each in
``TARGETS``: ``megatron`` (``megatron_out``: ``PREFIX.bin``/``PREFIX.idx`` that megatron-core's
``IndexedDataset`` reads, every rank writing its part) and ``packed-parquet``
(``packed_parquet``: the packed rows NeMo and Megatron-Bridge read). What the plan gives, its
samples' ids in plan order, is ``plan_tokens``; the files appear whole or not at all
(``write.file_outputs``).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ...errors import SortpackError
from ...parallel import Comm

__all__ = ["TARGETS", "ExportRequest", "export_plan"]


class Target(NamedTuple):
    """One export format: the files it writes for ``-o`` and what an existing one must be to be replaced."""

    paths: Callable[[Path, bool], list[Path]]  # (-o, whether the plan has labels) -> files, in commit order
    replaceable: Callable[[Path], str | None]


def _megatron_paths(out: Path, labels: bool) -> list[Path]:
    from .megatron_out import megatron_paths

    prefix = str(out)[:-4] if str(out).endswith((".idx", ".bin")) else str(out)
    return megatron_paths(prefix, labels)


def _megatron_replaceable(path: Path) -> str | None:
    from ...format.megatron import MAGIC, prefix_of

    idx = Path(prefix_of(str(path)) + ".idx")
    try:
        with open(idx, "rb") as fh:
            ok = fh.read(len(MAGIC)) == MAGIC
    except OSError:
        ok = False
    return None if ok else f"is not part of a Megatron dataset ({idx.name} has no Megatron header)"


def _parquet_replaceable(path: Path) -> str | None:
    from .packed_parquet import is_packed_parquet

    return is_packed_parquet(path)


TARGETS: dict[str, Target] = {
    "megatron": Target(_megatron_paths, _megatron_replaceable),
    "packed-parquet": Target(lambda out, labels: [out], _parquet_replaceable),
}


class ExportRequest(NamedTuple):
    """What ``sortpack export`` asks: the plan, the format, the output, ``--overwrite`` and ``--vocab-size``."""

    plan: str
    to: str
    output: str
    overwrite: bool = False
    vocab_size: int | None = None


def export_plan(comm: Comm, request: ExportRequest) -> dict:
    """Write the index directory ``request.plan`` as ``request.to`` at ``request.output`` (collective); return what
    was written.

    One line (exit status 2) and nothing written for a plan whose token ids cannot be read,
    an existing output without ``overwrite`` (or one this export did not write), a token id
    outside ``vocab_size``, a plan that is no ``--rows`` plan for ``packed-parquet``.
    """
    from ..file_outputs import FileOutputs
    from .plan_tokens import open_plan

    plan, to, output, overwrite, vocab_size = request
    target = TARGETS.get(to)
    if target is None:
        raise SortpackError(f"--to {to}: unknown export format (formats: {', '.join(TARGETS)})", collective=True)
    if vocab_size is not None and (to != "megatron" or vocab_size <= 0):
        raise SortpackError("--vocab-size: a positive count, for --to megatron", collective=True)
    if not output or output.endswith(("/", os.sep)) or Path(output).name in ("", ".", ".."):
        raise SortpackError(f"-o {output!r}: names no file to write (give a path such as out/corpus)", collective=True)
    source = comm.collectively(open_plan, plan)
    if to == "packed-parquet":
        from .packed_parquet import check_rows

        comm.collectively(check_rows, source)
    out = FileOutputs(comm, target.paths(Path(output), source.labels is not None), overwrite, target.replaceable,
                      inside=(Path(plan),))
    try:
        if to == "megatron":
            from .megatron_out import write_megatron

            summary = write_megatron(comm, source, out, vocab_size)
        else:
            from .packed_parquet import write_packed_parquet

            summary = write_packed_parquet(comm, source, out.temp(out.paths[0]))
        comm.collectively(source.inputs_unchanged)  # the inputs' digests, checked beside the writes
        out.commit()
    except BaseException:
        out.discard()
        raise
    return {**summary, "files": [str(p) for p in out.paths]}
