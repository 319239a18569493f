"""``PlanLoader``: fetch and collate a sampler's micro-batches ahead of the loop, in one background thread.

With stored data a micro-batch's fetch is one zero-copy Arrow slice and its collate one
compiled pass over its tokens: tens of microseconds. DataLoader worker processes then cost
more than the work: every batch is pickled through a pipe and unpickled in the main
process. One thread in the training process needs no pickling; it prepares batches while the
training step's torch kernels release the GIL, at most ``prefetch`` ahead.

Handing a batch from one thread to another costs a thread switch (a futex wake, the GIL
changing hands): more than the batch's own work on a busy machine. So the two threads share
the work instead of passing every batch: whichever holds the *work lock* takes the
sampler's next micro-batch and prepares it. The loop takes a batch the thread prepared when
one is ready; when none is and the thread is not in the middle of one, it prepares the next
itself, at once, instead of waking the thread and waiting for it. The thread runs whenever
the loop lets go of the GIL (a CUDA synchronisation, a large torch kernel) and fills the
queue to ``prefetch``; it is woken only when the loop has taken the queue down to half.
Batches come out in the sampler's order either way (one lock orders them), and the resume
state stays exact: the loader reports each batch to the sampler (``sampler.consume``) when
it hands it to the loop, never when it was prepared, so ``sampler.state_dict()`` counts
what the loop received.
"""
from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator

try:
    import resource

    _RUSAGE_THREAD: int | None = resource.RUSAGE_THREAD  # Linux
except (ImportError, AttributeError):
    _RUSAGE_THREAD = None

_END = object()
_BUSY = 0.001  # seconds the thread sleeps while the loop prepares a batch itself
# a loop away this long wants the thread even when a batch takes longer to prepare (a slow read
# that lets go of the GIL overlaps with any step of a millisecond or more)
_AWAY = 0.001


def _usage() -> tuple[int, float]:
    """Return the calling thread's voluntary context switches (its waits) and CPU seconds ((0, 0.0) where unknown).

    Where unknown (not Linux) every long absence counts as time the thread could use, as it did.
    """
    if _RUSAGE_THREAD is None:
        return 0, 0.0
    got = resource.getrusage(_RUSAGE_THREAD)
    return got.ru_nvcsw, got.ru_utime + got.ru_stime


