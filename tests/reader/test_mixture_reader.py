"""The reader on a mixture plan: plan order, per-source names, resume at another world size, workers."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from sortpack.reader import PackedIndex, PackedSampler

from support import lognormal, run_sortpack, write_text_parquet


@pytest.fixture(scope="module")
def mix_index(tmp_path_factory):
    """A three-source plan written by ``sortpack run --mixture`` (a schedule, repeats and a subset)."""
    root = tmp_path_factory.mktemp("mixreader")
    for name, seed, n, big in (("web", 1, 700, 1200), ("code", 2, 300, 2500), ("books", 3, 80, 3000)):
        (root / name).mkdir()
        write_text_parquet(root / name / "a.parquet", lognormal(n, seed, big), 100)
    spec = {"sources": [{"name": "web", "inputs": ["web"], "weight": 5},
                        {"name": "code", "inputs": ["code"], "weight": 3},
                        {"name": "books", "inputs": ["books"], "weight": 2}],
            "total_tokens": 400_000, "seed": 7,
            "schedule": [{"until": 0.5}, {"until": 1.0, "weights": {"web": 1, "books": 6}}]}
    (root / "mix.json").write_text(json.dumps(spec))
    run_sortpack(["run", "--mixture", root / "mix.json", "-o", root / "plan", "--max-tokens", "4096", "--store",
                  "text"])
    return root / "plan"


def utf8(row) -> bytes:
    """Return a row's text as bytes (module level: DataLoader workers pickle it)."""
    return row["text"].encode()


def _flat(batches) -> list[int]:
    return [mb.microbatch for mb in batches if not mb.repeat]


def test_each_microbatch_carries_its_source_name(mix_index):
    idx = PackedIndex(mix_index)
    names = idx.source_names
    sampler = PackedSampler(idx, rank=0, world_size=1)
    got = list(sampler)
    assert [mb.microbatch for mb in got] == list(range(len(idx)))  # plan order by default
    assert [mb.source for mb in got] == [names[s] for s in idx["source"]]
    assert got[0].info()["source"] == names[int(idx["source"][0])]


@pytest.mark.parametrize("kwargs", [{"order": "shuffle"}, {"order": "curriculum"}, {"largest_first": True},
                                    {"warmup_shapes": True}])
def test_orders_that_move_steps_are_refused_in_one_line(mix_index, kwargs):
    with pytest.raises(ValueError, match="is a mixture plan: its order is the schedule") as exc:
        PackedSampler(mix_index, **kwargs)
    assert "\n" not in str(exc.value)
    state = PackedSampler(mix_index).state_dict()
    key = "order" if "order" in kwargs else next(iter(kwargs))
    state[key] = kwargs[key]
    with pytest.raises(ValueError, match="mixture plan"):
        PackedSampler(mix_index).load_state_dict(state)


def _take(samplers, steps):
    """Return, per step, the micro-batches every rank trained on (position order), consuming ``steps`` steps."""
    out = []
    iters = [iter(s) for s in samplers]
    accum = samplers[0].grad_accum
    for _ in range(steps):
        per_rank = [[next(it) for _ in range(accum)] for it in iters]
        for mbs, s in zip(per_rank, samplers):
            for mb in mbs:
                s.consume(mb)
        flat = sorted((mb.position + a * len(samplers) + r, mb) for r, mbs in enumerate(per_rank)
                      for a, mb in enumerate(mbs))
        out.extend(mb for _, mb in flat)
    return out


def test_resume_mid_schedule_at_another_world_size_and_accumulation(mix_index):
    idx = PackedIndex(mix_index)
    first = [PackedSampler(idx, rank=r, world_size=2, grad_accum=2) for r in range(2)]
    head = _take(first, 7)  # 28 micro-batches: part way into the first phase
    state = first[0].state_dict()
    second = [PackedSampler(idx, rank=r, world_size=3, grad_accum=1) for r in range(3)]
    for s in second:
        s.load_state_dict(state)
        s.set_epoch(0)
        s.set_grad_accum(3)  # and a new accumulation from here on
    left = (len(idx) - 28) // 9
    tail = _take(second, left)
    order = _flat(head + tail)
    assert order == list(range(len(order)))  # the plan's order, with no micro-batch lost or repeated
    names = idx.source_names
    assert [mb.source for mb in head + tail] == [names[s] for s in idx["source"][:len(order)]]


def test_dataloader_workers_log_per_source(mix_index):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from sortpack.torch import PackedBatchSampler, SourceDataset, pad_collate

    idx = PackedIndex(mix_index)
    sampler = PackedBatchSampler(idx, rank=0, world_size=1, grad_accum=2)
    loader = DataLoader(SourceDataset(idx, columns=["text"]), batch_sampler=sampler, num_workers=2,
                        collate_fn=pad_collate(tokenize=utf8), prefetch_factor=2)
    tokens: Counter = Counter()
    for batch in loader:
        info = batch["microbatch"]
        if not info["repeat"]:  # a short last step is filled from the start: not new tokens
            tokens[info["source"]] += int(batch["lengths"].sum())
        sampler.consume(batch)
        assert isinstance(batch["input_ids"], torch.Tensor)
    per_source = {name: int(idx["tokens"][idx["source"] == s].sum()) for s, name in enumerate(idx.source_names)}
    assert dict(tokens) == per_source
    assert sampler.state_dict()["epoch"] == 1  # every step was consumed
    assert np.isclose(sum(per_source.values()), idx["tokens"].sum())


@pytest.mark.parametrize("flags", [["--order", "shuffle"], ["--order", "curriculum"], ["--largest-first"],
                                   ["--warmup-shapes"]])
@pytest.mark.parametrize("what", [["--step", "3"], ["--sample", "5"]])
def test_inspect_refuses_to_trace_steps_the_sampler_refuses(mix_index, flags, what):
    # a trace of a shuffled mixture plan would show steps no run produced
    proc = run_sortpack(["inspect", mix_index, *what, *flags], check=False, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "is a mixture plan: its order is the schedule" in lines[0] and flags[-1] in lines[0], lines
    assert proc.stdout == ""
    from sortpack.errors import SortpackError
    from sortpack.reader.plan import StepOrder
    from sortpack.reader.sampler_state import Layout
    from sortpack.reader.trace import step_trace

    kw = {"order": flags[1]} if flags[0] == "--order" else {flags[0][2:].replace("-", "_"): True}
    with pytest.raises(SortpackError, match="mixture plan"):
        step_trace(mix_index, 3, Layout(1, 1), StepOrder(**kw))
    # plan order traces as the sampler trains
    assert step_trace(mix_index, 3)["ranks"][0]["microbatches"][0]["microbatch"] == 3


def test_the_documented_source_column_snippet_runs(mix_index, capsys):
    """docs/mixtures.md's per-micro-batch ``source`` snippet runs as written on a mixture plan."""
    from support import ROOT

    text = (ROOT / "docs" / "mixtures.md").read_text()
    snippet = text.split("<!-- mixture-source-column -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(snippet, "docs/mixtures.md", "exec"), {"PLAN": str(mix_index)})  # noqa: S102 - the page's code
    name, count = capsys.readouterr().out.split()
    idx = PackedIndex(mix_index)
    assert name == idx.source_names[int(idx["source"][0])]
    assert int(count) == int((idx["source"] == idx.source_names.index("code")).sum()) > 0
