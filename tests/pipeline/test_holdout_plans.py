"""Held-out plans end to end: ``run``/``pack --holdout``, MIX.json's ``holdout``, the reader, inspect, verify."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from sortpack.reader import PackedIndex, PackedSampler
from sortpack.stages.holdout import holdout_mask

from support import lognormal, run_sortpack, write_text_parquet

PACK = ["--column", "text", "--max-tokens", "4096", "--segment-size", "256"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two sources (web: two files, books: one) and a 1-rank plan of web with --holdout 0.1."""
    root = tmp_path_factory.mktemp("holdout")
    (root / "web").mkdir()
    (root / "books").mkdir()
    write_text_parquet(root / "web" / "a.parquet", lognormal(700, 1, 3000), 200)
    write_text_parquet(root / "web" / "b.parquet", lognormal(500, 2, 3000), 200)
    write_text_parquet(root / "books" / "a.parquet", lognormal(300, 3, 3000), 100)
    spec = {"sources": [{"name": "web", "inputs": ["web/"], "weight": 0.7},
                        {"name": "books", "inputs": ["books/"], "weight": 0.3, "holdout": 25}],
            "holdout_seed": 5}
    (root / "mix.json").write_text(json.dumps(spec))
    run_sortpack(["run", root / "web", "-o", root / "plan", *PACK, "--holdout", "0.1", "--quiet"])
    return root


def _ids(path: Path) -> np.ndarray:
    idx = PackedIndex(path)
    return np.concatenate([idx.microbatch(i) for i in range(len(idx))]) if len(idx) else np.zeros(0, np.int64)


