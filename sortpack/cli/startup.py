"""What the CLI sets up before a job: one thread per rank, Arrow's pools, no pandas behind pyarrow, no UCX memory
hooks on one node, no garbage collection while it loads, and the memory a job frees kept for its next arrays."""
from __future__ import annotations

import ctypes
import gc
import os
import sys

from ..env import env_text
from ..launcher import on_one_node

# One thread per rank is the HPC norm (ranks = cores); set before numpy loads BLAS.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Keep the memory a job frees for its next arrays instead of handing it back (glibc), where
    ``SORTPACK_KEEP_MEMORY=1`` asks for it; return whether it is set.

    glibc serves every array above 32 MiB with a fresh ``mmap`` and unmaps it when freed, so an
    array made after another is freed faults in fresh pages (zeroed by the kernel: 1-2 s of
    system time per GB on some virtual machines). Served from the heap and never trimmed, a
    freed array's pages serve the next one; but the heap then only grows, and where a freed
    hole is too small for the next array the process's peak memory rises (two ranks of 62.5M
    samples: 2.1 GB on one rank instead of 1.6), so it is off unless asked for.
    """
    if env_text("SORTPACK_KEEP_MEMORY") != "1" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):  # no mallopt there
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # no mmap'ed chunks: large arrays come from the heap (glibc falls back to mmap if the heap cannot grow)
    if not mallopt(_M_MMAP_MAX, 0):
        return False
    mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # the largest the int allows: the heap's top is never returned
    return True


def skip_memory_hooks() -> bool:
    """Start MPI without UCX's memory hooks (``UCX_MEM_EVENTS=no``) where the job runs on one node, unless
    ``UCX_MEM_EVENTS`` is set; return whether this call set it.

    An MPI built on UCX (the pip ``mpich`` wheel, Open MPI's UCX layer) patches the process's
    memory functions when it starts: about 40 ms of CPU per rank here, a sixth of start-up. The
    hooks tell UCX's caches of registered memory (network RDMA) that memory was freed; without
    them UCX keeps no such cache and registers a buffer per transfer. Ranks on one node talk
    through MPI's shared memory, so only jobs over several nodes (or whose launcher does not
    say) keep the hooks.
    """
    if os.environ.get("UCX_MEM_EVENTS", "").strip() or not on_one_node():  # set empty: unset, as a shell clears it
        return False
    os.environ["UCX_MEM_EVENTS"] = "no"
    return True


_gc_paused = False  # pause_gc switched the collector off: resume_gc switches it back on


def pause_gc() -> None:
    """Switch Python's cyclic garbage collector off while the command line loads its libraries (if it is on).

    Loading numpy, pyarrow, MPI and sortpack makes a few hundred thousand objects that live as
    long as the process; the collector walks them again and again while they are made, and
    every full collection of the job walks them all: about 4% of a small run's instructions.
    """
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def resume_gc() -> None:
    """Move every object made so far out of the collector's reach (``gc.freeze``) and switch it back on, where
    ``pause_gc`` switched it off: the job's own objects are collected as usual."""
    global _gc_paused
    if _gc_paused:
        gc.freeze()
        gc.enable()
        _gc_paused = False


def set_threads(threads: int) -> None:
    """Size Arrow's CPU and I/O pools to ``threads`` (0: leave the defaults)."""
    if not threads:
        return
    import pyarrow as pa

    pa.set_cpu_count(threads)
    pa.set_io_thread_count(max(threads, 1))


def tokenizer_threads(ranks_on_node: int) -> int:
    """Return the tokenizer threads per rank: the cores this rank may use shared by the node's ranks (at least 1).

    A launcher that pins ranks to cores leaves each one its own share already.
    """
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = os.cpu_count() or 1
    if mine < (os.cpu_count() or mine):
        return max(mine, 1)
    return max(mine // max(ranks_on_node, 1), 1)


def set_tokenizer_threads(ranks_on_node: int) -> None:
    """Size the tokenizers library's (Rayon) pool so ranks x threads = cores, unless ``RAYON_NUM_THREADS`` is set.

    The pool reads the variable when first used, so this runs before any tokenizer is loaded;
    ranks and tokenizer threads would otherwise compete for the same cores.
    """
    if os.environ.get("RAYON_NUM_THREADS", "").strip():
        return  # the user's choice
    os.environ["RAYON_NUM_THREADS"] = str(tokenizer_threads(ranks_on_node))


def skip_pandas(argv: list[str] | None) -> None:
    """Keep pyarrow from importing pandas, cloudpickle and dateutil in this process, unless a python: SPEC may
    want them.

    pyarrow imports pandas, when it is installed, on its first ``pa.array`` (to recognise
    pandas objects): about 0.2 s per rank, a third of a small job's fixed cost; ``cloudpickle``
    at ``import pyarrow`` (to pickle Python objects it serialises, stdlib ``pickle`` without
    it): about 8 ms of CPU; and ``dateutil`` (with ``six``) on that first array (to recognise
    ``relativedelta`` objects): about 4 ms. The CLI never hands pyarrow such objects, so
    pyarrow loads and makes its first array while they cannot be imported. pyarrow 26 still
    converts to and from pandas and ``relativedelta`` once the user imports them; a
    ``python:MODULE:FUNC`` job is left alone all the same, in case another version does not.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if "pandas" in sys.modules or any("python:" in str(a) for a in args):
        return
    if not args or {"--help", "-h", "--version"} & set(map(str, args)):  # no job: do not load pyarrow for it
        return
    blocker = _Unimportable(("pandas", "cloudpickle", "dateutil"))
    sys.meta_path.insert(0, blocker)
    try:
        import pyarrow as pa

        pa.array([0])  # pyarrow's pandas shim tries pandas now and remembers the answer
    finally:
        sys.meta_path.remove(blocker)  # the user's own code can still import them


class _Unimportable:
    """A meta path finder under which ``import NAME`` of the given packages fails, as if they were not installed."""

    def __init__(self, names: tuple[str, ...]):
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        """Raise ModuleNotFoundError for the packages (and their modules); return None (not found here) otherwise."""
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
