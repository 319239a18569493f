"""Mixtures end to end: MIX.json and --blend through ``sortpack run``, the manifest, errors, rank counts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.errors import SortpackError
from sortpack.inputs.mixture import parse_blend, parse_mixture
from sortpack.inputs.schedule import deviations, schedule_from_dict
from sortpack.reader import PackedIndex

from support import assert_same_at_ranks, lognormal, read_manifest, run_sortpack, write_text_parquet


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three sources: web (two files), code (its text in column 'content'), books (long samples)."""
    root = tmp_path_factory.mktemp("mix")
    (root / "web").mkdir()
    (root / "code").mkdir()
    (root / "books").mkdir()
    write_text_parquet(root / "web" / "a.parquet", lognormal(900, 1, 1500), 250)
    write_text_parquet(root / "web" / "b.parquet", lognormal(600, 2, 1500), 250)
    lengths = lognormal(500, 3, 2500)
    texts = ["x" * int(n) for n in lengths]
    pq.write_table(pa.table({"content": texts, "n": lengths}), root / "code" / "a.parquet", row_group_size=200)
    write_text_parquet(root / "books" / "a.parquet", lognormal(150, 4, 3000), 50)
    spec = {"sources": [{"name": "web", "inputs": ["web/"], "weight": 0.6},
                        {"name": "code", "inputs": ["code/"], "weight": 0.3, "column": "content"},
                        {"name": "books", "inputs": ["books/"], "weight": 0.1}],
            "total_tokens": 1_000_000,
            "schedule": [{"until": 0.7}, {"until": 1.0, "weights": {"web": 0.3, "books": 0.4}}]}
    (root / "mix.json").write_text(json.dumps(spec))
    return root


def _run(data: Path, out: str, *extra, ranks=None, mix="mix.json", check=True):
    return run_sortpack(["run", "--mixture", str(data / mix), "-o", str(data / out), "--max-tokens", "8192",
                         "--overwrite", *map(str, extra)], ranks=ranks, check=check)


def _rows(data: Path, name: str) -> int:
    return sum(pq.ParquetFile(p).metadata.num_rows for p in sorted((data / name).glob("*.parquet")))


def test_plan_follows_the_schedule_and_records_each_source(data):
    _run(data, "plan")
    idx = PackedIndex(data / "plan")
    m = idx.manifest["mixture"]
    assert idx.source_names == ["web", "code", "books"]
    tokens, source = idx["tokens"].astype(np.int64), idx["source"].astype(np.int64)
    # every micro-batch holds one source: its ids lie in that source's global row range
    firsts = np.cumsum([0] + [_rows(data, n) for n in ("web", "code", "books")])
    for i in range(len(idx)):
        ids = idx.microbatch(i)
        s = int(source[i])
        assert firsts[s] <= ids.min() and ids.max() < firsts[s + 1]
    schedule = schedule_from_dict(m["schedule"], idx.source_names)
    dev = deviations(tokens, source, schedule, m["target_tokens"])
    assert dev.max() <= m["bound_tokens"] and m["bound_tokens"] <= 8192
    assert dev.max() == pytest.approx(m["max_deviation_tokens"])
    assert 1_000_000 - 8192 < tokens.sum() <= 1_000_000 == m["total_tokens"]
    recs = {r["name"]: r for r in m["sources"]}
    for s, name in enumerate(idx.source_names):
        mine = source == s
        assert recs[name]["tokens"] == tokens[mine].sum()
        assert recs[name]["samples"] == idx["num_samples"][mine].sum()
        assert recs[name]["passes"] == pytest.approx(recs[name]["tokens"] / recs[name]["tokens_held"])
        assert recs[name]["whole_passes"] == int(np.floor(recs[name]["passes"])) or recs[name]["passes"] < 1
    # books (0.19 of 1M tokens, 76k held) repeats; web (0.51 of it, 627k held) is a subset
    assert recs["books"]["whole_passes"] >= 1 and recs["books"]["most_uses"] == recs["books"]["whole_passes"] + 1
    assert recs["web"]["passes"] < 1 and recs["web"]["most_uses"] == 1
    assert recs["code"]["column"] == "content"
    # the weights switch at 0.7 of the run: books gets more than its early share after it
    x = np.cumsum(tokens) / tokens.sum()
    late = x > 0.75
    assert tokens[late & (source == 2)].sum() / tokens[late].sum() == pytest.approx(0.4, abs=0.05)
    assert tokens[~late & (source == 2)].sum() / tokens[~late].sum() == pytest.approx(0.1, abs=0.05)


