"""One gloo rank of the PlanNode resume test: train (count) a plan's steps, stop or resume from a node state.

    python tests/train/plan_node_worker.py PLAN MODE STATE.json OUT.json   (RANK/WORLD_SIZE set)

MODE ``whole`` runs the epoch; ``stop`` runs 3 steps and rank 0 writes the node's state to
STATE.json; ``resume`` loads it (at this run's world size) and runs to the epoch's end.
Rank 0 writes every step's micro-batches (number and real sample ids, gathered from all
ranks, repeats left out) to OUT.json.
"""
from __future__ import annotations

import json
import sys

import torch.distributed as dist

from sortpack.torch import PackedBatchSampler, PlanNode, SourceDataset, pad_collate


def utf8(row) -> list[int]:
    """Return a row's text as byte ids."""
    return list(row["text"].encode())


def main() -> None:
    """Run the rank's part and gather every step's micro-batches on rank 0."""
    plan, mode, state_file, out = sys.argv[1:5]
    dist.init_process_group("gloo")
    node = PlanNode(PackedBatchSampler(plan), SourceDataset(plan), pad_collate(tokenize=utf8))
    if mode == "resume":
        with open(state_file) as f:
            node.reset(json.load(f))
    steps = []
    for batch in node:
        info = batch["microbatch"]
        mine = [] if info["repeat"] else [[info["microbatch"], batch["sample_ids"][batch["real"]].tolist()]]
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        steps.append([mb for part in everyone for mb in part])
        if mode == "stop" and len(steps) == 3:
            break
    if dist.get_rank() == 0:
        if mode == "stop":
            with open(state_file, "w") as f:
                json.dump(node.get_state(), f)
        with open(out, "w") as f:
            json.dump({"steps": [s for s in steps if s]}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
