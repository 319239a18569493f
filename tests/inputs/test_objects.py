"""Object-store inputs: s3:// URLs read through pyarrow's S3 filesystem from a real server.

The server is moto's S3 server on 127.0.0.1 (tests/object_store.py), reached over HTTP with
checked credentials; the same data on local disk is the reference: a plan of objects must
equal the plan of the files (content_hash and index shards) at any rank count.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.inputs.columnar_formats import arrow_file_batches
from sortpack.inputs.discover import expand_inputs
from sortpack.inputs.objects import glob_regex
from sortpack.reader import PackedIndex, SourceDataset

from object_store import BAD_KEY
from support import lognormal, run_sortpack, write_text_parquet


def _texts(n: int, seed: int) -> list[str]:
    return ["w" * int(k) for k in lognormal(n, seed, 900)]


def _corpus(root: Path) -> Path:
    """Write every input format below ``root/data`` (and a hidden file the prefix must skip); return it."""
    data = root / "data"
    (data / "web").mkdir(parents=True)
    (data / "_tmp").mkdir()
    write_text_parquet(data / "web" / "a.parquet", lognormal(700, 1, 900), 150)
    write_text_parquet(data / "web" / "b.parquet", lognormal(400, 2, 900), 100)
    table = pa.table({"text": _texts(300, 3)})
    with pa.ipc.new_file(data / "c.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=70):
            w.write_batch(batch)
    (data / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(200, 4)))
    (data / "e.csv").write_text("text\n" + "".join(t + "\n" for t in _texts(150, 5)))
    (data / "_tmp" / "skip.parquet").write_bytes(b"not parquet")
    return data


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, s3_server):
    """The corpus on disk and the same files as objects under s3://corpus/data/."""
    root = tmp_path_factory.mktemp("objects")
    data = _corpus(root)
    s3_server.bucket("corpus")
    s3_server.upload_tree(data, "s3://corpus/data")
    return root, data


def _run(server, args, ranks=None, check=True, **env):
    return run_sortpack(args, ranks=ranks, check=check, timeout=240, env=server.env(**env))


@pytest.mark.slow
def test_discover_objects_file_prefix_and_glob(corpus, s3_env):
    _, data = corpus
    local = expand_inputs([str(data)])
    urls = expand_inputs(["s3://corpus/data/"])
    assert [u.path for u in urls] == ["s3://corpus/data/" + Path(p.path).relative_to(data).as_posix() for p in local]
    assert [u.format for u in urls] == [p.format for p in local] == ["arrow", "jsonl", "csv", "parquet", "parquet"]
    for pattern in ("**/*.parquet", "w*/?.parquet"):  # the same files as Python's glob finds locally
        assert [u.path for u in expand_inputs([f"s3://corpus/data/{pattern}"])] == \
            ["s3://corpus/data/" + Path(p.path).relative_to(data).as_posix()
             for p in expand_inputs([f"{data}/{pattern}"])]
    assert [u.path for u in expand_inputs(["s3://corpus/data/web/b.parquet"])] == ["s3://corpus/data/web/b.parquet"]
    with pytest.raises(SortpackError, match=r"s3://corpus/nope: no such object or prefix"):
        expand_inputs(["s3://corpus/nope"])
    with pytest.raises(SortpackError, match="no object matches"):
        expand_inputs(["s3://corpus/data/*.txt"])
    with pytest.raises(SortpackError, match="unsupported URL scheme 'http'"):
        expand_inputs(["http://example.com/a.parquet"])


@pytest.mark.parametrize("pattern, key, hit", [("a/*.parquet", "a/b.parquet", True),
                                                ("a/*.parquet", "a/x/b.parquet", False),
                                                ("a/**/*.parquet", "a/b.parquet", True),
                                                ("a/**/*.parquet", "a/x/y/b.parquet", True),
                                                ("a/?.csv", "a/bb.csv", False), ("a/[!x].csv", "a/b.csv", True)])
def test_glob_regex_follows_glob_rules(pattern, key, hit):
    assert bool(glob_regex(pattern).match(key)) is hit


