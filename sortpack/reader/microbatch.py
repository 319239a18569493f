"""What a sampler hands out: ``MicroBatch`` (ids, shape, its ``StepFacts``), ``Samples`` (its items), ``step_info``.

Collate functions, datasets, the LR schedule and the goodput controller read a micro-batch's
shape and step from these records; they need nothing else of the sampler.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class StepFacts(NamedTuple):
    """The facts of one optimizer step that every micro-batch of it shares (built once per step, immutable).

    Parameters
    ----------
    epoch, step : int
        The epoch and the step's number in it.
    position, end : int
        The flat positions where the step starts and where the next one starts.
    run_step : int
        The step in the run's numbering, ``epoch * steps_per_epoch + step``: the number
        ``skip_steps`` and ``sortpack inspect --step`` use.
    step_batch, step_tokens : int
        Samples and tokens of the whole step over all ranks (what the LR scales by; repeated
        micro-batches count as often as the loop trains on them).
    world_size : int
        Data-parallel ranks W of the step (``sortpack.torch.step_loss`` scales by it).
    step_attention : int
        Attention work of the whole step over all ranks (the index's ``attention``: sum of s^2
        per document, ``batch_size * padded_size^2`` for a padded micro-batch): for MFU logging.
    step_targets : int
        Loss targets of the whole step over all ranks (the index's ``targets``; a plan without
        that column: ``step_tokens - step_batch``, every token but each document's first).
    """

    epoch: int = 0
    step: int = 0
    position: int = 0
    end: int = 0
    run_step: int = 0
    step_batch: int = 0
    step_tokens: int = 0
    world_size: int = 1
    step_attention: int = 0
    step_targets: int = 0

    def info(self) -> dict:
        """Return the facts as a new dict of plain ints (the step's part of ``MicroBatch.info()``)."""
        return dict(zip(self._fields, map(int, self)))


_NO_STEP = StepFacts()


class MicroBatch(list):
    """The sample ids of one micro-batch (a list) with its shape and its place in the epoch.

    The step's facts (``epoch``, ``step``, ``position``, ``end``, ``run_step``,
    ``step_batch``, ``step_tokens``, ``world_size``) are read-only attributes that come from
    its ``StepFacts``, one record shared by the step's micro-batches.

    Parameters
    ----------
    ids : iterable of int
        The sample ids.
    microbatch : int
        The micro-batch number in the index (-1: not from an index).
    batch_size : int, optional
        Rows of the micro-batch's shape (default: ``len(ids)``); more than ``len(ids)`` in a
        same-shape group (padding slots).
    padded_size : int, optional
        Padded length of every row (None: unknown, collate uses the items' lengths).
    row_splits : list of int, optional
        Rows mode: offsets of each packed row into ``ids``.
    facts : StepFacts, optional
        The step it belongs to (default: step 0 of epoch 0, on one rank, of no samples).
    last : bool
        Whether this is this rank's last micro-batch of the step (the optimizer step follows).
    tokens : int
        Real tokens of this micro-batch in the plan (the sum of its samples' sizes).
    repeat : bool
        Whether it repeats a micro-batch to fill a step (tail padding or warm-up copy):
        train on it, skip it when evaluating.
    source : str, optional
        The name of the source its samples come from (a mixture plan; None otherwise).
    source_id : int
        That source's place in the manifest's list of sources (``PackedIndex.source_names``;
        -1: not a mixture plan's): what ``varlen_collate(source_ids=True)`` writes per token.
    attention : int
        Attention work of this micro-batch in the plan (sum of s^2 over its documents; padded:
        ``batch_size * padded_size^2``).
    targets : int
        Loss targets of this micro-batch (the index's ``targets``, else ``tokens - num_samples``).
    size2 : int, optional
        The sum of its samples' second size (``--size2``; None when the plan has none).
    measures : dict of str to int, optional
        The sums of its samples' other per-sample measures by name (``--size2``'s ``size2``, each
        ``--measure NAME=SPEC``; docs/step-costs.md), as the index holds them; ``size2`` joins them.

    Examples
    --------
    What rank 1 of 2 gets first from ``plan/`` (``PackedSampler``'s example): sample ids,
    shape, and the step it belongs to:

    >>> from sortpack.reader import MicroBatch, PackedSampler, StepFacts
    >>> mb = next(iter(PackedSampler("plan/", rank=1, world_size=2)))
    >>> list(mb), (mb.batch_size, mb.padded_size), mb.tokens
    ([3, 10, 1], (3, 8), 21)
    >>> mb.step, mb.step_batch, mb.step_tokens, mb.last, mb.repeat
    (0, 8, 36, True, False)

    One of your own (a test, a custom sampler): the step's facts are one ``StepFacts``:

    >>> mine = MicroBatch([7, 9], batch_size=4, padded_size=6, facts=StepFacts(step_batch=2, world_size=1))
    >>> mine.batch_size, mine.step_batch, mine.info()["num_samples"]
    (4, 2, 2)
    """

    _plain = False  # made by ``made``: every fact a plain int or bool already

    def __init__(self, ids, microbatch: int = -1, batch_size: int | None = None,
                 padded_size: int | None = None, row_splits=None, *, facts: StepFacts = _NO_STEP,
                 last: bool = True, tokens: int = 0, repeat: bool = False, source: str | None = None,
                 attention: int = 0, targets: int = 0, size2: int | None = None, measures: dict | None = None,
                 source_id: int = -1):
        super().__init__(ids)
        self.microbatch = microbatch
        self.batch_size = len(self) if batch_size is None else batch_size
        self.padded_size = padded_size
        self.row_splits = row_splits
        self.facts = facts
        self.last = last
        self.tokens = tokens
        self.repeat = repeat
        self.source = source
        self.attention = attention
        self.targets = targets
        self.measures = {**(measures or {}), **({} if size2 is None else {"size2": size2})} or None
        self.source_id = source_id

    @classmethod
    def made(cls, ids: list, fields: tuple) -> MicroBatch:
        """Return ``MicroBatch(ids, ...)`` of ``fields``, plain ints, built as one dict (the sampler makes one per
        micro-batch it hands out).

        ``fields`` holds the attributes ``__init__`` sets, in its order: microbatch, batch_size,
        padded_size, row_splits, facts, last, tokens, repeat, source, attention, targets, measures
        (a dict, or None for a plan without them), source_id.
        ``info()`` of a micro-batch made here needs no conversion.
        """
        (microbatch, batch_size, padded_size, row_splits, facts, last, tokens, repeat, source, attention, targets,
         measures, source_id) = fields
        made = list.__new__(cls)
        list.__init__(made, ids)
        made.__dict__ = {"microbatch": microbatch, "batch_size": batch_size, "padded_size": padded_size,
                         "row_splits": row_splits, "facts": facts, "last": last, "tokens": tokens, "repeat": repeat,
                         "source": source, "attention": attention, "targets": targets, "measures": measures,
                         "source_id": source_id, "_plain": True}
        return made

    epoch = property(lambda self: self.facts.epoch, doc="The epoch of the micro-batch's step.")
    step = property(lambda self: self.facts.step, doc="The step's number in the epoch.")
    position = property(lambda self: self.facts.position, doc="The flat position where the step starts.")
    end = property(lambda self: self.facts.end, doc="The flat position where the next step starts.")
    run_step = property(lambda self: self.facts.run_step, doc="The step in the run's numbering.")
    step_batch = property(lambda self: self.facts.step_batch, doc="Samples of the whole step over all ranks.")
    step_tokens = property(lambda self: self.facts.step_tokens, doc="Tokens of the whole step over all ranks.")
    world_size = property(lambda self: self.facts.world_size, doc="Data-parallel ranks W of the step.")
    step_attention = property(lambda self: self.facts.step_attention,
                              doc="Attention work of the whole step over all ranks.")
    step_targets = property(lambda self: self.facts.step_targets, doc="Loss targets of the whole step over all ranks.")

    @property
    def size2(self) -> int | None:
        """Return the sum of its samples' second size (``--size2``; None when the plan has none)."""
        return None if self.measures is None else self.measures.get("size2")

    def info(self) -> dict:
        """Return the micro-batch's place and step as a dict of plain ints and bools (collate passes it on).

        The step's facts (as ``StepFacts.info`` gives them) and the micro-batch's own: ``microbatch``,
        ``last``, ``tokens``, ``num_samples``, ``repeat``, ``attention``, ``targets``, the sum of each
        other measure the plan has (``size2``, each ``--measure``) under its name, and ``source``
        for a mixture plan's micro-batch (its source's name), so a loop can log per source.
        """
        (epoch, step, position, end, run_step, step_batch, step_tokens, world_size, step_attention,
         step_targets) = self.facts
        out: dict
        if self._plain:  # made by the sampler from plain ints and bools: the literal without a conversion
            out = {"epoch": epoch, "step": step, "position": position, "end": end, "run_step": run_step,
                   "step_batch": step_batch, "step_tokens": step_tokens, "world_size": world_size,
                   "microbatch": self.microbatch, "last": self.last, "tokens": self.tokens, "num_samples": len(self),
                   "repeat": self.repeat, "step_attention": step_attention, "step_targets": step_targets,
                   "attention": self.attention, "targets": self.targets}
            if self.measures is not None:
                out.update(self.measures)
            if self.source is not None:
                out["source"] = self.source
            return out
        # one literal (the collate helpers call this for every micro-batch), in the order StepFacts.info gives
        out = {"epoch": int(epoch), "step": int(step), "position": int(position), "end": int(end),
               "run_step": int(run_step), "step_batch": int(step_batch), "step_tokens": int(step_tokens),
               "world_size": int(world_size), "microbatch": int(self.microbatch), "last": bool(self.last),
               "tokens": int(self.tokens), "num_samples": len(self), "repeat": bool(self.repeat),
               "step_attention": int(step_attention), "step_targets": int(step_targets),
               "attention": int(self.attention), "targets": int(self.targets)}
        if self.measures is not None:
            out.update({name: int(value) for name, value in self.measures.items()})
        if self.source is not None:
            out["source"] = self.source
        return out


class Samples(list):
    """Dataset items of one micro-batch (a list) and the ``MicroBatch`` they came from, for collate.

    Parameters
    ----------
    items : iterable
        The dataset items, in the micro-batch's order.
    microbatch : MicroBatch, optional
        The micro-batch they were read for (None: a plain list of ids).
    table : pyarrow.Table, optional
        The same rows as one Arrow slice, when they came from an index's stored data (the
        collate helpers read stored ``input_ids`` from it without a copy per sample).
    token_ranges : tuple of numpy.ndarray, optional
        ``(begin, end)`` per item of a plan whose ``--size tokens`` samples ``--oversize split``
        cut: the collate helpers keep token ids ``[begin, end)`` of what ``tokenize`` returns.
    size_unit : str, optional
        What the plan's sizes count (its ``options.size``: ``"tokens"``, ``"length"``, ...;
        None: not known). Under ``"tokens"`` the collate helpers check that ``tokenize``
        returns the lengths the plan counted.

    ``token_cache`` (a ``tokens.TokenCache`` or None) is where the collate helpers keep the
    token ids of long documents whose pieces they cut (set by ``SourceDataset`` with
    ``token_ranges``). ``sample_ids`` (an array, or None: the micro-batch's list) and
    ``sample_ids_at`` (its data address, 0: unknown) are the ids of stored rows, which
    ``lazy_rows.TableSamples`` knows without a conversion. Together these are the
    ``samples_contract.SamplesContract`` the collate helpers read.
    """

    token_cache: Any = None
    sample_ids: Any = None
    sample_ids_at: int = 0

    def __init__(self, items, microbatch: MicroBatch | None = None, table=None, token_ranges=None,
                 size_unit: str | None = None):
        super().__init__(items)
        self.microbatch = microbatch
        self.table = table
        # --oversize split under --size tokens: each item's (begin, end) in its text's token ids,
        # which the collate helpers apply after tokenize (a text cannot be cut by tokens before)
        self.token_ranges = token_ranges
        self.size_unit = size_unit

    def has_column(self, key: str) -> bool:
        """Return whether the items came with an Arrow slice (``table``) that has a column ``key``."""
        table = self.table
        return table is not None and key in table.schema.names

    def token_view(self, key: str) -> Any:
        """Return a ``TokenView`` of column ``key`` its source holds (None here: the collates read ``table``)."""
        return None


def step_info(batch) -> dict:
    """Return the step info of what a loop received: a ``MicroBatch``, ``Samples``, a collate dict or the info."""
    if isinstance(batch, MicroBatch):
        return batch.info()
    if isinstance(batch, Samples) and batch.microbatch is not None:
        return batch.microbatch.info()
    if isinstance(batch, dict):
        if "end" in batch and "epoch" in batch:
            return batch
        if isinstance(batch.get("microbatch"), dict):
            return batch["microbatch"]
    raise TypeError("consume() needs a MicroBatch, Samples of one, or a batch from pad_collate/varlen_collate "
                    f"(with its 'microbatch' entry), not {type(batch).__name__}")



def step_place(batch) -> tuple[int, int, int, int, bool]:
    """Return (epoch, position, end, step, last) of what a loop received (as ``step_info``, without its dict)."""
    if isinstance(batch, MicroBatch):
        f = batch.facts
        return f.epoch, f.position, f.end, f.step, bool(batch.last)
    info = step_info(batch)
    return int(info["epoch"]), int(info["position"]), int(info["end"]), int(info["step"]), bool(info["last"])