@pytest.mark.slow
@pytest.mark.mpi
def test_a_mixture_reports_the_empty_samples_it_drops(tmp_path):
    # the rows were dropped, but neither the run's lines nor inspect said so
    write_text_parquet(tmp_path / "a.parquet", np.where(np.arange(60) % 3 == 0, 0, 5 + np.arange(60)), 20)
    write_text_parquet(tmp_path / "b.parquet", np.where(np.arange(40) % 8 == 0, 0, 9 + np.arange(40)), 20)
    proc = run_sortpack(["run", "--blend", f"1 {tmp_path / 'a.parquet'} 1 {tmp_path / 'b.parquet'}", "-o",
                         str(tmp_path / "plan"), "--max-tokens", "256"])
    assert "dropped 25 empty samples (no content; --keep-empty keeps them)" in proc.stdout
    report = json.loads(run_sortpack(["inspect", str(tmp_path / "plan"), "--json"]).stdout)
    assert report["empty_dropped"] == 25
    assert not set(PackedIndex(tmp_path / "plan").all_sample_ids().tolist()) & set(range(0, 60, 3))


def test_whole_passes_and_most_uses_are_the_fewest_and_most_uses_of_a_sample(tmp_path):
    # many small sources: some get a part pass that takes every sample of theirs, and used to
    # report whole_passes 0 although each of their samples is used once
    rng = np.random.default_rng(0)
    sources = []
    for k in range(5):
        write_text_parquet(tmp_path / f"s{k}.parquet", rng.integers(1, 50, size=3), 3)
        sources.append({"name": f"s{k}", "inputs": [f"s{k}.parquet"], "weight": float(rng.integers(1, 5))})
    (tmp_path / "mix.json").write_text(json.dumps({"sources": sources, "seed": 0}))
    run_sortpack(["run", "--mixture", str(tmp_path / "mix.json"), "-o", str(tmp_path / "plan"), "--max-tokens", "64"])
    idx = PackedIndex(tmp_path / "plan")
    uses = np.bincount(idx.all_sample_ids(), minlength=15)
    recs = idx.manifest["mixture"]["sources"]
    assert any(r["part_pass"]["samples"] == r["samples_held"] and r["whole_passes"] for r in recs)  # the case
    for k, r in enumerate(recs):
        mine = uses[3 * k:3 * k + 3]
        assert (r["whole_passes"], r["most_uses"]) == (int(mine.min()), int(mine.max())), (r["name"], mine)


@pytest.mark.slow
def test_the_plan_is_byte_identical_at_any_rank_count(data, tmp_path):
    assert_same_at_ranks(["run", "--mixture", data / "mix.json", "--max-tokens", "8192", "--stages", "2", "--key",
                          "size", "--shapes", "auto:4", "--quiet"], tmp_path, timeout=120)