def _index_bytes(plan: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(plan.glob("*.arrow"))}


@pytest.mark.mpi
@pytest.mark.slow
def test_plan_of_objects_equals_plan_of_files_at_1_and_2_ranks(corpus, s3_server):
    root, data = corpus
    opts = ["--max-tokens", "4096", "--overwrite"]
    _run(s3_server, ["run", str(data), "-o", root / "local", *opts])
    _run(s3_server, ["run", "s3://corpus/data/", "-o", root / "obj1", *opts])
    _run(s3_server, ["run", "s3://corpus/data/", "-o", root / "obj2", *opts], ranks=2)
    local, obj1, obj2 = (json.loads((root / n / "manifest.json").read_text()) for n in ("local", "obj1", "obj2"))
    assert local["content_hash"] == obj1["content_hash"] == obj2["content_hash"]
    assert _index_bytes(root / "local") == _index_bytes(root / "obj1") == _index_bytes(root / "obj2")
    # where and which version: the provenance, per file; the URL, size and ETag of each object
    paths = obj2["provenance"]["source_paths"]
    assert paths == ["s3://corpus/data/" + Path(p).relative_to(data).as_posix()
                     for p in local["provenance"]["source_paths"]]
    assert [f["bytes"] for f in obj2["source"]["files"]] == [f["bytes"] for f in local["source"]["files"]]
    etags = obj2["provenance"]["source_etags"]
    assert all(isinstance(e, str) and len(e) == 32 for e in etags)  # moto: the md5 of a single PUT
    assert "source_etags" not in local["provenance"]
    # nothing of the credentials or the endpoint is written
    text = (root / "obj2" / "manifest.json").read_text()
    assert s3_server.key not in text and s3_server.secret not in text and s3_server.endpoint not in text


@pytest.mark.mpi
@pytest.mark.slow
def test_mixture_of_a_local_and_an_object_source(corpus, s3_server, s3_env, tmp_path):
    root, data = corpus
    spec = {"sources": [{"name": "web", "inputs": [str(data / "web")], "weight": 0.5},
                        {"name": "objects", "inputs": ["s3://corpus/data/c.arrow", "s3://corpus/data/d.jsonl"],
                         "weight": 0.5}]}
    (tmp_path / "mix.json").write_text(json.dumps(spec))
    _run(s3_server, ["run", "--mixture", tmp_path / "mix.json", "-o", tmp_path / "plan", "--max-tokens", "4096"],
         ranks=2)
    idx = PackedIndex(tmp_path / "plan")
    assert idx.source_names == ["web", "objects"]
    web_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in sorted((data / "web").glob("*.parquet")))
    ds = SourceDataset(idx, columns=["text"])
    assert len(ds) == web_rows + 300 + 200
    # every sample id of the objects' source reads the row the object holds
    obj_texts = pa.ipc.open_file(data / "c.arrow").read_all().column("text").to_pylist() + \
        [json.loads(line)["text"] for line in (data / "d.jsonl").read_text().splitlines()]
    picks = np.arange(web_rows, len(ds), 37)
    assert [r["text"] for r in ds.__getitems__(picks.tolist())] == [obj_texts[i - web_rows] for i in picks]
    # --blend takes URLs too
    _run(s3_server, ["run", "--blend", f"1 {data / 'web'} 1 s3://corpus/data/c.arrow", "-o", tmp_path / "blend",
                     "--max-tokens", "4096"])
    assert PackedIndex(tmp_path / "blend").source_names == [str(data / "web"), "s3://corpus/data/c.arrow"]


