"""The trainers' signatures (``sortpack.batch.verl``, ``.slime``, ``.trl``) against their originals on the same data:
verl's and slime's algorithms as ``benchmarks.trainer_baselines`` re-implements them (checked against verl's own file
where verl is installed), TRL's ``pack_dataset`` itself. No micro-batch over the cap where an original overflowed,
equal counts, every sample once."""
from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import trainer_baselines as tb
from sortpack.batch.slime import build_dp_schedule
from sortpack.batch.trl import PackingCollator
from sortpack.batch.verl import get_seqlen_balanced_partitions, rearrange_micro_batches
from sortpack.errors import SortpackError


def rollouts(n: int, seed: int = 0, top: int = 16384) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(400), 0.6, n) + rng.lognormal(np.log(1500), 1.0, n)), 16,
                   top).astype(np.int64)


def _spread(values: np.ndarray, parts: list[list[int]]) -> float:
    sums = np.array([values[p].sum() for p in parts], dtype=np.float64)
    return float(sums.max() / sums.mean())


@pytest.mark.parametrize("equal_size", [True, False])
def test_verl_partitions_have_verls_shape_and_balance_at_least_as_well(equal_size):
    values = rollouts(960, seed=1)
    ours = get_seqlen_balanced_partitions(values.tolist(), 16, equal_size)
    theirs = tb.verl_karmarkar_karp(values.tolist(), 16, equal_size)
    assert len(ours) == 16 and all(p == sorted(p) and p for p in ours)
    assert sorted(i for p in ours for i in p) == list(range(960))
    if equal_size:
        assert {len(p) for p in ours} == {60}
    assert _spread(values, ours) <= _spread(values, theirs) * (1 + 1e-9)
    with pytest.raises(SortpackError, match="equal_size needs 961 items to divide by 16"):
        get_seqlen_balanced_partitions(values.tolist() + [5], 16, True)


