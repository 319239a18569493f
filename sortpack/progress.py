"""Progress bars: tqdm on rank 0 when attached to a terminal, silent otherwise."""
from __future__ import annotations

import sys
from typing import Iterable, TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], enabled: bool, **kwargs) -> Iterable[T]:
    """Return ``items`` wrapped in a tqdm bar when ``enabled`` and stderr is a terminal."""
    if not enabled or not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, file=sys.stderr, leave=False, **kwargs)
