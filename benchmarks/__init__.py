"""sortpack benchmark suite: ``python -m benchmarks --scale small|full [--ranks 1,2] [--only NAME]``.

Every figure is printed next to a baseline measured in the same run, so ratios stay
meaningful on any machine. See ``benchmarks/README.md``.
"""

import sys as _sys


def _only_this_checkout() -> None:
    """Drop editable-install finders of sortpack, so no module is imported from another checkout.

    With sortpack installed editable elsewhere, a module missing here (say a reader not
    merged yet) would silently come from that other tree and be benchmarked as ours.
    """
    _sys.meta_path[:] = [f for f in _sys.meta_path
                         if not getattr(f, "__module__", "").startswith("__editable___sortpack")]


_only_this_checkout()