def test_stages_advance_within_each_source(data):
    _run(data, "staged", "--stages", "3", "--key", "size")
    idx = PackedIndex(data / "staged")
    stage, source = idx["stage"], idx["source"]
    for s in range(3):
        st = stage[source == s].astype(np.int64)
        # ascending as the run advances, but for the source's last few micro-batches
        assert np.all(np.diff(st[:-3]) >= 0) and set(st.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("opts", [["--budget", "tokens"], ["--shapes", "256,1024,4096"],
                                  ["--rows", "4096"], ["--same-shape", "--group-size", "2"],
                                  # groups of fewer samples than micro-batches: empty ones close them
                                  ["--same-shape", "--group-size", "8", "--max-tokens", "1024", "--oversize", "skip"],
                                  ["--pad-to-multiple", "64", "--static-shapes"]])
def test_packing_options_apply_within_each_source(data, opts):
    _run(data, "opts", *opts)
    idx = PackedIndex(data / "opts")
    m = idx.manifest["mixture"]
    source = idx["source"].astype(np.int64)
    dev = deviations(idx["tokens"], source, schedule_from_dict(m["schedule"], idx.source_names), m["target_tokens"])
    assert dev.max() <= m["bound_tokens"]
    if "--same-shape" in opts:  # groups move whole: each group is one source and one shape
        g = int(opts[opts.index("--group-size") + 1])
        assert np.all(source.reshape(-1, g) == source[::g, None])
        assert np.all(idx["padded_size"].reshape(-1, g) == idx["padded_size"][::g, None])
        if g == 8:
            assert (idx["num_samples"] == 0).any()  # the case this parameter is for


def test_without_total_tokens_no_sample_is_used_twice(data):
    spec = json.loads((data / "mix.json").read_text())
    del spec["total_tokens"]
    (data / "mix-once.json").write_text(json.dumps(spec))
    _run(data, "once", mix="mix-once.json")
    idx = PackedIndex(data / "once")
    ids = idx.all_sample_ids()
    assert len(np.unique(ids)) == len(ids)
    recs = idx.manifest["mixture"]["sources"]
    assert max(r["passes"] for r in recs) > 0.9  # the scarcest source (for its share) is nearly used up
    assert all(r["most_uses"] <= 1 for r in recs)


@pytest.mark.slow
def test_blend_and_store_and_inspect(data, tmp_path):
    (tmp_path / "web").symlink_to(data / "web")
    (tmp_path / "books").symlink_to(data / "books")
    run_sortpack(["run", "--blend", f"70 {tmp_path / 'web'} 30 {tmp_path / 'books'}", "--total-tokens", "600000",
                  "-o", str(tmp_path / "b"), "--max-tokens", "8192", "--store", "text"])
    from sortpack.reader import PackedSampler, SourceDataset

    idx = PackedIndex(tmp_path / "b")
    assert [s["weight"] for s in idx.manifest["mixture"]["sources"]] == [70, 30]
    stored, files = SourceDataset(idx, columns=["text"]), SourceDataset(idx, columns=["text"], stored=False)
    seen = set()
    for mb in PackedSampler(idx):
        assert [r["text"] for r in stored.__getitems__(mb)] == [r["text"] for r in files.__getitems__(mb)]
        seen.add(mb.source)
    assert seen == {str(tmp_path / "web"), str(tmp_path / "books")}
    out = run_sortpack(["inspect", str(tmp_path / "b"), "--json"]).stdout
    rep = json.loads(out)["mixture"]
    assert rep["max_deviation_tokens"] <= rep["bound_tokens"]
    assert [s["name"] for s in rep["sources"]] == [str(tmp_path / "web"), str(tmp_path / "books")]
    assert sum(s["tokens"] for s in rep["sources"]) == rep["tokens"]
    text = run_sortpack(["inspect", str(tmp_path / "b"), "--plot", str(tmp_path / "b.png")]).stdout
    assert "largest deviation from the schedule over every prefix" in text
    assert (tmp_path / "b.png").stat().st_size > 10_000


# --- errors ------------------------------------------------------------------------------------------
BAD_SPECS = {
    "weight not positive": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 0}]}, "weights must be positive"),
    "unknown key": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1}], "total": 5}, "unknown key 'total'"),
    "unknown source key": ({"sources": [{"name": "a", "inputs": ["x"], "weigth": 1}]}, "unknown key 'weigth'"),
    "schedule unknown source": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1}],
                                 "schedule": [{"until": 1.0, "weights": {"b": 1}}]}, "unknown source 'b'"),
    "schedule not ending at 1": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1}],
                                  "schedule": [{"until": 0.5}]}, "must end at 1.0"),
    "no weight": ({"sources": [{"name": "a", "inputs": ["x"]}]}, "has no 'weight'"),
    "duplicate name": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1},
                                    {"name": "a", "inputs": ["y"], "weight": 1}]}, "appears twice"),
    "no inputs": ({"sources": [{"name": "a", "inputs": [], "weight": 1}]}, "'inputs' must be a non-empty"),
    "bad total": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1}], "total_tokens": -3}, "total_tokens"),
    "total 1e30": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1}], "total_tokens": 1e30}, "2\\*\\*53"),
    "total 2^63-1": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1}], "total_tokens": 2**63 - 1},
                     "total_tokens 9.22e\\+18 is more than 2\\*\\*53"),
    "total inf": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1}], "total_tokens": float("inf")},
                  "positive integer"),
    "never used": ({"sources": [{"name": "a", "inputs": ["x"], "weight": 1}, {"name": "b", "inputs": ["y"],
                                                                              "weight": 1}],
                    "schedule": [{"until": 1.0, "weights": {"b": 0}}]}, "weight 0 in every phase"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_specs_are_one_line_errors(case):
    spec, message = BAD_SPECS[case]
    with pytest.raises(SortpackError, match=message):
        parse_mixture(spec)


def test_blend_parsing():
    mix = parse_blend("70 data/web 30 data/code")
    assert mix.names == ["data/web", "data/code"] and mix.schedule.shares().tolist() == [0.7, 0.3]
    with pytest.raises(SortpackError, match="pairs of weight and path"):
        parse_blend("70 data/web 30")
    with pytest.raises(SortpackError, match="not a weight"):
        parse_blend("data/web 70")


CLI_ERRORS = {
    "positional inputs": (["run", "web/", "--mixture", "mix.json"], "give no INPUTS"),
    "both forms": (["run", "--mixture", "mix.json", "--blend", "1 web/"], "exclude each other"),
    "missing file": (["run", "--mixture", "nope.json"], "nope.json: no such file"),
    "bad json": (["run", "--mixture", "web/a.parquet"], "not a JSON file"),
    "source without rows": (["run", "--mixture", "empty.json"], "mixture source 'empty'"),
    "missing column": (["run", "--mixture", "nocol.json"], "mixture source 'code'"),
    "total without mixture": (["run", "web/", "--total-tokens", "5"], "apply to a mixture"),
    "bad total": (["run", "--blend", "1 web/", "--total-tokens", "0"], "--total-tokens 0"),
    "tiny total": (["run", "--blend", "1 web/", "--total-tokens", "3"], "smaller than the first micro-batch"),
    "int64 total": (["run", "--blend", "1 web/", "--total-tokens", str(2**63 - 1)], "--total-tokens 9.22e+18"),
    "absurd passes": (["run", "--blend", "1 web/", "--total-tokens", str(10**13)], "passes over its"),
    "absurd total in MIX.json": (["run", "--mixture", "huge.json"], "total_tokens 1e+30 is more than 2**53"),
    "negative weight": (["run", "--blend", "-1 web/ 2 code/"], "weights must be positive"),
    # seeds are 64-bit keys (as `inspect --seed`): 2^64 would be seed 0 under another name
    "negative seed": (["run", "--blend", "1 web/", "--seed", "-1"], "--seed -1: must be >= 0"),
    "seed of 2^64": (["run", "--blend", "1 web/", "--seed", str(2**64)], f"--seed {2**64}: must be below 2^64"),
}


@pytest.mark.parametrize("case", sorted(CLI_ERRORS))
def test_cli_errors_are_one_line_exit_2_and_write_nothing(data, case):
    (data / "empty").mkdir(exist_ok=True)
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), data / "empty" / "e.parquet")
    (data / "empty.json").write_text(json.dumps({"sources": [{"name": "web", "inputs": ["web/"], "weight": 1},
                                                             {"name": "empty", "inputs": ["empty/"], "weight": 1}]}))
    (data / "nocol.json").write_text(json.dumps({"sources": [{"name": "code", "inputs": ["code/"], "weight": 1}]}))
    (data / "huge.json").write_text(json.dumps({"sources": [{"name": "web", "inputs": ["web/"], "weight": 1}],
                                                "total_tokens": 1e30}))
    args, message = CLI_ERRORS[case]
    out = data / f"err-{case.replace(' ', '-')}"
    args = [a if a.startswith("-") or a in ("run",) or " " in a or a.isdigit() else str(data / a) for a in args]
    args = [a if " " not in a else " ".join(p if p.lstrip("-").isdigit() else str(data / p) for p in a.split())
            for a in args]
    proc = run_sortpack([*args, "-o", str(out), "--max-tokens", "8192"], check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [None, 2])