def _verl_original():
    """Return verl's own ``seqlen_balancing`` module, loaded from its file (None: no copy of verl to read).

    verl imports Ray at its top, and its wheel carries a top-level ``tests`` package that would
    shadow this suite's: so it is never installed beside sortpack. ``SORTPACK_TEST_VERL_DIR`` names a
    directory holding it (``pip install --no-deps --target DIR verl``); its one file is loaded by path
    with stubs for the three modules it imports and never uses in these functions.
    """
    root = os.environ.get("SORTPACK_TEST_VERL_DIR")
    path = Path(root or "") / "verl" / "utils" / "seqlen_balancing.py"
    if not root or not path.exists():
        return None
    stubs = {name: types.ModuleType(name) for name in ("verl", "verl.protocol", "verl.utils",
                                                        "verl.utils.tensordict_utils", "verl.utils.device")}
    stubs["verl.protocol"].DataProto = object  # type: ignore[attr-defined]
    stubs["verl.utils.device"].get_device_name = lambda: "cpu"  # type: ignore[attr-defined]
    stubs["verl.utils"].tensordict_utils = stubs["verl.utils.tensordict_utils"]  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location("verl_seqlen_balancing", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


@pytest.mark.slow
@pytest.mark.torch
def test_the_re_implemented_verl_is_verls_own():
    pytest.importorskip("torch")
    verl = _verl_original()
    if verl is None:
        pytest.skip("SORTPACK_TEST_VERL_DIR names no copy of verl (pip install --no-deps --target DIR verl)")
    values = rollouts(640, seed=2).tolist()
    for k, equal in ((8, True), (40, False)):
        theirs = [sorted(p) for p in verl.karmarkar_karp(values, k, equal)]
        mine = [sorted(p) for p in tb.verl_karmarkar_karp(values, k, equal)]
        assert sorted(map(tuple, mine)) == sorted(map(tuple, theirs))


def test_verl_micro_batches_stay_under_the_cap_where_verls_first_split_overflowed():
    lengths = rollouts(400, seed=3, top=8192)
    cap = 8192
    before = tb.verl_micro_batches(lengths.tolist(), cap, repartition=False)
    assert any(lengths[p].sum() > cap for p in before)  # the split into ceil(total / cap) parts overflows
    after = tb.verl_micro_batches(lengths.tolist(), cap)
    batch = {"input_ids": np.zeros((400, 1)), "attention_mask": (np.arange(cap)[None, :] < lengths[:, None])}
    mbs, parts = rearrange_micro_batches(batch, cap, num_batches_divided_by=4)
    assert sorted(i for p in parts for i in p) == list(range(400))
    assert all(lengths[p].sum() <= cap for p in parts) and len(parts) % 4 == 0
    assert len(parts) <= len(after) and len(parts) >= -(-int(lengths.sum()) // cap)
    assert np.array_equal(mbs[0]["attention_mask"], batch["attention_mask"][parts[0]])
    work = [sum(24576 * int(lengths[i]) + int(lengths[i]) ** 2 for i in p) for p in parts]
    assert work[0] <= max(work) and work[-1] <= max(work)  # the lightest at both ends, as verl orders them


def test_verl_forced_groups_stay_together():
    lengths = rollouts(64, seed=4, top=2000)
    batch = {"input_ids": np.zeros((64, 1)), "attention_mask": (np.arange(2000)[None, :] < lengths[:, None])}
    _, parts = rearrange_micro_batches(batch, 8192, force_group_size=4, use_dynamic_bsz_balance=False)
    assert all(len({i // 4 for i in p}) * 4 == len(p) for p in parts)
    with pytest.raises(SortpackError, match="must divide by force_group_size 5"):
        rearrange_micro_batches(batch, 8192, force_group_size=5)


@pytest.mark.parametrize("cap,kw,message", [
    (10, {}, r"sample 1 holds 12 tokens, over max_token_len=10 \(1 over it in all\); raise max_token_len$"),
    (10, {"force_group_size": 2}, r"the forced group of samples 0\.\.1 holds 15 tokens, over max_token_len=10 "
                                  r"\(1 over it in all\); raise max_token_len or lower force_group_size$"),
    (0, {}, "max_token_len=0: expected an integer >= 1"),
    ("a", {}, "max_token_len='a': expected an integer >= 1"),
    (2.5, {}, "max_token_len=2.5: expected an integer >= 1"),
])
def test_verl_micro_batches_refuse_in_their_own_terms(cap, kw, message):
    # a sample over the cap was plan_batch's "over max_tokens=10 ... pass oversize='alone'", keywords verl's signature
    # has not; max_token_len=0 was "max_tokens=0", "a" int()'s ValueError and 2.5 ran as 2
    lengths = np.array([3, 12, 4, 5])
    batch = {"input_ids": np.zeros((4, 1)), "attention_mask": np.arange(20)[None, :] < lengths[:, None]}
    with pytest.raises(SortpackError, match="rearrange_micro_batches: " + message) as err:
        rearrange_micro_batches(batch, cap, **kw)
    assert "\n" not in str(err.value) and "max_tokens" not in str(err.value) and "oversize" not in str(err.value)

def _slime_args(cap: int, hidden: int = 1024) -> SimpleNamespace:
    return SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=cap, hidden_size=hidden)


@pytest.mark.parametrize("cp,vpp,group", [(1, 1, 1), (2, 1, 1), (1, 2, 3)])
def test_slime_schedule_keeps_slimes_invariants_and_balances_at_least_as_well(cp, vpp, group):
    lengths = rollouts(2400, seed=5)
    rollout = np.repeat(np.arange(600), 4)  # 4 samples a prompt
    config = {"dp_size": 4, "cp_size": cp, "vpp_size": vpp, "microbatch_group_size_per_vp_stage": group}
    parts, micro, counts, sizes = build_dp_schedule(_slime_args(8192), config, lengths.tolist(),
                                                    global_batch_size=200, rollout_indices=rollout.tolist())
    assert sizes == [200, 200, 200] and len(counts) == 3
    assert sorted(i for p in parts for i in p) == list(range(2400))  # every kept sample exactly once
    for r in range(4):
        assert [i for mb in micro[r] for i in mb] == list(range(len(parts[r])))  # the mbs tile the rank's samples
        assert len(micro[r]) == sum(counts)  # every rank runs the same count each step
        # no micro-batch over the cap but a sample over it alone (slime's rule)
        assert all(lengths[[parts[r][i] for i in mb]].sum() <= 8192 * cp or len(mb) == 1 for mb in micro[r])
    if vpp > 1:
        assert all(c % group == 0 for c in counts)
    # the same step planned by slime's own algorithm: sortpack's micro-batches cost no more on the busiest rank
    step = np.flatnonzero(rollout < 200)
    theirs = tb.slime_schedule(lengths[step].tolist(), 4, 8192 * cp, 6144.0, group if vpp > 1 else 1)
    cost = lambda ids: float(sum(6144.0 * lengths[i] + float(lengths[i]) ** 2 for i in ids))  # noqa: E731
    their_sums = np.array([sum(cost(step[mb]) for mb in rank) for rank in theirs])
    first = counts[0]
    our_sums = np.array([sum(cost([parts[r][i] for i in mb]) for mb in micro[r][:first]) for r in range(4)])
    # (the swaps stop within 1e-5 of the mean: past that, both are balanced)
    assert our_sums.max() / our_sums.mean() <= max(their_sums.max() / their_sums.mean(), 1 + 2e-5)


def test_slime_oversize_samples_go_alone_as_in_slime():
    lengths = np.array([100, 9000, 200, 300, 50, 60, 70, 80])
    config = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    parts, micro, counts, _ = build_dp_schedule(_slime_args(1000), config, lengths.tolist(), global_batch_size=8,
                                                rollout_indices=list(range(8)))
    mbs = [[parts[r][i] for i in mb] for r in range(2) for mb in micro[r]]
    assert [1] in mbs and len(set(counts)) == 1
    with pytest.raises(SortpackError, match="dynamic batch"):
        build_dp_schedule(SimpleNamespace(use_dynamic_batch_size=False), config, [1], global_batch_size=1,
                          rollout_indices=[0])


@pytest.mark.parametrize("kw,message", [
    ({"global_batch_size": 0}, "global_batch_size=0: expected an integer >= 1"),
    ({"global_batch_size": -1}, "global_batch_size=-1: expected an integer >= 1"),
    ({"global_batch_size": 1.5}, "global_batch_size=1.5: expected an integer >= 1"),
    ({"rollout_indices": [0]}, r"rollout_indices has shape \(1,\), total_lengths \(2,\): expected one rollout"),
    ({"rollout_indices": [0, 1, 2]}, r"rollout_indices has shape \(3,\), total_lengths \(2,\): expected one"),
])
def test_slime_schedule_refuses_a_bad_batch_size_or_rollout_list_in_one_line(kw, message):
    # global_batch_size=0 was a ZeroDivisionError and 1.5 ran as 1; a short rollout_indices dropped samples silently,
    # a long one was numpy's IndexError
    config = {"dp_size": 1, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    with pytest.raises(SortpackError, match="build_dp_schedule: " + message) as err:
        build_dp_schedule(_slime_args(100), config, [10, 20], **{"global_batch_size": 1, "rollout_indices": [0, 1],
                                                                 **kw})
    assert "\n" not in str(err.value)

def test_the_packing_collator_packs_no_more_rows_than_trl_and_keeps_every_token():
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    lengths = rollouts(300, seed=6, top=4096)
    ids = [list(range(1, int(n) + 1)) for n in lengths]
    packed = trl.pack_dataset(datasets.Dataset.from_dict({"input_ids": ids}), 4096, strategy="bfd")
    trl_rows = [len(x) for x in packed["input_ids"]]
    rows = PackingCollator(4096).rows(lengths)
    assert len(rows) <= len(trl_rows) and max(trl_rows) <= 4096
    assert all(lengths[r].sum() <= 4096 for r in rows)
    assert sorted(np.concatenate(rows).tolist()) == list(range(300))


@pytest.mark.torch
def test_the_packing_collator_lays_out_rows_with_labels():
    pytest.importorskip("torch")
    examples = [{"input_ids": [5] * n, "labels": [-100] * (n // 2) + [7] * (n - n // 2)} for n in (6, 3, 9, 4)]
    batch = PackingCollator(12, pad_token_id=0)(examples)
    assert batch["row_shape"] == (2, 12) and sorted(i for r in batch["rows"] for i in r) == [0, 1, 2, 3]
    assert int((batch["input_ids"] == 5).sum()) == 22
    assert int((batch["labels"] == 7).sum()) == 3 + 2 + 5 + 2  # the given labels' targets, laid out with the ids
    with pytest.raises(SortpackError, match="example 0 holds 20 tokens, over seq_length=12"):
        PackingCollator(12)([{"input_ids": [1] * 20}])
    cut = PackingCollator(12, on_overflow="truncate")([{"input_ids": [1] * 20}])
    assert cut["row_shape"] == (1, 12)


VERL_RANK = """
import os, sys
import numpy as np
import torch.distributed as dist
from sortpack.batch.verl import rearrange_micro_batches
dist.init_process_group("gloo")
rank = dist.get_rank()
lengths = np.full(40 if rank == 0 else 12, 1000)  # rank 0 needs 10 micro-batches of 4000, rank 1 three
batch = {"input_ids": lengths, "attention_mask": lengths[:, None]}
_, parts = rearrange_micro_batches(batch, 4000, dp_group=dist.group.WORLD)
print("count", len(parts), "largest", max(int(lengths[p].sum()) for p in parts), "samples", sum(map(len, parts)))
short = np.full(4 if rank == 1 else 40, 1000)  # rank 1 cannot fill 10 micro-batches: both ranks refuse together
try:
    rearrange_micro_batches({"input_ids": short, "attention_mask": short[:, None]}, 4000, dp_group=dist.group.WORLD)
except Exception as exc:
    print("refused", type(exc).__name__, str(exc).split(":")[1].strip()[:30])
# a sample over the cap on rank 0 alone: it raised before the all-reduce and rank 1 waited there for ever
big = np.array([5000, 1000] if rank == 0 else [1000, 1000])
try:
    rearrange_micro_batches({"input_ids": big, "attention_mask": big[:, None]}, 4000, dp_group=dist.group.WORLD)
except Exception as exc:
    print("over", type(exc).__name__, str(exc).split(":")[1].strip()[:30])
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.torch
def test_verl_data_parallel_ranks_agree_on_the_count(tmp_path):
    pytest.importorskip("torch")
    from support import run_gloo_ranks

    script = tmp_path / "verl_rank.py"
    script.write_text(VERL_RANK)
    outs = run_gloo_ranks([script], timeout=120)
    lines = [[line for line in out.splitlines() if line.startswith(("count", "refused", "over"))] for out in outs]
    assert lines[0][0] == "count 10 largest 4000 samples 40" and lines[1][0] == "count 10 largest 2000 samples 12"
    assert lines[0][1] == lines[1][1] == "refused SortpackError a data-parallel rank has 4 sam"
    assert lines[0][2] == "over SortpackError " + "sample 0 holds 5000 tokens, over"[:30]
    assert lines[1][2] == "over SortpackError " + "another data-parallel rank holds"[:30]


@pytest.mark.parametrize("values,k", [([100, 1, 1, 1, 1, 1, 1, 1], 2), ([1000, 900] + [10] * 10, 3),
                                      ([0, 0, 0, 5], 3)])
def test_verl_partitions_of_free_size_balance_only_the_sums(values, k):
    # equal_size=False: "only consider balancing the sum, each partition can have variable number of items" (verl);
    # the counts were kept within one of each other: {100, 1, 1, 1} and {1, 1, 1, 1}, 103 against verl's 100
    ours = get_seqlen_balanced_partitions(values, k, False)
    theirs = tb.verl_karmarkar_karp(values, k, False)
    assert len(ours) == k and all(p == sorted(p) and p for p in ours)
    assert sorted(i for p in ours for i in p) == list(range(len(values)))
    assert max(sum(values[i] for i in p) for p in ours) <= max(sum(values[i] for i in p) for p in theirs)


VERL_RANK_NO_GROUP = """
import numpy as np
import torch.distributed as dist
from sortpack.batch.verl import rearrange_micro_batches
dist.init_process_group("gloo")
lengths = np.full(40 if dist.get_rank() == 0 else 12, 1000)
_, parts = rearrange_micro_batches({"input_ids": lengths, "attention_mask": lengths[:, None]}, 4000)
print("count", len(parts))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.torch
def test_verl_ranks_agree_on_the_count_without_a_group_as_verl_does(tmp_path):
    # verl all-reduces over the default group when dp_group is None (its FSDP actor and critic pass none): the
    # adapter planned each rank alone there, 10 micro-batches on one rank and 3 on the other (FSDP then hangs)
    pytest.importorskip("torch")
    from support import run_gloo_ranks

    script = tmp_path / "verl_rank.py"
    script.write_text(VERL_RANK_NO_GROUP)
    outs = run_gloo_ranks([script], timeout=120)
    assert [[line for line in out.splitlines() if line.startswith("count")] for out in outs] == [["count 10"]] * 2


def test_the_packing_collator_names_its_own_arguments_when_refusing():
    # an example over seq_length was plan_batch's "over max_tokens=10 ... pass oversize='alone'", keywords the
    # collator has not; seq_length=0 was "max_tokens=0", seq_length="a" int()'s ValueError
    with pytest.raises(SortpackError, match=r"PackingCollator: example 1 holds 11 tokens, over seq_length=10; "
                                            r"pass on_overflow='truncate'") as err:
        PackingCollator(10)([{"input_ids": [1] * 3}, {"input_ids": [1] * 11}])
    assert "\n" not in str(err.value) and "max_tokens" not in str(err.value)
    for bad in (0, "a", 2.5):
        with pytest.raises(SortpackError, match=f"PackingCollator: seq_length={bad!r}: expected an integer >= 1"):
            PackingCollator(bad)


@pytest.mark.parametrize("values,k,message", [
    ([[1, 2], [3, 4]], 2, r"seqlen_list must be 1-d, got shape \(2, 2\)"),
    ([5, float("nan"), 2, 1], 2, r"seqlen_list\[1\] = nan: expected a finite number"),
    (["a", "b"], 1, "seqlen_list must hold numbers"),
    ([1, 2], "2", "k_partitions='2': expected an integer >= 1"),
    ([1, 2, 3], 2.0, "k_partitions=2.0: expected an integer >= 1"),
])
def test_verl_partitions_refuse_bad_input_in_one_line(values, k, message):
    # a 2-d list was dealt by rows and a NaN anywhere, silently; strings and a float k were numpy's and heapq's errors
    with pytest.raises(SortpackError, match=message) as err:
        get_seqlen_balanced_partitions(values, k, False)
    assert "\n" not in str(err.value)
