"""One process of the rank-from-the-launcher checks in test_world.py (run as a script).

argv: INDEX MODE. Prints one JSON line: the rank and world size the sampler took and the
micro-batch numbers it yields (MODE "plain"), after ``torch.distributed`` is initialised
(MODE "dist"), or the error a mismatching explicit value raises (MODE "mismatch").
"""
from __future__ import annotations

import json
import os
import sys


def main() -> None:
    """Build a sampler the way a training script does and print what it took."""
    index, mode = sys.argv[1], sys.argv[2]
    out: dict = {}
    if mode in ("dist", "mismatch"):
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        # from here on the process group decides, not the environment
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
    if mode == "reader":
        from sortpack.reader import PackedSampler as Sampler
    else:
        from sortpack.torch import PackedBatchSampler as Sampler  # type: ignore[assignment]
    if mode == "mismatch":
        try:
            Sampler(index, rank=0, world_size=3)
            out["error"] = None
        except ValueError as exc:
            out["error"] = str(exc)
    s = Sampler(index)
    out.update(rank=s.rank, world_size=s.world_size, microbatches=[mb.microbatch for mb in s])
    # one write of the whole line: under mpiexec both ranks share the launcher's stdout, and print's two
    # writes (text, then newline) let the other rank's line land between them when output is unbuffered
    os.write(1, (json.dumps(out) + "\n").encode())


if __name__ == "__main__":
    main()