class _Failure:
    """An exception raised while preparing a batch, handed to the loop to raise there, in order."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class _Pass:
    """A running pass over the epoch: the batches prepared ahead, the work lock, and the thread that helps."""

    def __init__(self, loader: PlanLoader, it: Iterator):
        self.it, self.fetch = it, loader._fetcher()
        self.ready: deque = deque()  # (micro-batch, batch), a _Failure or _END, in the sampler's order
        self.work = threading.Lock()  # held while taking the next micro-batch and preparing it
        self.room = threading.Condition(threading.Lock())  # the thread waits here while `ready` is full
        self.waiting = False  # the thread waits (set before it looks at the queue and `wanted` again)
        # the thread prepares only while the loop is away from it longer than a batch takes to prepare
        # (or _AWAY): then the two overlap; a loop that comes straight back prepares its own, switch-free
        self.wanted = False
        self.cost = float("inf")  # seconds the latest batch took to prepare (unknown before the first)
        self.back = time.perf_counter()  # when the loop last received a batch
        # the loop thread's (waits, CPU seconds) by then; taken only after an absence long enough to want the
        # thread (a loop that comes straight back pays no getrusage per batch), None: not taken
        self.usage: tuple[int, float] | None = None
        self.done = False  # the sampler's epoch is over (or failed): nothing more to prepare
        self.stop = False
        self.cap = loader.prefetch
        self.low = loader.prefetch // 2  # the thread is woken when the queue is down to this
        # started the first time the loop is away long enough to want it: a loop that never is (it comes
        # straight back) pays no thread start and join per epoch, each a thread switch on a busy machine
        self.thread = threading.Thread(target=self._help, name="sortpack-PlanLoader", daemon=True)
        self.started = False

    def prepare(self):
        """Return the next item: (micro-batch, batch), a ``_Failure``, or ``_END`` (call with ``work`` held)."""
        if self.done:
            return _END
        try:
            mb = next(self.it)
        except StopIteration:
            self.done = True
            return _END
        except BaseException as exc:  # raised again in the loop's thread
            self.done = True
            return _Failure(exc)
        try:
            start = time.perf_counter()
            batch = self.fetch(mb)
            self.cost = time.perf_counter() - start
            return mb, batch
        except BaseException as exc:
            self.done = True
            return _Failure(exc)

    def _help(self) -> None:
        """The thread: prepare batches ahead of the loop while it is wanted and there is room, until the end or stop."""
        ready, room = self.ready, self.room
        while not self.stop and not self.done:
            if len(ready) >= self.cap or not self.wanted:
                with room:
                    self.waiting = True  # before looking again: a take that follows sees it and wakes us
                    while (len(ready) >= self.cap or not self.wanted) and not self.stop:
                        room.wait(0.1)
                    self.waiting = False
                continue
            # never wait on the lock: a thread woken with it but without the GIL would make the loop wait
            # for the thread at every batch (a lock convoy); the loop holds it only while preparing one
            if not self.work.acquire(blocking=False):
                time.sleep(_BUSY)
                continue
            try:
                if not (self.stop or self.done):
                    ready.append(self.prepare())
            finally:
                self.work.release()

    def take(self):
        """Return the next item for the loop: a prepared one, or one prepared here when none is."""
        ready = self.ready
        away = time.perf_counter() - self.back
        long = wanted = away > min(self.cost, _AWAY) and self.cost != float("inf")  # not before the first batch
        if wanted and _RUSAGE_THREAD is not None:
            # a loop that was only preempted (a busy machine: it neither waited nor ran) gains nothing from
            # a second thread that needs the same cores and the GIL: it keeps preparing its own batches.
            # The first long absence after short ones has no usage to compare with: the loop prepares that one
            usage = self.usage
            if usage is None:
                wanted = False
            else:
                waits, cpu = _usage()
                wanted = waits != usage[0] or cpu - usage[1] > away / 2
        self.wanted = wanted
        if wanted and not self.started and not self.done:
            self.started = True
            self.thread.start()
        item = None
        if not self.started:  # no thread yet: nobody else prepares, no lock to take
            item = self.prepare()
        while item is None:
            if ready:
                item = ready.popleft()
            else:
                with self.work:  # waits only while the thread is in the middle of the next batch
                    if not ready:
                        item = self.prepare()
        if wanted and self.waiting and len(ready) <= self.low:
            with self.room:
                self.room.notify()
        self.back = time.perf_counter()
        self.usage = _usage() if long else None
        return item

    def halt(self) -> None:
        """Stop the thread and wait for it (it finishes the batch it is preparing, if any)."""
        self.stop = True
        if self.thread.is_alive():
            with self.room:
                self.room.notify()
            self.thread.join()


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
    """Iterate collated micro-batches of ``sampler`` over ``dataset``, prepared ahead in a thread while the loop trains.

    The thread prepares batches while the loop is away longer than a batch takes (a training
    step that lets go of the GIL), at most ``prefetch`` ahead; a loop that comes straight back
    prepares its next batch itself rather than pay a thread switch for it. A drop-in for
    ``DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn)`` in a training loop:
    same batches in the same order, ``len()``, ``set_epoch``, ``state_dict``/``load_state_dict``
    (the sampler's). Each batch is reported to the sampler
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

    Examples
    --------
    Rank 0 of 2 over ``plan/`` (``PackedIndex``'s example); a ``collate_fn`` such as
    ``pad_collate(...)`` would turn each micro-batch's rows into tensors:

    >>> from sortpack.torch import PackedBatchSampler, PlanLoader, SourceDataset
    >>> loader = PlanLoader(SourceDataset("plan/"), PackedBatchSampler("plan/", rank=0, world_size=2))
    >>> len(loader)
    3
    >>> [[row["text"] for row in batch] for batch in loader][1]
    ['abcdefghi', 'abcdefghij']
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
    def _fetcher(self):
        """Return the function that turns a micro-batch into its batch: fetch, collate, pin (looked up once)."""
        dataset, collate, pin = self.dataset, self.collate_fn, self.pin_memory
        getitems = getattr(dataset, "__getitems__", None)
        if getitems is None:
            def getitems(mb):
                return [dataset[i] for i in mb]
        if collate is None and not pin:
            return getitems
        if not pin:
            return lambda mb: collate(getitems(mb))
        return lambda mb: _pin(getitems(mb) if collate is None else collate(getitems(mb)))

    def __iter__(self) -> Iterator:
        """Yield the collated batches of the rest of the sampler's epoch."""
        self.close()
        # hand-outs to the thread must not move the resume state; the loop's receipt does
        self.sampler.track_steps = True
        run = self._pass = _Pass(self, iter(self.sampler))  # here, not in the thread: a finished epoch rolls over now
        return self._receive(run)

    def _receive(self, run: _Pass) -> Iterator:
        try:
            consume = self.sampler.consume
            while True:
                item = run.take()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                mb, batch = item
                consume(mb)
                yield batch
        finally:
            self._stop(run)

    def close(self) -> None:
        """Stop the running pass's thread (a new ``iter()``, ``set_epoch`` and ``load_state_dict`` do)."""
        if self._pass is not None:
            self._stop(self._pass)

    def _stop(self, run: _Pass) -> None:
        run.halt()
        if self._pass is run:
            self._pass = None