def test_an_oversize_mixture_is_refused_before_its_sort(data, ranks):
    # the sort would crash on rank 0: the oversize refusal must come before it, on every rank
    out = data / f"oversize-{ranks}"
    proc = run_sortpack(["run", "--mixture", str(data / "mix.json"), "-o", str(out), "--max-tokens", "256"],
                        ranks=ranks, check=False, env={"SORTPACK_FAULT": "sort:0"})
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(set(lines)) == 1, proc.stderr
    assert "--oversize split" in lines[0] and "samples" in lines[0]
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["skip", "truncate"])
def test_a_mixture_records_the_tokens_skip_and_truncate_lose(data, policy):
    # one source and every sample once: the blend loses exactly what a plain run of it loses
    flags = ["--max-tokens", "1024", "--oversize", policy]
    run_sortpack(["run", "--blend", f"1 {data / 'web'}", "-o", str(data / f"lost-{policy}"), "--overwrite", *flags])
    run_sortpack(["run", str(data / "web"), "-o", str(data / f"plain-{policy}"), "--overwrite", *flags])
    mixed, plain = (read_manifest(data / f"{k}-{policy}")["stats"] for k in ("lost", "plain"))
    key = f"{policy}ped_tokens" if policy == "skip" else "truncated_tokens"
    assert mixed[key] == plain[key] > 0