@pytest.mark.slow
def test_pack_store_refuses_a_changed_object(corpus, s3_server, tmp_path):
    root, data = corpus
    s3_server.bucket("changing")
    for name in ("web/a.parquet", "d.jsonl"):
        s3_server.upload(data / name, f"s3://changing/{name}")
    _run(s3_server, ["run", "s3://changing/", "-o", tmp_path / "plan", "--max-tokens", "4096",
                     "--keep-intermediate"])

    def pack(out):
        return _run(s3_server, ["pack", tmp_path / "plan.sorted", "-o", tmp_path / out, "--max-tokens", "4096",
                                "--store", "text"], check=False)

    # the same bytes uploaded again (one PUT): the same ETag, accepted
    s3_server.upload(data / "web" / "a.parquet", "s3://changing/web/a.parquet")
    assert pack("stored").returncode == 0
    assert PackedIndex(tmp_path / "stored").stored is not None
    # the same bytes as a multipart upload: a new ETag (a new version) of a Parquet object, refused as
    # a new mtime of a local Parquet file is; a JSONL object with two lines swapped (same size): refused
    # by its whole-file sha256
    client = s3_server.client()
    up = client.create_multipart_upload(Bucket="changing", Key="web/a.parquet")
    part = client.upload_part(Bucket="changing", Key="web/a.parquet", UploadId=up["UploadId"], PartNumber=1,
                              Body=(data / "web" / "a.parquet").read_bytes())
    client.complete_multipart_upload(Bucket="changing", Key="web/a.parquet", UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    for out, url, why in (("again", "s3://changing/web/a.parquet", "modified since analyze (ETag"),
                          ("again2", "s3://changing/d.jsonl", "content changed since analyze")):
        proc = pack(out)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1, proc.stderr
        assert f"{url}: {why}" in err[0] and "analyze it again" in err[0]
        assert not (tmp_path / out).exists()
        s3_server.upload(data / "web" / "a.parquet", "s3://changing/web/a.parquet")  # back to the PUT's ETag
        lines = (data / "d.jsonl").read_text().splitlines(keepends=True)
        client.put_object(Bucket="changing", Key="d.jsonl", Body="".join([lines[1], lines[0], *lines[2:]]).encode())


@pytest.mark.parametrize("case", ["missing", "bad credentials", "unreachable", "url output"])
def test_object_errors_are_one_line_exit_2_nothing_written(corpus, s3_server, tmp_path, case):
    url, env, out = "s3://corpus/data/web/a.parquet", {}, str(tmp_path / "out")
    if case == "missing":
        url, want = "s3://corpus/data/web/zz.parquet", "s3://corpus/data/web/zz.parquet: no such object"
    elif case == "bad credentials":
        env, want = BAD_KEY, "s3://corpus/data/web/a.parquet: access denied"
    elif case == "unreachable":
        env, want = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "SORTPACK_OBJECT_TIMEOUT": "2"}, "cannot reach"
    else:
        out, want = "s3://corpus/out", "-o s3://corpus/out: sortpack writes its output to a local"
    t0 = time.monotonic()
    with s3_server.checking_credentials() if case == "bad credentials" else contextlib.nullcontext():
        proc = _run(s3_server, ["run", url, "-o", out, "--max-tokens", "4096"], check=False, **env)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert want in err[0]
    assert time.monotonic() - t0 < 60
    assert list(tmp_path.iterdir()) == []


@pytest.mark.torch
@pytest.mark.parametrize("store", [False, True])
@pytest.mark.slow
def test_plan_loader_reads_a_plan_of_objects(corpus, s3_server, s3_env, tmp_path, store):
    torch = pytest.importorskip("torch")
    from sortpack.torch import PackedBatchSampler, PlanLoader, pad_collate
    root, data = corpus
    extra = ["--store", "text"] if store else []
    _run(s3_server, ["run", "s3://corpus/data/web/", "-o", tmp_path / "plan", "--max-tokens", "4096", *extra])
    _run(s3_server, ["run", str(data / "web"), "-o", tmp_path / "local", "--max-tokens", "4096"])
    texts = pq.read_table(data / "web" / "a.parquet").column("text").to_pylist() + \
        pq.read_table(data / "web" / "b.parquet").column("text").to_pylist()

    def encode(row):
        return {"input_ids": [ord(c) - 96 for c in row["text"]]}

    def batches(plan):
        ds = SourceDataset(plan, columns=["text"], transform=encode)
        assert (ds.stored is not None) is (store and plan == tmp_path / "plan")
        sampler = PackedBatchSampler(plan, rank=1, world_size=2, order="shuffle", seed=5)
        return list(PlanLoader(ds, sampler, pad_collate(key="input_ids"), prefetch=2))

    got, ref = batches(tmp_path / "plan"), batches(tmp_path / "local")
    assert len(got) == len(ref) > 3
    for a, b in zip(got, ref):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["sample_ids"], b["sample_ids"])
        for row, sid in enumerate(a["sample_ids"].tolist()):
            n = len(texts[sid])
            assert a["input_ids"][row, :n].tolist() == [ord(c) - 96 for c in texts[sid]]


