"""Two budgets (``--size2 SPEC --max-size2 N``): the order that lets every micro-batch fill both caps alike.

A vision-language sample has text tokens and image patches, a speech sample decoder tokens and
encoder frames. Packed in size order, runs of text-heavy samples fill the token cap with few
patches and runs of image-heavy ones the patch cap with few tokens: the cap that does not bind
varies from micro-batch to micro-batch, and so does each rank's work in a step. Under
``--budget tokens`` (varlen: the order costs no padding) each packing piece is first put in an
order whose every window holds both kinds of sample in the piece's own proportion; the two-cap
greedy then closes each micro-batch when either cap is full, so every micro-batch is about as
full as the piece allows in both measures.

The order: a sample's *lean* is ``size2 * cap1 - size * cap2`` (positive: it fills the second cap
faster than the first). The samples that lean one way, in increasing lean, are spread over the
piece in proportion to their cumulative lean (the normalised midpoint of each sample's share),
the samples that lean the other way likewise, and the two streams are merged by that position:
any run of the merged order has the two kinds' leans in balance, up to the largest lean of one
sample in it. Integer arithmetic throughout, per piece: the order does not depend on the rank count.
"""
from __future__ import annotations

import numpy as np


def two_cap_order(size: np.ndarray, size2: np.ndarray, cap1: int, cap2: int, starts: np.ndarray,
                  ends: np.ndarray) -> np.ndarray:
    """Return the local order (int64 indices) of the samples, each piece ``[starts[i], ends[i])`` reordered in place.

    Pieces keep their places and their samples; inside one, samples are merged by the normalised
    position of their cumulative lean within their side (see the module's text). Ties keep position.
    """
    n = len(size)
    if n == 0:
        return np.zeros(0, np.int64)
    assert len(starts) and int(starts[0]) == 0 and int(ends[-1]) == n, "pieces cover the samples"
    piece = np.zeros(n, np.int64)
    if len(starts) > 1:
        piece[np.asarray(starts[1:], np.int64)] = 1
        piece = np.cumsum(piece)
    lean = np.asarray(size2, np.int64) * int(cap1) - np.asarray(size, np.int64) * int(cap2)
    side = (lean > 0).astype(np.int64)
    mass = np.abs(lean)
    # within (piece, side): increasing lean, ties by position
    order = np.lexsort((np.arange(n), mass, side, piece))
    p, sd, m = piece[order], side[order], mass[order]
    group = np.concatenate(([True], (p[1:] != p[:-1]) | (sd[1:] != sd[:-1])))
    first = np.flatnonzero(group)
    gid = np.cumsum(group) - 1
    cum = np.cumsum(m)  # exact int64 sums
    before = np.concatenate(([0], cum))[first][gid]  # the group's sum before its first sample
    upto = cum - before  # cumulative lean in the group, this sample included
    total = (cum[np.concatenate((first[1:] - 1, [n - 1]))] - before[first])[gid]
    # the midpoint of the sample's share, normalised to its group's whole: (2*upto - m) / (2*total)
    pos = np.where(total > 0, (2 * upto - m).astype(np.float64) / np.maximum(2 * total, 1).astype(np.float64),
                   (np.arange(n) - first[gid] + 0.5) / np.maximum(np.bincount(gid)[gid], 1))
    merged = np.lexsort((order, sd, pos, p))
    return order[merged]

