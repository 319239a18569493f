"""Fine-tuning plans: loss targets counted per sample, summed per micro-batch and step, reported, and what
trains nothing dropped."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")
from sortpack.inputs.finetune import encode_chats, load_chat_template
from sortpack.inputs.specs import load_tokenizer
from sortpack.reader import PackedIndex, PackedSampler

from support import conversations, make_chat_tokenizer, read_manifest, run_sortpack


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """Chats JSONL with two that train nothing: one without an assistant turn, one whose answer is empty."""
    base = tmp_path_factory.mktemp("ftplans")
    tokenizer, config = make_chat_tokenizer(base / "tok")
    rows = conversations(150, seed=3)
    rows[10] = [{"role": "user", "content": "hello"}]
    rows[20] = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": ""}]
    with open(base / "chats.jsonl", "w") as f:
        for chat in rows:
            f.write(json.dumps({"messages": chat}) + "\n")
    enc = encode_chats(load_tokenizer(tokenizer), load_chat_template(config), rows)
    return base, tokenizer, config, enc.targets


def _run(chats, out, *extra, check=True):
    base, tokenizer, config, _ = chats
    return run_sortpack(["run", base / "chats.jsonl", "-o", out, "--chat-template", config, "--tokenizer", tokenizer,
                         *extra], check=check)


def test_targets_are_counted_summed_and_reported(chats, tmp_path):
    targets = chats[3]
    # the chat without an assistant turn has no target; the empty answer still trains its <|im_end|>
    assert targets[10] == 0 and targets[20] == 1
    out = tmp_path / "plan"
    proc = _run(chats, out, "--max-tokens", "500", "--budget", "tokens")
    assert "dropped 1 empty sample" in proc.stdout
    m = read_manifest(out)
    kept = np.flatnonzero(targets > 0)
    assert m["stats"]["targets"] == int(targets.sum()) and m["stats"]["empty_dropped"] == 1
    ix = PackedIndex(out)
    per_mb = ix["targets"]
    assert per_mb.tolist() == [int(targets[ix.microbatch(p)].sum()) for p in range(ix.num_microbatches)]
    assert sorted(ix.all_sample_ids().tolist()) == kept.tolist()
    for rank in range(2):
        for mb in PackedSampler(ix, rank=rank, world_size=2, grad_accum=2):
            pos = np.arange(mb.position, mb.end) % ix.num_microbatches
            assert mb.step_targets == int(per_mb[pos].sum()) and mb.targets == int(per_mb[mb.microbatch])
            assert mb.info()["step_targets"] == mb.step_targets
    report = json.loads(run_sortpack(["inspect", out, "--json"]).stdout)
    assert report["targets"] == int(targets.sum()) and "targets_imbalance" not in report
    report = json.loads(run_sortpack(["inspect", out, "--json", "--world-size", "2", "--grad-accum", "2"]).stdout)
    steps = per_mb[np.arange(report["steps"] * 4).reshape(-1, 2, 2) % len(per_mb)].sum(axis=1)  # (steps, ranks)
    ratio = steps.max(axis=1) / steps.mean(axis=1)
    assert report["targets_imbalance"]["max"] == pytest.approx(ratio.max())
    assert report["targets_imbalance"]["weighted"] == pytest.approx(steps.max(axis=1).sum() / steps.mean(axis=1).sum())


def test_keep_empty_keeps_what_trains_nothing(chats, tmp_path):
    out = tmp_path / "plan"
    _run(chats, out, "--max-tokens", "500", "--budget", "tokens", "--keep-empty")
    assert len(PackedIndex(out).all_sample_ids()) == len(chats[3])


@pytest.mark.parametrize("oversize", ["split", "truncate"])
def test_cutting_fine_tuning_samples_is_refused(chats, tmp_path, oversize):
    proc = _run(chats, tmp_path / "p", "--max-tokens", "40", "--oversize", oversize, check=False)
    assert proc.returncode == 2 and f"--oversize {oversize}: fine-tuning samples are not cut yet" in proc.stderr
    assert not (tmp_path / "p").exists()