def test_a_part_pass_uses_every_length_quartile_r_times(tmp_path):
    """A source used half (log-uniform lengths): each length quartile is used half, not by whole micro-batches."""
    rng = np.random.default_rng(0)
    n = 4000
    lengths = {name: np.exp(rng.uniform(np.log(16), np.log(4096), n)).astype(np.int64) for name in ("a", "b")}
    for name, n_col in lengths.items():
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"n": n_col}), tmp_path / name / "p.parquet")
    held = int(lengths["a"].sum())
    (tmp_path / "mix.json").write_text(json.dumps({
        "sources": [{"name": "a", "inputs": ["a"], "weight": 0.5}, {"name": "b", "inputs": ["b"], "weight": 0.5}],
        "total_tokens": held, "seed": 1}))
    run_sortpack(["run", "--mixture", str(tmp_path / "mix.json"), "-o", str(tmp_path / "plan"), "--size", "column:n",
                  "--max-tokens", "16384"])
    idx = PackedIndex(tmp_path / "plan")
    ids = idx.all_sample_ids()
    a = lengths["a"]
    uses = np.bincount(ids[ids < n], minlength=n)
    r = float((uses * a).sum() / held)
    assert set(np.unique(uses).tolist()) <= {0, 1} and 0.45 < r < 0.55
    quartile = np.empty(n, np.int64)
    quartile[np.lexsort((np.arange(n), a))] = np.arange(n) * 4 // n
    means = [float(uses[quartile == q].mean()) for q in range(4)]
    assert max(abs(m - r) for m in means) <= 0.1, (means, r)
    rec = idx.manifest["mixture"]["sources"][0]
    assert rec["part_pass"]["samples"] >= rec["unique_samples"] and rec["whole_passes"] == 0


# --- a source's own column, stored text and stored token ids ------------------------------------------
WORDS = "hello world the quick brown fox".split()


