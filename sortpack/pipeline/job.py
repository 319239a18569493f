"""The skeleton every job shares: options checked together, the store prepared, the output opened, stages timed,
and whatever the job opened dropped when it fails.

A job (``pipeline.dataset``, ``pipeline.mixture``) reads as::

    check_options(comm, sopts.validate, popts.validate, split_check(recorded))
    store_fn = store_for(comm, store, recorded, tokenizer)
    with job_scope(comm, output, overwrite, inputs) as scope:
        ... its stages, timed by scope.prof, writing into scope.out ...
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ..errors import SortpackError
from ..parallel import Comm
from ..stages.pack import PackOptions
from ..stages.plan_options import PlanOptions
from ..stages.sort import SortOptions
from ..write.output import NestedOutput, OutputDir
from ..write.provenance import JobInfo, Profile

if TYPE_CHECKING:
    from ..write.store import Store, StoreOptions

__all__ = ["HoldoutRequest", "JobOutput", "JobScope", "PlanJob", "check_options", "job_scope", "nested_plan",
           "split_check", "store_for"]


class HoldoutRequest(NamedTuple):
    """``--holdout N|FRACTION`` and ``--holdout-seed`` as parsed (``stages.holdout.parse_holdout``).

    ``value`` None: a mixture's seed alone (MIX.json says what each source holds out);
    ``seed`` None: MIX.json's ``holdout_seed``, else ``stages.holdout.DEFAULT_SEED``.
    """

    value: int | float | None
    seed: int | None = None


class JobOutput(NamedTuple):
    """What a job writes and where: the directory (an existing one replaced only with ``overwrite``), the
    provenance it records, whether rank 0 shows progress, and what a plan writes beside its index.

    ``store`` (--store): the data shards; ``holdout`` (--holdout): the held-out plan in
    ``OUTPUT/holdout``; ``keep_intermediate`` (``run``): OUTPUT.metrics and OUTPUT.sorted too.
    """

    path: str
    info: JobInfo
    overwrite: bool = False
    progress: bool = False
    store: StoreOptions | None = None
    holdout: HoldoutRequest | None = None
    keep_intermediate: bool = False


def split_check(recorded: PlanOptions, own_column: str | None = None,
                tokenizer: str | None = None, labels_read: bool = False) -> Callable[[], None] | None:
    """Return the check that ``--oversize split`` can cut the plan ``recorded`` measures and packs (None: no split).

    ``own_column``: a mixture's source that reads a column of its own; ``tokenizer``: the
    ``--tokenizer`` file of a plan not measured yet (``stages.split.check_split``).
    ``labels_read``: the job reads fine-tuning data's labels before it cuts them (``run``), so it
    counts the targets of each piece or truncated sample.
    """
    popts = recorded.pack
    assert popts is not None, "split_check checks the pack options"
    fine_tune = recorded.analyze.shape is not None
    if fine_tune and popts.oversize in ("split", "truncate") and not labels_read:
        return lambda: _refuse_cut_labels(popts.oversize)
    if popts.oversize != "split":
        return None
    from ..stages.split import check_split  # --oversize split only: a plain run loads none of it

    return lambda: check_split(recorded, own_column, tokenizer)


def _refuse_cut_labels(oversize: str) -> None:
    """Refuse cutting fine-tuning samples where their labels are not read: a piece's targets would not be counted."""
    raise SortpackError(f"--oversize {oversize} of fine-tuning samples: cut them in the job that reads their labels "
                        "(sortpack run), which counts the targets of what it keeps")


def check_options(comm: Comm, *checks: Callable[[], object] | None) -> None:
    """Run each check (None: skipped) on every rank together, in order: the first refusal is one line on every rank."""
    for check in checks:
        if check is not None:
            comm.collectively(check)


def store_for(comm: Comm, store: StoreOptions | None, options: PlanOptions, tokenizer: str | None,
              renames: list[dict[str, str] | None] | None = None) -> Store | None:
    """Return the job's ``Store`` for ``--store`` (None without it), its options checked on every rank together."""
    if store is None or not store.enabled:
        return None
    from ..write.store import prepare  # --store only

    return prepare(comm, store, options, tokenizer, renames)


@dataclass
class JobScope:
    """A job's output directory and stage profile, and every output it opened (all discarded if it fails)."""

    out: OutputDir
    prof: Profile
    outputs: list[OutputDir] = field(default_factory=list)

    def also(self, output: OutputDir) -> OutputDir:
        """Return ``output``, from now on discarded with the job's own output when the job fails."""
        self.outputs.append(output)
        return output


def nested_plan(out: OutputDir, name: str) -> tuple[NestedOutput, Profile]:
    """Return a plan directory ``name`` inside the job's output (it appears with it) and a profile of its own."""
    return NestedOutput(out, name), Profile(out.comm)


@contextmanager
def job_scope(comm: Comm, output: str, overwrite: bool, inputs: list[str]) -> Iterator[JobScope]:
    """Yield the job's scope: ``output`` checked (created when first written) and a profile.

    On any failure (a signal or ^C too) every output the scope holds is discarded before the
    error goes on.
    """
    out = OutputDir(comm, output, overwrite, inputs)
    scope = JobScope(out, Profile(comm), [out])
    try:
        yield scope
    except BaseException:
        # a collective error leaves every rank here: drop the half-written directories
        for o in scope.outputs:
            o.discard()
        raise


@dataclass
class PlanJob:
    """One planning job as its stages see it: the ranks, its output scope, its options, store and provenance.

    ``sopts``: the sort's options (``pack``: the sorted directory's, as recorded).
    """

    comm: Comm
    scope: JobScope
    info: JobInfo
    sopts: SortOptions
    popts: PackOptions
    store: Store | None = None
    progress: bool = False

    @property
    def out(self) -> OutputDir:
        """Return the job's output directory."""
        return self.scope.out

    @property
    def prof(self) -> Profile:
        """Return the job's stage profile."""
        return self.scope.prof
