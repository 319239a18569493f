"""What a sampler hands out: ``MicroBatch`` (ids, shape, place in the step), ``Samples`` (its items), ``step_info``.

Collate functions, datasets, the LR schedule and the goodput controller read a micro-batch's
shape and step from these records; they need nothing else of the sampler.
"""
from __future__ import annotations


class MicroBatch(list):
    """The sample ids of one micro-batch (a list) with its shape and its place in the epoch.

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
    epoch, position, step : int
        The epoch, the flat position where this micro-batch's step starts, and the step's
        number in the epoch.
    end : int, optional
        The flat position after the step (default ``position``).
    last : bool
        Whether this is this rank's last micro-batch of the step (the optimizer step follows).
    step_batch, step_tokens : int
        Samples and tokens of the whole step over all ranks (what the LR scales by; repeated
        micro-batches count as often as the loop trains on them). ``step_samples`` is
        ``step_batch`` by its other name.
    world_size : int
        Data-parallel ranks W of the step (``sortpack.torch.step_loss`` scales by it).
    tokens : int
        Real tokens of this micro-batch in the plan (the sum of its samples' sizes).
    repeat : bool
        Whether it repeats a micro-batch to fill a step (tail padding or warm-up copy):
        train on it, skip it when evaluating.
    run_step : int, optional
        The step in the run's numbering, ``epoch * steps_per_epoch + step`` (default ``step``):
        the number ``skip_steps`` and ``sortpack inspect --step`` use.
    source : str, optional
        The name of the source its samples come from (a mixture plan; None otherwise).
    """

    def __init__(self, ids, microbatch: int = -1, batch_size: int | None = None,
                 padded_size: int | None = None, row_splits=None, epoch: int = 0, position: int = 0,
                 *, step: int = 0, end: int | None = None, last: bool = True, step_batch: int = 0,
                 step_tokens: int = 0, repeat: bool = False, run_step: int | None = None,
                 source: str | None = None, world_size: int = 1, tokens: int = 0):
        super().__init__(ids)
        self.microbatch = microbatch
        self.batch_size = len(self) if batch_size is None else batch_size
        self.padded_size = padded_size
        self.row_splits = row_splits
        self.epoch = epoch
        self.position = position
        self.step = step
        self.end = position if end is None else end
        self.last = last
        self.step_batch = step_batch
        self.step_tokens = step_tokens
        self.repeat = repeat
        self.run_step = step if run_step is None else run_step
        self.source = source
        self.world_size = world_size
        self.tokens = tokens

    @property
    def step_samples(self) -> int:
        """Return the samples of the whole step over all ranks (``step_batch``)."""
        return self.step_batch

    def info(self) -> dict:
        """Return the micro-batch's place and step as a dict of plain ints and bools (collate passes it on).

        A mixture plan's micro-batch also has ``source`` (its source's name), so a loop can log per source.
        """
        out: dict = {"microbatch": int(self.microbatch), "epoch": int(self.epoch), "step": int(self.step),
                     "position": int(self.position), "end": int(self.end), "last": bool(self.last),
                     "step_batch": int(self.step_batch), "step_tokens": int(self.step_tokens),
                     "step_samples": int(self.step_batch), "world_size": int(self.world_size),
                     "tokens": int(self.tokens), "num_samples": len(self), "repeat": bool(self.repeat),
                     "run_step": int(self.run_step)}
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
    """

    def __init__(self, items, microbatch: MicroBatch | None = None, table=None, token_ranges=None):
        super().__init__(items)
        self.microbatch = microbatch
        self.table = table
        # --oversize split under --size tokens: each item's (begin, end) in its text's token ids,
        # which the collate helpers apply after tokenize (a text cannot be cut by tokens before)
        self.token_ranges = token_ranges


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
        return int(batch.epoch), int(batch.position), int(batch.end), int(batch.step), bool(batch.last)
    info = step_info(batch)
    return int(info["epoch"]), int(info["position"]), int(info["end"]), int(info["step"]), bool(info["last"])