@pytest.fixture(scope="module")
def wordy(tmp_path_factory):
    """Two sources of word texts: prose (column 'text'), code (column 'content' and a decoy 'text')."""
    from support import make_tokenizer

    root = tmp_path_factory.mktemp("wordy")
    rng = np.random.default_rng(3)

    def texts(n, most):
        return [" ".join(rng.choice(WORDS, int(k))) for k in rng.integers(1, most, n)]

    (root / "prose").mkdir()
    (root / "code").mkdir()
    pq.write_table(pa.table({"text": texts(300, 60), "id": np.arange(300)}), root / "prose" / "a.parquet",
                   row_group_size=70)
    content = texts(200, 120)
    pq.write_table(pa.table({"content": content, "text": ["decoy"] * 200}), root / "code" / "a.parquet",
                   row_group_size=50)
    (root / "mix.json").write_text(json.dumps({
        "sources": [{"name": "prose", "inputs": ["prose/"], "weight": 0.5},
                    {"name": "code", "inputs": ["code/"], "weight": 0.5, "column": "content"}],
        "total_tokens": 12000}))
    make_tokenizer(root / "tok.json")
    return root


def _run_tokens(root: Path, out: str, ranks=None, *extra):
    return run_sortpack(["run", "--mixture", str(root / "mix.json"), "-o", str(root / out), "--size", "tokens",
                         "--tokenizer", str(root / "tok.json"), "--max-tokens", "256", "--store-tokens",
                         "--store", "text", "--overwrite", *extra], ranks=ranks)


@pytest.mark.slow
def test_a_mixture_stores_token_ids_and_reads_each_source_column_as_the_plan_column(wordy):
    from tokenizers import Tokenizer

    from sortpack.reader import PackedSampler, SourceDataset

    _run_tokens(wordy, "tok1")
    idx = PackedIndex(wordy / "tok1")
    assert idx.manifest["options"]["column"] == "text"
    assert idx.manifest["data"]["columns"] == ["text", "input_ids"]
    tok = Tokenizer.from_file(str(wordy / "tok.json"))
    content = pq.read_table(wordy / "code" / "a.parquet").column("content").to_pylist()
    prose = pq.read_table(wordy / "prose" / "a.parquet").column("text").to_pylist()
    truth = prose + content  # global ids: prose's rows, then code's
    stored, files = SourceDataset(idx), SourceDataset(idx, stored=False)
    seen = set()
    for mb in PackedSampler(idx):
        rows = stored.__getitems__(mb)
        from_files = files.__getitems__(mb)
        for i, row, frow in zip(list(mb), rows, from_files):
            # one name, whatever the source calls it: the stored row and the input file's row agree
            assert row["text"] == frow["text"] == truth[i]
            assert row["input_ids"] == tok.encode(truth[i]).ids
        seen.add(mb.source)
    assert seen == {"prose", "code"}
    assert "content" not in files[300] and files[300]["text"] == content[0]  # the decoy 'text' is not read
    # what the recipes read: SourceDataset(index, columns=["text"]), from the input files too
    assert SourceDataset(idx, columns=["text"], stored=False)[300] == {"text": content[0]}


@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.slow
def test_a_mixture_with_stored_tokens_is_byte_identical_at_any_rank_count(wordy, ranks):
    if not (wordy / "tok1" / "manifest.json").exists():
        _run_tokens(wordy, "tok1")
    _run_tokens(wordy, f"tok{ranks}", ranks)
    one = json.loads((wordy / "tok1" / "manifest.json").read_text())
    other = json.loads((wordy / f"tok{ranks}" / "manifest.json").read_text())
    assert one["content_hash"] == other["content_hash"]
    for shard in one["shards"] + one["data"]["shards"]:
        assert (wordy / "tok1" / shard["file"]).read_bytes() == (wordy / f"tok{ranks}" / shard["file"]).read_bytes()


COLUMN_ERRORS = {
    "store missing": (["--store", "nope"], "mixture source 'prose': ", "no column 'nope' (--store nope"),
    "source column missing": (["--store", "text"], "mixture source 'code': ", "no column 'body' (its 'column'"),
    "dataset store missing": (["--store", "nope"], "", "no column 'nope' (--store"),
    "dataset column missing": (["--column", "body", "--size", "length"], "", "no column 'body' (--column"),
}