def _files(path: Path) -> dict[str, bytes]:
    """Return every data file of a plan and its held-out plan (manifests aside) by relative name."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*.arrow"))}


def _hash(path: Path) -> str:
    return json.loads((path / "manifest.json").read_text())["content_hash"]


def test_the_union_of_training_and_holdout_is_every_sample_once(data):
    train, held = _ids(data / "plan"), _ids(data / "plan" / "holdout")
    assert len(held) == 120 and len(train) == 1080
    assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(1200))
    # exactly the seeded choice, keyed by sample id
    assert np.array_equal(np.sort(held), np.flatnonzero(holdout_mask(np.arange(1200), np.array([0, 1200]),
                                                                     np.array([120]), 0)))
    m = json.loads((data / "plan" / "manifest.json").read_text())
    rec = m["holdout"]
    assert rec["seed"] == 0 and rec["directory"] == "holdout" and rec["num_samples"] == 120
    assert rec["sources"] == [{"name": None, "first_sample": 0, "num_rows": 1200, "request": 0.1, "held_out": 120}]
    assert rec["content_hash"] == _hash(data / "plan" / "holdout")
    h = json.loads((data / "plan" / "holdout" / "manifest.json").read_text())
    assert h["held_out"]["sources"] == rec["sources"] and h["options"] == m["options"]
    assert h["num_samples"] == 120 and m["num_samples"] == 1080


def test_another_seed_holds_out_other_samples(data, tmp_path):
    run_sortpack(["run", data / "web", "-o", tmp_path / "p", *PACK, "--holdout", "120", "--holdout-seed", "9",
                  "--quiet"])
    held = np.sort(_ids(tmp_path / "p" / "holdout"))
    assert len(held) == 120 and not np.array_equal(held, np.sort(_ids(data / "plan" / "holdout")))
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["holdout"]["seed"] == 9


@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.slow
def test_both_plans_are_byte_identical_at_any_rank_count(data, tmp_path, ranks):
    run_sortpack(["run", data / "web", "-o", tmp_path / "p", *PACK, "--holdout", "0.1", "--quiet"], ranks=ranks,
                 timeout=180)
    assert _files(tmp_path / "p") == _files(data / "plan")
    assert "holdout/microbatches-00000.arrow" in _files(tmp_path / "p")
    assert _hash(tmp_path / "p") == _hash(data / "plan")
    assert _hash(tmp_path / "p" / "holdout") == _hash(data / "plan" / "holdout")


@pytest.mark.slow
def test_pack_of_a_sorted_directory_holds_out_the_same_plans(data, tmp_path):
    run_sortpack(["run", data / "web", "-o", tmp_path / "p", *PACK, "--keep-intermediate", "--quiet"])
    run_sortpack(["pack", tmp_path / "p.sorted", "-o", tmp_path / "q", "--max-tokens", "4096", "--segment-size",
                  "256", "--holdout", "0.1", "--quiet"], ranks=2, timeout=180)
    assert _files(tmp_path / "q") == _files(data / "plan")


@pytest.mark.slow
def test_a_mixture_holds_out_per_source_and_its_union_is_every_sample(data, tmp_path):
    # total_tokens past every source's tokens: each training sample is used at least once
    mix = ["run", "--mixture", data / "mix.json", "--max-tokens", "4096", "--holdout", "0.05", "--total-tokens",
           "6000000", "--quiet"]
    run_sortpack([*mix, "-o", tmp_path / "m"])
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    rec = m["holdout"]
    assert rec["seed"] == 5  # MIX.json's holdout_seed
    assert [(s["name"], s["request"], s["held_out"]) for s in rec["sources"]] == [("web", 0.05, 60),
                                                                                  ("books", 25, 25)]
    held_idx = PackedIndex(tmp_path / "m" / "holdout")
    assert held_idx.source_names == ["web", "books"] and held_idx.mixture is None
    held = _ids(tmp_path / "m" / "holdout")
    src = held_idx["source"]
    for i in range(len(held_idx)):  # a held-out micro-batch holds one source
        ids = held_idx.microbatch(i)
        assert ((ids >= 1200) == bool(src[i])).all()
    train = np.unique(_ids(tmp_path / "m"))
    assert all(s["whole_passes"] >= 1 for s in m["mixture"]["sources"])
    assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(1500))  # every sample on one side
    assert len(held) == 85 and sum(s["samples_held"] for s in m["mixture"]["sources"]) == 1415
    run_sortpack([*mix, "-o", tmp_path / "m3"], ranks=3, timeout=180)
    assert _files(tmp_path / "m3") == _files(tmp_path / "m") and _hash(tmp_path / "m3") == _hash(tmp_path / "m")


def test_blend_takes_holdout_for_every_source(data, tmp_path):
    run_sortpack(["run", "--blend", f"70 {data / 'web'} 30 {data / 'books'}", "-o", tmp_path / "b",
                  "--max-tokens", "4096", "--holdout", "30", "--quiet"])
    rec = json.loads((tmp_path / "b" / "manifest.json").read_text())["holdout"]
    assert [s["held_out"] for s in rec["sources"]] == [30, 30] and rec["seed"] == 0


@pytest.mark.torch
def test_the_reader_opens_the_holdout_like_any_plan(data):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from sortpack.torch import PackedBatchSampler, SourceDataset, pad_collate

    held = data / "plan" / "holdout"
    texts = pq.read_table(sorted((data / "web").glob("*.parquet"))).column("text").to_pylist()
    ds = SourceDataset(str(held), columns=["text"])
    # two ranks over an odd count: the tail step repeats micro-batches, flagged not real
    seen: list[int] = []
    for rank in range(2):
        sampler = PackedBatchSampler(str(held), rank=rank, world_size=2)
        assert sampler.order == "index"  # plan order by default: evaluation reads the plan as packed
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=pad_collate(
            pad_id=0, tokenize=lambda row: np.frombuffer(row["text"].encode(), np.uint8)))
        for batch in loader:
            ids = batch["sample_ids"].numpy()
            real = batch["real"].numpy()
            seen.extend(ids[real].tolist())
            for j, i in enumerate(ids[real]):
                n = int(batch["lengths"][j])
                assert bytes(batch["input_ids"][j, :n].numpy().astype(np.uint8)).decode() == texts[i]
    assert sorted(seen) == sorted(_ids(held).tolist())  # every held-out sample once over the real ones
    assert [mb.repeat for mb in PackedSampler(PackedIndex(held))] == [False] * len(PackedIndex(held))


@pytest.mark.slow
def test_store_writes_the_holdouts_data_too(data, tmp_path):
    from sortpack.reader import SourceDataset

    run_sortpack(["run", data / "web", "-o", tmp_path / "s", *PACK, "--holdout", "0.1", "--store", "text",
                  "--quiet"], ranks=2, timeout=180)
    held = PackedIndex(tmp_path / "s" / "holdout")
    assert held.stored is not None
    stored, files = SourceDataset(held, columns=["text"]), SourceDataset(held, columns=["text"], stored=False)
    n = 0
    for mb in PackedSampler(held):
        got = [r["text"] for r in stored.__getitems__(mb)]
        assert got == [r["text"] for r in files.__getitems__(mb)]
        n += len(got)
    assert n == 120
    # the index shards are those of the plan without --store
    assert _files(tmp_path / "s")["holdout/microbatches-00000.arrow"] == \
        _files(data / "plan")["holdout/microbatches-00000.arrow"]
    assert "ok" in run_sortpack(["verify", tmp_path / "s"]).stdout


@pytest.mark.slow
def test_inspect_prints_and_verify_checks_the_holdout(data, tmp_path):
    rep = json.loads(run_sortpack(["inspect", data / "plan", "--json"]).stdout)
    assert rep["holdout"]["num_samples"] == 120 and rep["holdout"]["seed"] == 0
    assert rep["holdout"]["sources"][0]["held_out"] == 120 and rep["holdout"]["directory"] == "holdout"
    text = run_sortpack(["inspect", data / "plan"]).stdout
    assert "holdout/, 120 samples" in text and "seed 0" in text and "input 120 of 1200" in text
    assert "held_out" in json.loads(run_sortpack(["inspect", data / "plan" / "holdout", "--json"]).stdout)
    assert run_sortpack(["verify", data / "plan"]).stdout.strip().endswith("ok")
    bad = tmp_path / "bad"
    shutil.copytree(data / "plan", bad)
    shard = bad / "holdout" / "microbatches-00000.arrow"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    proc = run_sortpack(["verify", bad], check=False)
    assert proc.returncode == 1 and "holdout/microbatches-00000.arrow: sha256 mismatch" in proc.stderr
    # a held-out plan from another run is refused, though it verifies on its own
    shutil.rmtree(bad / "holdout")
    run_sortpack(["run", data / "web", "-o", tmp_path / "other", *PACK, "--holdout", "0.1", "--holdout-seed", "3",
                  "--quiet"])
    shutil.copytree(tmp_path / "other" / "holdout", bad / "holdout")
    proc = run_sortpack(["verify", bad], check=False)
    assert proc.returncode == 1 and "is not the one the training plan recorded" in proc.stderr
    shutil.rmtree(bad / "holdout")
    proc = run_sortpack(["verify", bad], check=False)
    assert proc.returncode == 1 and "the held-out plan is missing" in proc.stderr


@pytest.mark.slow
def test_overwrite_replaces_the_holdout_it_wrote_and_nothing_else(data, tmp_path):
    out = tmp_path / "o"
    args = ["run", data / "books", "-o", out, *PACK, "--holdout", "10", "--overwrite", "--quiet"]
    run_sortpack(args)
    run_sortpack(args)  # a plan with its holdout/ is sortpack's own
    mine = out / "holdout" / "notes.txt"
    mine.write_text("mine")
    proc = run_sortpack(args, check=False)
    assert proc.returncode == 2 and "holdout/ that holds files sortpack did not write (notes.txt)" in proc.stderr
    assert mine.read_text() == "mine"
    mine.unlink()
    (out / "holdout" / "sub").mkdir()
    assert run_sortpack(args, check=False).returncode == 2 and (out / "holdout" / "sub").is_dir()
    (out / "holdout" / "sub").rmdir()
    # a holdout/ the manifest does not record is not sortpack's
    run_sortpack(["run", data / "books", "-o", out, *PACK, "--overwrite", "--quiet"])
    (out / "holdout").mkdir()
    (out / "holdout" / "manifest.json").write_text((out / "manifest.json").read_text())
    proc = run_sortpack(args, check=False)
    assert proc.returncode == 2 and "holds files sortpack did not write (holdout)" in proc.stderr


@pytest.mark.parametrize("extra,message", [
    (["--holdout", "0"], "--holdout 0: a count of held-out samples must be at least 1"),
    (["--holdout", "-3"], "--holdout -3: a count of held-out samples must be at least 1"),
    (["--holdout", "1.0"], "--holdout 1.0: a fraction must be in (0, 1)"),
    (["--holdout", "2000"], "--holdout 2000: holds out 2000 of the 1200 rows of the input"),
    (["--holdout", "0.1", "--holdout-seed", "-1"], "--holdout-seed -1: must be >= 0"),
    (["--holdout-seed", "4"], "--holdout-seed applies to a held-out plan"),
])
def test_bad_values_are_one_line_exit_2_and_write_nothing(data, tmp_path, extra, message):
    proc = run_sortpack(["run", data / "web", "-o", tmp_path / "x" / "p", *PACK, *extra], ranks=2, check=False,
                        timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_mixture_source_too_small_for_its_holdout_is_named(data, tmp_path):
    spec = json.loads((data / "mix.json").read_text())
    spec["sources"][1]["holdout"] = 300
    for s in spec["sources"]:
        s["inputs"] = [str(data / p) for p in s["inputs"]]
    (tmp_path / "mix.json").write_text(json.dumps(spec))
    proc = run_sortpack(["run", "--mixture", tmp_path / "mix.json", "-o", tmp_path / "m", "--max-tokens", "4096"],
                        check=False)
    assert proc.returncode == 2 and "source 'books'" in proc.stderr and "leaving none to train on" in proc.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_store_tokens_stores_the_holdouts_ids_from_the_one_tokenization(tmp_path):
    from tokenizers import Tokenizer

    from sortpack.reader import SourceDataset

    from support import make_tokenizer

    words = np.array(["hello", "world", "the", "quick", "brown", "fox"])
    rng = np.random.default_rng(4)
    texts = [" ".join(words[rng.integers(0, 6, int(n))]) for n in rng.integers(1, 60, 400)]
    import pyarrow as pa

    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=50)
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    run_sortpack(["run", tmp_path / "t.parquet", "-o", tmp_path / "plan", "--column", "text", "--size", "tokens",
                  "--tokenizer", tok_path, "--max-tokens", "400", "--holdout", "40", "--store", "text",
                  "--store-tokens", "--keep-intermediate", "--quiet"], ranks=2, timeout=180)
    tok = Tokenizer.from_file(tok_path)
    for plan, count in ((tmp_path / "plan", 360), (tmp_path / "plan" / "holdout", 40)):
        ds, n = SourceDataset(plan), 0
        for mb in PackedSampler(PackedIndex(plan)):
            for sid, row in zip(mb, ds.__getitems__(mb)):
                assert row["text"] == texts[sid] and list(row["input_ids"]) == tok.encode(texts[sid]).ids
                n += 1
        assert n == count
    assert not list((tmp_path / "plan").rglob(".tokens-*"))  # the cache is gone once both plans are stored
    # pack --store-tokens from the sorted directory (tokenizing again) gives the same bytes
    run_sortpack(["pack", tmp_path / "plan.sorted", "-o", tmp_path / "packed", "--max-tokens", "400", "--holdout",
                  "40", "--store", "text", "--store-tokens", "--tokenizer", tok_path, "--quiet"])
    assert _files(tmp_path / "packed") == _files(tmp_path / "plan")


def _longest_held_out(tmp_path: Path, longest: int) -> Path:
    """Write 500 samples whose longest (``longest``) is held out by ``--holdout 20`` (seed 0)."""
    mask = holdout_mask(np.arange(500), np.array([0, 500]), np.array([20]), 0)
    lengths = np.random.default_rng(1).integers(10, 300, 500)
    lengths[np.flatnonzero(mask)[0]] = longest
    return write_text_parquet(tmp_path / "c.parquet", lengths)


def test_auto_shapes_give_the_holdout_the_training_lengths_and_one_for_a_longer_sample(tmp_path):
    path = _longest_held_out(tmp_path, 900)
    run_sortpack(["run", path, "-o", tmp_path / "p", "--column", "text", "--max-tokens", "1000", "--holdout", "20",
                  "--shapes", "auto:4", "--quiet"])
    train = json.loads((tmp_path / "p" / "manifest.json").read_text())["options"]
    held = json.loads((tmp_path / "p" / "holdout" / "manifest.json").read_text())["options"]
    assert len(train["shapes"]) == 4 and max(train["shapes"]) < 300
    assert held["shapes"] == train["shapes"] + [900] and held["shapes_request"] == "auto:4"
    assert set(PackedIndex(tmp_path / "p" / "holdout")["padded_size"].tolist()) <= set(held["shapes"])


@pytest.mark.slow
def test_oversize_applies_to_held_out_samples_after_the_choice(tmp_path):
    path = _longest_held_out(tmp_path, 5000)
    args = ["run", path, "-o", tmp_path / "p", "--column", "text", "--max-tokens", "1000", "--holdout", "20",
            "--quiet"]
    proc = run_sortpack(args, check=False)
    assert proc.returncode == 2 and "1 samples" in proc.stderr and not (tmp_path / "p").exists()
    run_sortpack([*args, "--oversize", "skip"])
    rec = json.loads((tmp_path / "p" / "manifest.json").read_text())["holdout"]
    # the choice is made first: the skipped sample stays held out, it is not replaced
    assert rec["num_samples"] == 20 and rec["packed_samples"] == 19
    assert len(_ids(tmp_path / "p")) == 480 and len(_ids(tmp_path / "p" / "holdout")) == 19


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow
def test_sigterm_while_writing_removes_the_holdout_with_its_plan(data, tmp_path, ranks):
    import os
    import signal
    import subprocess
    import time

    from support import ROOT, sortpack_cmd

    # the held-out plan is written first; its last rank stalls once its shards are written
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SORTPACK_FAULT": f"wrote_index:{ranks - 1}:stall"}
    cmd = sortpack_cmd(["run", data / "books", "-o", "plan", *PACK, "--holdout", "30", "--quiet"],
                       ranks if ranks > 1 else None)
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".plan.tmp-*/holdout/microbatches-*.arrow")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode != 0 and "terminated by SIGTERM; removed .plan.tmp-" in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_failure_or_kill_after_the_holdout_is_written_leaves_nothing(data, tmp_path):
    args = ["run", data / "books", "-o", tmp_path / "plan", *PACK, "--holdout", "30", "--quiet"]
    proc = run_sortpack(args, ranks=2, check=False, env={"SORTPACK_FAULT": "wrote_index:0"}, timeout=120)
    assert proc.returncode != 0 and "injected fault at wrote_index" in proc.stderr
    # no plan, no held-out plan, no temporary: only the measurements a failure past analyze keeps
    assert [p.name for p in tmp_path.iterdir()] == ["plan.metrics"]
    assert not (tmp_path / "plan.metrics" / "holdout").exists()
    # a kill leaves the temporary, holdout/ inside it: the next job into the output removes it whole
    proc = run_sortpack(args, ranks=2, check=False, env={"SORTPACK_FAULT": "wrote_index:1:kill"}, timeout=120)
    assert proc.returncode != 0
    assert len(list(tmp_path.glob(".plan.tmp-*/holdout/microbatches-*.arrow"))) == 1
    proc = run_sortpack(args)
    assert "left by a killed job" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan", "plan.metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "pack"])
def test_the_pieces_of_a_split_document_stay_on_one_side(tmp_path, command):
    # --oversize split cuts a long document into pieces that share its sample id; the holdout is
    # chosen by sample id, so a document trains or is held out whole, and every token is in one plan
    lengths = np.r_[np.full(30, 3000), lognormal(170, seed=4, maximum=900)]
    src = write_text_parquet(tmp_path / "long.parquet", lengths, 50)
    cut = ["--column", "text", "--max-tokens", "1024", "--oversize", "split", "--holdout", "0.25", "--quiet"]
    if command == "run":
        run_sortpack(["run", src, "-o", tmp_path / "plan", *cut])
    else:
        run_sortpack(["run", src, "-o", tmp_path / "x", "--column", "text", "--max-tokens", "1024",
                      "--oversize", "split", "--keep-intermediate", "--quiet"])
        run_sortpack(["pack", tmp_path / "x.sorted", "-o", tmp_path / "plan", *cut[2:]])
    train, held = PackedIndex(tmp_path / "plan"), PackedIndex(tmp_path / "plan" / "holdout")
    assert train.has_pieces and held.has_pieces  # long documents were cut on both sides
    tokens = {}
    for ix, side in ((train, "train"), (held, "held")):
        for i in range(ix.num_microbatches):
            ranges = ix.piece_ranges(i)
            ids = ix.microbatch(i)
            begin, end = ranges if ranges is not None else (np.zeros(len(ids)), lengths[ids])
            for sid, b, e in zip(ids.tolist(), begin.tolist(), end.tolist()):
                tokens.setdefault(sid, []).append((int(b), int(e), side))
    for sid, pieces in tokens.items():
        assert len({side for _, _, side in pieces}) == 1, (sid, pieces)  # one side per document
        spans = sorted((b, e) for b, e, _ in pieces)
        assert spans[0][0] == 0 and spans[-1][1] == lengths[sid]  # every token once, in order
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert sorted(tokens) == list(range(len(lengths)))


@pytest.mark.slow
def test_empty_samples_held_out_are_said_in_one_line(tmp_path):
    # held out by id before packing drops empty rows: validation got fewer documents without a word
    lengths = np.where(np.arange(400) % 4 == 0, 0, 1 + np.arange(400) % 50)
    write_text_parquet(tmp_path / "a.parquet", lengths, 100)
    proc = run_sortpack(["run", tmp_path / "a.parquet", "-o", tmp_path / "plan", *PACK, "--holdout", "0.25"])
    held = _ids(tmp_path / "plan" / "holdout")
    chosen = np.flatnonzero(holdout_mask(np.arange(400), np.array([0, 400]), np.array([100]), 0))
    empty = int((lengths[chosen] == 0).sum())
    assert empty and len(held) == 100 - empty
    rec = json.loads((tmp_path / "plan" / "manifest.json").read_text())["holdout"]
    assert rec["empty_dropped"] == empty and rec["packed_samples"] == 100 - empty
    report = json.loads(run_sortpack(["inspect", tmp_path / "plan", "--json"]).stdout)
    assert report["holdout"]["empty_dropped"] == empty
    assert f"{empty} of them empty, dropped" in run_sortpack(["inspect", tmp_path / "plan"]).stdout
    lines = [ln for ln in proc.stderr.splitlines() if "--holdout" in ln]
    assert lines == [f"sortpack: --holdout held out 100 samples, {empty} of them empty (no content; dropped as in "
                     f"training, --keep-empty keeps them): holdout/ plans {100 - empty} of them"], proc.stderr
    # a plan whose held-out samples all have content says nothing and records nothing more
    write_text_parquet(tmp_path / "b.parquet", 1 + np.arange(400) % 50, 100)
    proc = run_sortpack(["run", tmp_path / "b.parquet", "-o", tmp_path / "full", *PACK, "--holdout", "0.25"])
    assert "--holdout" not in proc.stderr
    assert "empty_dropped" not in json.loads((tmp_path / "full" / "manifest.json").read_text())["holdout"]