@settings(max_examples=25)
@given(st.lists(st.integers(0, 300), min_size=0, max_size=8), st.sampled_from([None, "lz4", "zstd"]))
def test_arrow_batches_from_the_footer_and_headers_match_the_reader(tmp_path_factory, sizes, compression):
    # what an object's Arrow file is described by: its footer and batch headers only, no body read
    path = tmp_path_factory.mktemp("ipc") / "x.arrow"
    schema = pa.schema([("text", pa.string()), ("n", pa.int64())])
    with pa.ipc.new_file(path, schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for n in sizes:
            w.write_batch(pa.record_batch([pa.array(["t" * (i % 9) for i in range(n)]), pa.array(range(n))],
                                          schema=schema))
    with pa.memory_map(str(path)) as fh:
        got = arrow_file_batches(fh, path.stat().st_size)
    assert got is not None and [rows for rows, _ in got] == sizes
    with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_stream(fh, schema) as w:
        w.write_batch(pa.record_batch([pa.array(["a"]), pa.array([1])], schema=schema))
    with pa.memory_map(str(path)) as fh:
        assert arrow_file_batches(fh, path.stat().st_size) is None  # a stream: no footer


@pytest.mark.torch
@pytest.mark.slow
def test_prefetched_reads_the_units_of_an_unstored_plan_ahead_in_the_sampler_order(corpus, s3_server, s3_env,
                                                                                   tmp_path):
    pytest.importorskip("torch")
    from sortpack.reader import Prefetched
    from sortpack.torch import PackedBatchSampler, PlanLoader, pad_collate
    root, data = corpus
    _run(s3_server, ["run", "s3://corpus/data/web/", "-o", tmp_path / "plan", "--max-tokens", "2048"])

    def encode(row):
        return {"input_ids": [1 + len(row["text"]) % 7] * len(row["text"])}

    def loader(warm: bool):
        ds = SourceDataset(tmp_path / "plan", columns=["text"], transform=encode, cache_units=2)
        sampler = PackedBatchSampler(tmp_path / "plan", rank=0, world_size=2, order="shuffle", seed=1)
        return ds, (Prefetched(sampler, dataset=ds, ahead_units=4) if warm else sampler)

    ds, plain = loader(False)
    ref = [b["sample_ids"].tolist() for b in PlanLoader(ds, plain, pad_collate(key="input_ids"))]
    ds, warm = loader(True)
    order = warm.schedule().reshape(-1).tolist()  # this pass's schedule (the next pass has its own)
    index = PackedIndex(tmp_path / "plan")
    want = list(dict.fromkeys(key for mb in order for key in ds.units_of(index.microbatch(mb))))
    ahead, read = [], ds.read_unit

    def read_unit(k, u):
        if threading.current_thread().name == "sortpack-warm-units":
            ahead.append((k, u))
        return read(k, u)

    ds.read_unit = read_unit
    got = [b["sample_ids"].tolist() for b in PlanLoader(ds, warm, pad_collate(key="input_ids"))]
    assert got == ref and len(got) > 3
    warmer = warm.last
    assert warmer is not None and warmer.error is None and warmer.warmed == len(ahead) > 0
    # read ahead in the order the schedule first needs the units, each once
    assert ahead == [key for key in want if key in set(ahead)]
    assert ds._warm is None  # the pass's end stopped it
    with pytest.raises(ValueError, match="dataset=SourceDataset"):
        Prefetched(PackedBatchSampler(tmp_path / "plan", rank=0, world_size=2))


@pytest.mark.slow
def test_a_moved_copy_of_the_inputs_gives_the_same_plan(tmp_path):
    # the location is provenance, not content: the rule that makes objects equal files holds for copies too
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_text_parquet(tmp_path / name / "x.parquet", lognormal(300, 7, 500), 64)
        run_sortpack(["run", tmp_path / name, "-o", tmp_path / f"plan-{name}", "--max-tokens", "2048", "--quiet"])
    a, b = (json.loads((tmp_path / f"plan-{n}" / "manifest.json").read_text()) for n in ("a", "b"))
    assert a["content_hash"] == b["content_hash"]
    assert a["provenance"]["source_paths"] == [str(tmp_path / "a" / "x.parquet")]
    assert "path" not in a["source"]["files"][0]
    # and the reader finds the inputs through the provenance
    ds = SourceDataset(tmp_path / "plan-b", columns=["text"])
    assert ds[5]["text"] == pq.read_table(tmp_path / "b" / "x.parquet").column("text")[5].as_py()


class _Counting:
    """A file-like object over a pyarrow file that counts the bytes read through it."""

    def __init__(self, inner, counter: list):
        self.inner, self.counter, self.closed = inner, counter, False

    def read(self, n=-1):
        data = self.inner.read() if n is None or n < 0 else self.inner.read(n)
        self.counter.append(len(data))
        return data

    def seek(self, pos, whence=0):
        return self.inner.seek(pos, whence)

    def tell(self):
        return self.inner.tell()

    def seekable(self):
        return True

    def readable(self):
        return True

    def close(self):
        self.closed = True


def test_a_rank_fetches_only_the_byte_ranges_of_its_own_rows(s3_env, tmp_path, monkeypatch):
    from sortpack.inputs import formats, objects

    server = s3_env
    server.bucket("ranges")
    rng = np.random.default_rng(11)  # random letters: the files do not compress to a few pages
    table = pa.table({"text": [rng.integers(97, 123, int(n), dtype=np.uint8).tobytes().decode()
                               for n in lognormal(4000, 11, 900)]})
    pq_path = tmp_path / "x.parquet"
    pq.write_table(table, pq_path, row_group_size=400)  # 10 row groups
    with pa.ipc.new_file(tmp_path / "y.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=400):
            w.write_batch(batch)
    for p in (pq_path, tmp_path / "y.arrow"):
        server.upload(p, f"s3://ranges/{p.name}")
    counted: list[int] = []
    real = objects.open_input
    monkeypatch.setattr(objects, "open_input", lambda path: pa.PythonFile(_Counting(real(path), counted), mode="r"))
    for name, fmt in (("x.parquet", "parquet"), ("y.arrow", "arrow")):
        size = (tmp_path / name).stat().st_size
        counted.clear()
        src = formats.open_source(f"s3://ranges/{name}", fmt)
        assert src.unit_rows == [400] * 10
        assert 0 < sum(counted) < size // 10, (name, sum(counted), size)  # described from metadata only
        counted.clear()
        got = formats.read_unit_rows(src, 7, range(100, 300), ["text"])  # the rows a rank takes of one unit
        assert got.column("text").to_pylist() == table.column("text")[2900:3100].to_pylist()
        assert sum(counted) < size // 4, (name, sum(counted), size)  # one unit's bytes, not the file's


def _tiny_objects(s3_server, tmp_path, bucket: str, n: int) -> None:
    """Put ``n`` tiny objects (JSONL, and every third a Parquet file of two rows) under ``s3://bucket/p/``."""
    s3_server.bucket(bucket)
    for i in range(n):
        path = tmp_path / "in" / f"{i:03d}.{'jsonl' if i % 3 else 'parquet'}"
        path.parent.mkdir(exist_ok=True)
        if path.suffix == ".jsonl":
            path.write_text(json.dumps({"text": "w" * (i + 1)}) + "\n")
        else:
            pq.write_table(pa.table({"text": ["v" * (i + 1), "u"]}), path)
        s3_server.upload(path, f"s3://{bucket}/p/{path.name}")


def _requests_per_object(s3_server, mark: int, prefix: str) -> dict[str, list[str]]:
    per: dict[str, list[str]] = {}
    for method, path in s3_server.requests_since(mark):
        if path.startswith(prefix):
            per.setdefault(path.split("?")[0], []).append(method)
    return per


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_listed_small_object_costs_one_get(s3_server, tmp_path, ranks):
    # the listing gives the size, one signed GET the bytes, ETag and Last-Modified: described, hashed and
    # read from those bytes
    n = 24
    _tiny_objects(s3_server, tmp_path, "tiny", n)
    mark = s3_server.log_mark()
    _run(s3_server, ["run", "s3://tiny/p/", "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "400",
                     "--quiet"], ranks=ranks)
    per = _requests_per_object(s3_server, mark, "/tiny/p/")
    assert len(per) == n
    if ranks == 1:
        assert all(m == ["GET"] for m in per.values()), per
    else:  # the object at the ranks' boundary may be fetched by both
        assert all(m in (["GET"], ["GET", "GET"]) for m in per.values()), per
        assert sum(len(m) for m in per.values()) <= n + 2, per
    manifest = json.loads((tmp_path / "plan" / "manifest.json").read_text())
    assert manifest["num_samples"] == sum(1 if i % 3 else 2 for i in range(n))
    # the version is what a HEAD says: the ETag and Last-Modified of each object
    client = s3_server.client()
    heads = [client.head_object(Bucket="tiny", Key=url[len("s3://tiny/"):])
             for url in manifest["provenance"]["source_paths"]]
    assert manifest["provenance"]["source_etags"] == [h["ETag"].strip('"') for h in heads]
    assert manifest["provenance"]["source_mtime_ns"] == [int(h["LastModified"].timestamp()) * 10**9 for h in heads]


@pytest.mark.slow
def test_without_keys_in_the_environment_a_small_object_costs_one_head_and_one_get(s3_server, tmp_path):
    # credentials from a credentials file: pyarrow's requests, the same plan and versions
    n = 6
    _tiny_objects(s3_server, tmp_path, "tiny2", n)
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {s3_server.key}\naws_secret_access_key = {s3_server.secret}\n")
    mark = s3_server.log_mark()
    _run(s3_server, ["run", "s3://tiny2/p/", "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "400",
                     "--quiet"], AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="", AWS_SHARED_CREDENTIALS_FILE=str(creds))
    per = _requests_per_object(s3_server, mark, "/tiny2/p/")
    assert len(per) == n and all(sorted(m) == ["GET", "HEAD"] for m in per.values()), per
    _run(s3_server, ["run", "s3://tiny2/p/", "-o", tmp_path / "plan2", "--column", "text", "--max-tokens", "400",
                     "--quiet"])
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("plan", "plan2"))
    assert a["content_hash"] == b["content_hash"]
    assert a["provenance"]["source_etags"] == b["provenance"]["source_etags"]
    assert a["provenance"]["source_mtime_ns"] == b["provenance"]["source_mtime_ns"]


def test_an_object_named_by_its_url_costs_the_head_that_finds_it_and_one_get(s3_env, tmp_path):
    import pickle

    from sortpack.inputs import objects

    server = s3_env
    _tiny_objects(server, tmp_path, "tiny3", 2)
    mark = server.log_mark()
    (found,) = expand_inputs(["s3://tiny3/p/001.jsonl"])
    assert isinstance(found.path, objects.Listed) and found.path.size == (tmp_path / "in" / "001.jsonl").stat().st_size
    again = pickle.loads(pickle.dumps(found.path))  # as the paths travel to the other ranks
    assert (type(again), again, again.size) == (objects.Listed, found.path, found.path.size)
    info = objects.head(again)
    assert objects.read_all(again).to_pybytes() == (tmp_path / "in" / "001.jsonl").read_bytes()
    assert [m for m, p in server.requests_since(mark) if p.startswith("/tiny3/p/001")] == ["HEAD", "GET"]
    assert info.etag == server.client().head_object(Bucket="tiny3", Key="p/001.jsonl")["ETag"].strip('"')
