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

from ..errors import SortpackError
from ..parallel import Comm
from ..stages.holdout import Holdout, split_holdout
from ..stages.pack import Microbatches, PackOptions, pack_samples
from ..stages.plan_options import PlanOptions
from ..stages.samples import SampleColumns
from ..stages.split import check_split
from ..write.output import NestedOutput, OutputDir
from ..write.provenance import Profile
from ..write.store import Store, StoreOptions, prepare

__all__ = ["JobScope", "check_options", "job_scope", "nested_plan", "split_check", "store_for", "training_split"]


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
    fine_tune = recorded.analyze.fine_tune() is not None
    if fine_tune and popts.oversize in ("split", "truncate") and not labels_read:
        return lambda: _refuse_cut_labels(popts.oversize)
    if popts.oversize != "split":
        return None
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


def hold_out_and_pack(comm: Comm, prof: Profile, ordered: SampleColumns, plan: Holdout | None, popts: PackOptions,
                      key: str, split: dict | None) -> tuple[SampleColumns, SampleColumns | None, Microbatches]:
    """Return (the training samples, the held-out ones or None, the training samples' micro-batches)."""
    held = None
    if plan is not None:
        # by sample id, before packing drops, skips or cuts anything: the same after the sort as
        # before it, and a document's pieces (they share its id) stay on one side
        with prof.stage("holdout_choice"):
            ordered, held = split_holdout(comm, ordered, plan)
    with prof.stage("pack"):
        # the split's counts of the training plan's documents (``split["held"]``: the held-out plan's)
        mbs = pack_samples(comm, ordered, popts, key, training_split(split))
    return ordered, held, mbs


def training_split(split: dict | None) -> dict | None:
    """Return the counts of ``--oversize split`` that the training plan records (without the held-out plan's)."""
    return None if split is None else {k: v for k, v in split.items() if k != "held"}
