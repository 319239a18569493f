"""A TRL-style per-batch packer: ``PackingCollator`` packs the examples of the batch it is given into rows of at most
``seq_length`` tokens (best fit decreasing, as TRL's ``pack_dataset(strategy="bfd")`` packs a dataset), through
``plan_batch``, and lays the rows out with ``varlen_collate``: a padding-free batch, every document once."""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import SortpackError
from .plan import plan_batch


class PackingCollator:
    """Collate a list of examples (``{"input_ids": [...]}``, optionally ``labels``) into rows of ``seq_length`` tokens.

    Parameters
    ----------
    seq_length : int
        The row length: every row holds at most this many tokens.
    pad_token_id : int
        The id that fills each row's tail.
    on_overflow : {"error", "truncate"}
        An example longer than ``seq_length``: refused (naming it), or cut to ``seq_length``
        tokens (TRL's ``bfd`` strategy cuts too).
    key : str
        The key of the token ids in an example.

    The result is ``varlen_collate``'s batch of a rows layout: ``input_ids``, ``labels`` and
    ``position_ids`` (restarting in every document; ``.view(batch["row_shape"])`` gives the rows),
    ``cu_seqlens``, ``seq_idx``, the Hugging Face padding-free keys; ``hf_inputs(batch,
    rows=True)`` hands them to a model. ``batch["rows"]`` lists each row's example indices.
    """

    def __init__(self, seq_length: int, pad_token_id: int = 0, on_overflow: str = "error", key: str = "input_ids"):
        if isinstance(seq_length, bool) or not isinstance(seq_length, numbers.Integral) or seq_length < 1:
            raise SortpackError(f"PackingCollator: seq_length={seq_length!r}: expected an integer >= 1")
        if on_overflow not in ("error", "truncate"):
            raise SortpackError(f"PackingCollator: on_overflow={on_overflow!r}: expected 'error' or 'truncate'")
        self.seq_length: int = int(seq_length)
        self.pad_token_id: int = pad_token_id
        self.on_overflow: str = on_overflow
        self.key: str = key

    def rows(self, lengths) -> list[np.ndarray]:
        """Return the rows of examples of these ``lengths``: each an array of example indices."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if self.on_overflow == "truncate":
            lengths = np.minimum(lengths, self.seq_length)
        over = np.flatnonzero(lengths > self.seq_length)
        if len(over):
            raise SortpackError(f"PackingCollator: example {int(over[0])} holds {int(lengths[over[0]])} tokens, over "
                                f"seq_length={self.seq_length}; pass on_overflow='truncate' (cut to seq_length)")
        return plan_batch(lengths, world_size=1, max_tokens=self.seq_length).rank(0)

    def _cut(self, example: dict) -> dict:
        """Return ``example`` with its ids and labels cut to ``seq_length`` under ``on_overflow="truncate"``."""
        if self.on_overflow != "truncate":
            return example
        return {k: v[:self.seq_length] if k in (self.key, "labels") else v for k, v in example.items()}

    def __call__(self, examples: list[dict]) -> dict:
        """Return the padding-free batch of ``examples`` packed into rows."""
        from ..reader.collate import varlen_collate
        from ..reader.microbatch import MicroBatch, Samples

        items = [self._cut(ex) for ex in examples]
        rows = self.rows([len(ex[self.key]) for ex in items])
        order = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        splits = np.concatenate(([0], np.cumsum([len(r) for r in rows]))).tolist()
        mb = MicroBatch(order.tolist(), batch_size=len(rows), padded_size=self.seq_length, row_splits=splits)
        collate = varlen_collate(key=self.key, pad_id=self.pad_token_id,
                                 labels="labels" if items and "labels" in items[0] else None)
        batch = collate(Samples([items[i] for i in order], mb))
        batch["rows"] = [r.tolist() for r in rows]
        return batch
