"""The end every plan shares (``run``, ``pack``, a mixture): hold out, pack, write the held-out plan, write the index.

A job reads as::

    tail = Tail(job, key, files, holdout)
    training = tail.hold_out(ordered)    # by sample id: the held-out samples stay in the tail
    mbs = tail.pack(training, split)     # the training plan's micro-batches (a mixture blends them next)
    return tail.write(mbs, options)      # OUTPUT/holdout first, then the index; the manifest on rank 0
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..stages.pack import Microbatches, pack_samples
from ..stages.plan_options import PlanOptions
from ..stages.samples import SampleColumns
from ..write.index_writer import write_index
from ..write.plan_record import PlanRecord
from .job import PlanJob, nested_plan

if TYPE_CHECKING:
    from ..stages.holdout import Holdout

__all__ = ["Tail", "pack_check", "training_split"]


def pack_check(plan: PlanOptions) -> Callable[[], None]:
    """Return the check that packs no samples with ``plan``'s pack options and the measures it carries.

    Every refusal the pack stage decides from its options and the names of the per-sample measures
    (``--max-size2`` without ``--size2``, ``--balance targets`` of data that counts no targets)
    then comes before any work, in the pack stage's own words, not after a whole analyze.
    """
    def dry_pack() -> None:
        import numpy as np

        from ..parallel import SerialComm
        from ..progress import silenced
        from ..stages.pack import PackOptions
        from ..stages.sort import SortOptions

        none = np.zeros(0, np.int64)
        measures = {name: none for name in plan.analyze.measured()}
        with silenced():
            pack_samples(SerialComm(), SampleColumns(0, 0, none, none, none, None, [], 0, measures=measures),
                         plan.pack or PackOptions(), (plan.sort or SortOptions()).key, None)

    return dry_pack


def training_split(split: dict | None) -> dict | None:
    """Return the counts of ``--oversize split`` that the training plan records (without the held-out plan's)."""
    return None if split is None else {k: v for k, v in split.items() if k != "held"}


class Tail:
    """The shared end of a plan: ``hold_out``, ``pack``, then ``write`` (the held-out plan, then the index)."""

    def __init__(self, job: PlanJob, key: str, files: list[dict], holdout: Holdout | None):
        self.job = job
        self.key = key  # the sort key: the index's min_key/max_key
        self.files = files  # the source fingerprint both plans record
        self.holdout = holdout
        self.held: SampleColumns | None = None  # the held-out samples, once chosen
        self.held_split: dict | None = None  # what --oversize split did to them (``split["held"]``)

    def hold_out(self, ordered: SampleColumns) -> SampleColumns:
        """Return the training samples of ``ordered``; the held-out ones stay in ``self.held`` (collective).

        By sample id, before packing drops, skips or cuts anything: the same after the sort as
        before it, and a document's pieces (they share its id) stay on one side.
        """
        if self.holdout is None:
            return ordered
        from ..stages.holdout import split_holdout  # with --holdout only: a plain run loads none of it

        with self.job.prof.stage("holdout_choice"):
            ordered, self.held = split_holdout(self.job.comm, ordered, self.holdout)
        return ordered

    def pack(self, ordered: SampleColumns, split: dict | None) -> Microbatches:
        """Return the training samples' micro-batches (``split``: the training plan's counts of the split)."""
        with self.job.prof.stage("pack"):
            return pack_samples(self.job.comm, ordered, self.job.popts, self.key, split)

    def write(self, mbs: Microbatches, options: PlanOptions, extra: dict | None = None,
              to_plan: Callable[[Microbatches], Microbatches] | None = None) -> dict | None:
        """Write the held-out plan (if any) and then the index of ``mbs``; return the manifest on rank 0.

        ``options`` are the plan's recorded options, ``extra`` its own manifest keys (a
        mixture's ``mixture``); ``to_plan`` turns the held-out micro-batches into the plan's
        (a mixture's: its ``source`` column).
        """
        job = self.job
        extra = dict(extra or {})
        if self.holdout is not None and self.held is not None:
            if job.store is not None:
                job.store.also_holdout()
            with job.prof.stage("holdout"):
                extra["holdout"] = self._write_held_out(options, mbs.shapes, to_plan)
            self.held = None
        return write_index(job.comm, job.out, mbs, PlanRecord(options, self.files, job.prof, job.info, extra or None),
                           job.store)

    def _write_held_out(self, options: PlanOptions, shapes: tuple[int, ...],
                        to_plan: Callable[[Microbatches], Microbatches] | None) -> dict:
        """Pack the held-out samples and write their plan in ``OUTPUT/holdout``; return the training manifest's record.

        ``shapes`` are the lengths the training plan used (``Microbatches.shapes``); with
        ``--shapes auto:K`` the held-out plan takes them, so evaluation sees the training's
        shapes (``stages.holdout.holdout_lengths``: plus one when a held-out sample is longer
        than all). The record (every rank) carries the held-out plan's content hash.
        """
        from ..stages.holdout import DIRECTORY, holdout_lengths

        job, held, holdout = self.job, self.held, self.holdout
        assert held is not None and holdout is not None
        comm, popts = job.comm, job.popts
        nested, prof = nested_plan(job.out, DIRECTORY)
        hopts = dataclasses.replace(popts.with_shapes(shapes), auto_shapes=None)
        if popts.auto_shapes is not None and shapes:
            hopts = hopts.with_shapes(comm.collectively(holdout_lengths, comm, held.size, popts, shapes))
            # the lengths the training's --shapes auto:K chose, with one more: recorded with that request
            options = options.with_pack(dataclasses.replace(hopts, auto_shapes=popts.auto_shapes))
        with prof.stage("pack"):
            mbs: Microbatches = pack_samples(comm, held, hopts, self.key, self.held_split)
        if to_plan is not None:
            mbs = to_plan(mbs)
        record = holdout.as_dict()
        held_out = {**{k: v for k, v in record.items() if k != "directory"}, "training_plan": ".."}
        plan_record = PlanRecord(options, self.files, prof, job.info, {"held_out": held_out})
        manifest = write_index(comm, nested, mbs, plan_record, job.store)
        mine = None
        if manifest is not None:  # rank 0
            mine = {"content_hash": manifest["content_hash"], "num_microbatches": manifest["num_microbatches"],
                    "packed_samples": manifest["num_samples"]}
            if manifest["stats"].get("empty_dropped"):
                # held out by id before packing: the empty ones among them are dropped (recorded
                # only when some are, so other plans keep their hash)
                mine["empty_dropped"] = manifest["stats"]["empty_dropped"]
        return {**record, **comm.bcast_obj(mine)}
