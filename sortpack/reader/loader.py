"""``PlanLoader``: fetch and collate a sampler's micro-batches in one background thread.

With stored data a micro-batch's fetch is one zero-copy Arrow slice (tens of microseconds)
and its collate a few numpy copies. DataLoader worker processes then cost more than the work:
every batch is pickled through a pipe and unpickled in the main process, and through
``DataLoader(num_workers=2)`` every fast path ties at the pipe's rate. One thread in the
training process needs no pickling; a micro-batch's fetch and collate cost tens of
microseconds of Python and one compiled pass over its tokens (which keeps the GIL: handing it
to the loop's thread for microseconds would cost a thread switch per batch), while the
training step's torch kernels release the GIL; a bounded queue keeps at most ``prefetch``
batches ahead. The resume state stays exact: the loader reports each
batch to the sampler when it hands it to the loop (``sampler.consume``), never when the
thread fetched it, so ``sampler.state_dict()`` counts what the loop received.
"""
from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

_END = object()


@dataclass
class _Pass:
    """A running pass over the epoch: the thread that fetches, its stop flag and the queue it fills."""

    thread: threading.Thread
    stop: threading.Event
    batches: queue.Queue


class _Failure:
    """An exception raised in the thread, handed to the loop to raise there."""

    def __init__(self, exc: BaseException):
        self.exc = exc


def _pin(batch):
    """Return ``batch`` with every CPU tensor in page-locked memory (dicts, lists and tuples followed)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "microbatch"):
        return type(batch)(_pin(v) for v in batch)
    return batch


class PlanLoader:
    """Iterate collated micro-batches of ``sampler`` over ``dataset``, prepared one step ahead in a thread.

    A drop-in for ``DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn)`` in a
    training loop: same batches in the same order, ``len()``, ``set_epoch``,
    ``state_dict``/``load_state_dict`` (the sampler's). Each batch is reported to the sampler
    (``sampler.consume``) as the loop receives it, so calling ``consume`` yourself is not needed
    (and harmless).

    Parameters
    ----------
    dataset : map-style dataset
        ``SourceDataset`` (stored data: one zero-copy slice per micro-batch), ``PackedDataset``
        or any dataset with ``__getitems__`` or ``__getitem__``.
    sampler : PackedSampler or PackedBatchSampler
        The rank's sampler.
    collate_fn : callable, optional
        Turns the fetched items (``Samples`` carrying their ``MicroBatch``) into a batch, e.g.
        ``pad_collate(key="input_ids")`` or ``varlen_collate(...)``; None yields the items.
    prefetch : int
        Batches prepared ahead of the loop (the queue's bound; at least 1).
    pin_memory : bool
        Put the batch's tensors in page-locked memory in the thread, so
        ``.to("cuda", non_blocking=True)`` overlaps the copy with compute (CUDA only; without
        a CUDA device it warns once and does nothing).
    """

    def __init__(self, dataset, sampler, collate_fn=None, *, prefetch: int = 4, pin_memory: bool = False):
        if not (isinstance(prefetch, int) and prefetch >= 1):
            raise ValueError(f"prefetch must be a positive integer, not {prefetch!r}")
        self.dataset, self.sampler, self.collate_fn = dataset, sampler, collate_fn
        self.prefetch = prefetch
        self.pin_memory = bool(pin_memory) and self._can_pin()
        self._pass: _Pass | None = None

    @staticmethod
    def _can_pin() -> bool:
        import torch

        if torch.cuda.is_available():
            return True
        warnings.warn("PlanLoader: pin_memory=True but no CUDA device is available; batches are not pinned",
                      stacklevel=3)
        return False

    # --- the DataLoader surface ----------------------------------------------------------------
    def __len__(self) -> int:
        """Return the micro-batches this rank has left in the epoch (the sampler's length)."""
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` of the sampler (see ``PackedSampler.set_epoch``)."""
        self.close()
        self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict:
        """Return the sampler's resume state: the step after the last one the loop received."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (the sampler's)."""
        self.close()
        self.sampler.load_state_dict(state)

    # --- iteration -----------------------------------------------------------------------------------
    def _fetch(self, mb):
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(mb) if getitems is not None else [self.dataset[i] for i in mb]
        batch = items if self.collate_fn is None else self.collate_fn(items)
        return _pin(batch) if self.pin_memory else batch

    def _work(self, it, q: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for mb in it:
                if stop.is_set() or not put((mb, self._fetch(mb))):
                    return
            put(_END)
        except BaseException as exc:  # raised again in the loop's thread
            put(_Failure(exc))

    def __iter__(self) -> Iterator:
        """Yield the collated batches of the rest of the sampler's epoch."""
        self.close()
        # hand-outs to the thread must not move the resume state; the loop's receipt does
        self.sampler.track_steps = True
        it = iter(self.sampler)  # here, not in the thread: a finished epoch rolls over now
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        thread = threading.Thread(target=self._work, args=(it, q, stop), name="sortpack-PlanLoader", daemon=True)
        run = self._pass = _Pass(thread, stop, q)
        thread.start()
        return self._receive(run)

    def _receive(self, run: _Pass) -> Iterator:
        try:
            while True:
                item = run.batches.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                mb, batch = item
                self.sampler.consume(mb)
                yield batch
        finally:
            self._stop(run)

    def close(self) -> None:
        """Stop the running pass's thread (a new ``iter()``, ``set_epoch`` and ``load_state_dict`` do)."""
        if self._pass is not None:
            self._stop(self._pass)

    def _stop(self, run: _Pass) -> None:
        run.stop.set()
        while run.thread.is_alive():
            try:  # make room so a blocked put sees the stop
                run.batches.get_nowait()
            except queue.Empty:
                run.thread.join(timeout=0.05)
        if self._pass is run:
            self._pass = None