@pytest.mark.parametrize("case", sorted(COLUMN_ERRORS))
@pytest.mark.parametrize("ranks", [None, 2])
def test_a_missing_column_is_refused_before_analyze(wordy, case, ranks):
    extra, where, message = COLUMN_ERRORS[case]
    if case == "source column missing":
        spec = json.loads((wordy / "mix.json").read_text())
        spec["sources"][1]["column"] = "body"
        (wordy / "mix-body.json").write_text(json.dumps(spec))
        job = ["--mixture", str(wordy / "mix-body.json")]
    elif case.startswith("dataset"):
        job = [str(wordy / "prose")]
    else:
        job = ["--mixture", str(wordy / "mix.json")]
    out = wordy / f"colerr-{case.replace(' ', '-')}-{ranks}"
    proc = run_sortpack(["run", *job, "-o", str(out), "--max-tokens", "4096", *extra], ranks=ranks, check=False,
                        env={"SORTPACK_PROGRESS_DELAY": "0"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    # one line, before any progress line: nothing was measured
    assert len(lines) == 1 and where in lines[0] and message in lines[0] and "a.parquet" in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [None, 2])
@pytest.mark.parametrize("total", [str(10**30), str(10**13)])
def test_an_absurd_total_is_refused_at_once_on_every_rank(data, ranks, total):
    # 10**30 is past what a plan counts exactly; 10**13 asks web for millions of passes: both a typo,
    # and planning either would run for ever
    out = data / f"err-total-{total}-{ranks}"
    proc = run_sortpack(["run", "--blend", f"1 {data / 'web'}", "--total-tokens", total, "-o", out,
                         "--max-tokens", "8192"], ranks=ranks, check=False, timeout=90)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--total-tokens" in lines[0] and "a typo?" in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("weights", [(1e308, 1e308), (1e-320, 3e-320), (1.7e308, 0.6e308)])
def test_extreme_weights_are_exact_shares_without_warnings(weights):
    # two weights of 1e308 would overflow their sum (numpy warnings, then "weight 0 in every phase")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mix = parse_blend(f"{weights[0]!r} web/ {weights[1]!r} code/")
        shares = mix.schedule.shares()
        spec = {"sources": [{"name": "a", "inputs": ["x"], "weight": weights[0]},
                            {"name": "b", "inputs": ["y"], "weight": 1}],
                "schedule": [{"until": 0.5}, {"until": 1.0, "weights": {"b": weights[1]}}]}
        assert parse_mixture(spec).schedule.shares().sum() == pytest.approx(1.0)
    big = max(weights)
    assert shares.tolist() == pytest.approx([w / big / sum(x / big for x in weights) for w in weights])
    assert shares.sum() == pytest.approx(1.0) and (shares > 0).all()


@pytest.mark.slow
def test_two_weights_of_1e308_run_without_noise(data):
    out = data / "huge-weights"
    proc = run_sortpack(["run", "--blend", f"1e308 {data / 'web'} 1e308 {data / 'books'}", "-o", out,
                         "--max-tokens", "8192", "--quiet", "--overwrite"], timeout=120)
    assert proc.stderr == "" and PackedIndex(out).manifest["mixture"]["sources"][0]["share"] == pytest.approx(0.5)


@pytest.mark.parametrize("ranks", [None, 2])
@pytest.mark.parametrize("extra, message", [(["--stages", "20000"], "--stages 20000 with 2 mixture sources")])
def test_a_refusal_after_the_first_collective_is_printed_once(data, ranks, extra, message):
    # at 2 ranks too: printed once, without MPI_Abort lines
    out = data / f"err-after-{extra[0]}-{ranks}"
    proc = run_sortpack(["run", "--blend", f"1 {data / 'web'} 1 {data / 'books'}", "-o", out, "--max-tokens",
                         "8192", *extra], ranks=ranks, check=False, timeout=90)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"Error: {message}" + proc.stderr.split(message, 1)[1].rstrip()]
    assert "MPI_Abort" not in proc.stderr and not out.exists()
