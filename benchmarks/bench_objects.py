"""Object-store inputs: what reading from a local S3 server costs against local files.

    PYTHONPATH=$PWD python -m benchmarks.bench_objects --scale small   # 200k rows, about a minute
    PYTHONPATH=$PWD python -m benchmarks.bench_objects --scale full    # 2M rows
    PYTHONPATH=$PWD python -m benchmarks --only objects                 # in the suite's table

The same Parquet files (text rows, log-normal lengths, row groups of 25k rows) on local disk
and as objects of moto's S3 server on 127.0.0.1 (started here, in its own process; boto3
uploads). Interleaved over rounds, best of each kept, measured in the same run:

- ``analyze``: ``sortpack analyze --size length`` of the files against the objects, per rank count;
- ``read``: ``SourceDataset`` samples per second over an unstored plan (micro-batches in the
  sampler's ``shuffle`` order, rank 0 of 2, rows as Python objects, ``cache_units=4``), reading
  the local files, the objects, and the objects with ``Prefetched(sampler, dataset=ds)``;
- ``tiny`` (``--only tiny``): a prefix of tiny JSONL objects (1,000 at small scale, 10,000 at
  full) analyzed at 2 ranks: the whole command's wall time and the requests per object counted
  in the server's log, against the server's floor in the same run (one HEAD and one GET of
  every object from 16 threads of one process, what any pyarrow client pays). Goal: two
  requests per object, 10,000 objects under 30 s.

A local server has no network latency: the figures are the cost of going through HTTP, the
S3 client and pyarrow's ranged reads, a lower bound of what a remote store costs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCALES = {"small": {"rows": 200_000, "files": 4, "rounds": 2, "read_mbs": 150, "tiny": 1000},
          "full": {"rows": 2_000_000, "files": 8, "rounds": 3, "read_mbs": 1500, "tiny": 10_000}}
TINY_GOAL_S = 30.0  # 10,000 tiny objects at 2 ranks
ROW_GROUP = 25_000
MAX_TOKENS = 65536


def write_data(directory: Path, rows: int, files: int) -> list[Path]:
    """Write ``rows`` text rows as ``files`` Parquet files (reused when present); return them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out = []
    for k, n in enumerate(np.diff(np.linspace(0, rows, files + 1).astype(np.int64)).tolist()):
        path = directory / f"part-{k:03d}.parquet"
        out.append(path)
        lengths = np.clip(rng.lognormal(np.log(300), 0.8, n), 1, 8000).astype(np.int64)
        if path.exists() and pq.ParquetFile(path).metadata.num_rows == n:
            continue
        pool = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz" * 400, dtype=np.uint8)
        texts = [pool[: int(m)].tobytes().decode() for m in lengths]
        pq.write_table(pa.table({"text": texts}), path, row_group_size=ROW_GROUP)
    return out


class Server:
    """moto's S3 server on a free port of 127.0.0.1, and the environment that reaches it."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        # one log line per request (werkzeug's): the tiny-objects figure counts them
        self.log = Path(tempfile.mkstemp(prefix="moto-bench-", suffix=".log")[1])
        with open(self.log, "wb") as sink:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                         stdout=sink, stderr=sink)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start (pip install 'moto[server]')") from None
                time.sleep(0.2)
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def upload(self, files: list[Path], bucket: str) -> str:
        """Put ``files`` under ``s3://bucket/data/``; return that prefix."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
        client.create_bucket(Bucket=bucket)
        for f in files:
            client.upload_file(str(f), bucket, f"data/{f.name}")
        return f"s3://{bucket}/data/"

    def client(self):
        """Return a boto3 S3 client of the server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="bench", aws_secret_access_key="bench")

    def requests_since(self, mark: int) -> list[tuple[str, str]]:
        """Return (method, path) of every request logged after byte ``mark`` of the log."""
        time.sleep(0.5)
        with open(self.log, "rb") as f:
            f.seek(mark)
            return re.findall(r'"([A-Z]+) (\S+) HTTP/[0-9.]+"', f.read().decode(errors="replace"))

    def stop(self) -> None:
        """End the server process."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.unlink(missing_ok=True)


def _cli(args: list[str], ranks: int, env: dict, timeout: float = 1200) -> float:
    """Run ``sortpack ARGS`` under ``mpiexec -n ranks``; return its wall seconds."""
    from .runner import bench_env, mpiexec

    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "sortpack", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**bench_env(), **env}, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def _read_worker(args: dict) -> dict:
    """In this process: samples/s of SourceDataset over the plan in the sampler's order (optionally Prefetched)."""
    from sortpack.reader import PackedSampler, Prefetched, SourceDataset

    ds = SourceDataset(args["plan"], columns=["text"], cache_units=4)
    sampler = PackedSampler(args["plan"], rank=0, world_size=2, order="shuffle", seed=1)
    it = Prefetched(sampler, dataset=ds) if args["prefetch"] else sampler
    n, t0 = 0, time.perf_counter()
    for k, mb in enumerate(it):
        n += len(ds.__getitems__(mb))
        if k + 1 >= args["mbs"]:
            break
    wall = time.perf_counter() - t0
    if args["prefetch"] and it.last is not None:
        it.last.stop()
    return {"samples": n, "wall": wall}


def _read(plan: Path, mbs: int, prefetch: bool, env: dict) -> dict:
    """Run ``_read_worker`` in a fresh process (own filesystem clients, own caches); return its result."""
    from .runner import bench_env

    code = ("import json, sys; from benchmarks.bench_objects import _read_worker; "
            "print(json.dumps(_read_worker(json.loads(sys.argv[1]))))")
    arg = json.dumps({"plan": str(plan), "mbs": mbs, "prefetch": prefetch})
    proc = subprocess.run([sys.executable, "-c", code, arg], cwd=ROOT, env={**bench_env(), **env},
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"read worker failed\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(scale: str, ranks: list[int], workdir: Path) -> list[dict]:
    """Return one dict per figure: what, ranks, local and object-store values."""
    cfg = SCALES[scale]
    files = write_data(workdir / f"data-{cfg['rows']}", cfg["rows"], cfg["files"])
    server = Server()
    try:
        prefix = server.upload(files, "bench")
        env = server.env
        best: dict = {}
        for _ in range(cfg["rounds"]):
            for p in ranks:
                for where, src in (("local", str(files[0].parent)), ("s3", prefix)):
                    wall = _cli(["analyze", src, "-o", str(workdir / f"m-{where}-{p}"), "--overwrite", "--quiet"],
                                p, env)
                    best[("analyze", p, where)] = min(best.get(("analyze", p, where), float("inf")), wall)
        hashes = {where: json.loads((workdir / f"m-{where}-{ranks[-1]}" / "manifest.json").read_text())
                  ["content_hash"] for where in ("local", "s3")}
        for where, src in (("local", str(files[0].parent)), ("s3", prefix)):
            _cli(["run", src, "-o", str(workdir / f"plan-{where}"), "--max-tokens", str(MAX_TOKENS), "--overwrite",
                  "--quiet"], 1, env)
        for _ in range(cfg["rounds"]):
            for name, plan, pre in (("local", "plan-local", False), ("s3", "plan-s3", False),
                                    ("s3+Prefetched", "plan-s3", True)):
                got = _read(workdir / plan, cfg["read_mbs"], pre, env)
                rate = got["samples"] / got["wall"]
                best[("read", 1, name)] = max(best.get(("read", 1, name), 0.0), rate)
    finally:
        server.stop()
    rows = []
    for p in ranks:
        local, s3 = best[("analyze", p, "local")], best[("analyze", p, "s3")]
        rows.append({"what": f"analyze --size length, {cfg['rows']:,} rows in {cfg['files']} Parquet files",
                     "ranks": p, "local": local, "s3": s3, "ratio": s3 / local, "unit": "s",
                     "same_hash": hashes["local"] == hashes["s3"]})
    for name in ("s3", "s3+Prefetched"):
        local, obj = best[("read", 1, "local")], best[("read", 1, name)]
        rows.append({"what": f"SourceDataset samples/s, unstored plan, shuffle order, {cfg['read_mbs']} micro-batches"
                     f" ({name})", "ranks": 1, "local": local, "s3": obj, "ratio": local / obj, "unit": "samples/s"})
    return rows


def _floor(prefix: str, urls_n: int, env: dict) -> float:
    """Return the seconds one process takes to HEAD and GET every object below ``prefix`` from 16 threads."""
    from .runner import bench_env

    code = ("import os, sys, time; from concurrent.futures import ThreadPoolExecutor; import pyarrow.fs as fs; "
            "e = os.environ['AWS_ENDPOINT_URL']; s3 = fs.S3FileSystem(endpoint_override=e, scheme='http', "
            "region='us-east-1'); p = sys.argv[1][len('s3://'):]; "
            "keys = [i.path for i in s3.get_file_info(fs.FileSelector(p, recursive=True))]; t = time.perf_counter(); "
            "one = lambda k: s3.open_input_file(k).read_buffer().size; "
            "n = sum(ThreadPoolExecutor(16).map(one, keys)); print(time.perf_counter() - t, len(keys))")
    proc = subprocess.run([sys.executable, "-c", code, prefix], env={**bench_env(), **env}, capture_output=True,
                          text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"floor worker failed\n{proc.stderr[-2000:]}")
    secs_, n = proc.stdout.split()
    assert int(n) == urls_n, (n, urls_n)
    return float(secs_)


def measure_tiny(scale: str, workdir: Path, ranks: int = 2) -> dict:
    """Return the tiny-objects figure: sortpack's whole analyze at ``ranks``, requests per object, the floor."""
    from concurrent.futures import ThreadPoolExecutor

    n = SCALES[scale]["tiny"]
    server = Server()
    try:
        client = server.client()
        client.create_bucket(Bucket="tiny")

        def put(i: int) -> None:
            client.put_object(Bucket="tiny", Key=f"p/{i:06d}.jsonl",
                              Body=(json.dumps({"text": "word " * (1 + i % 50)}) + "\n").encode())

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, range(n)))
        load = os.getloadavg()[0]
        floor = _floor("s3://tiny/p/", n, server.env)
        mark = server.log.stat().st_size
        wall = _cli(["analyze", "s3://tiny/p/", "-o", str(workdir / "tiny"), "--overwrite", "--quiet"], ranks,
                    server.env)
        reqs = [r for r in server.requests_since(mark) if r[1].startswith("/tiny/p/")]
    finally:
        server.stop()
    return {"objects": n, "ranks": ranks, "wall": wall, "floor": floor, "per_object": len(reqs) / n,
            "heads": sum(m == "HEAD" for m, _ in reqs) / n, "gets": sum(m == "GET" for m, _ in reqs) / n,
            "load": load}


def bench(ctx) -> list:
    """Return the suite's rows: analyze and SourceDataset reads, objects of a local S3 server vs local files."""
    from .report import Row, secs

    ctx.log("objects: writing Parquet files, starting moto's S3 server, uploading")
    rows = []
    t = measure_tiny(ctx.scale_name, ROOT / "benchmarks" / "_work" / "objects")
    rows.append(Row("objects", f"analyze a prefix of {t['objects']:,} tiny JSONL objects (whole command)", t["ranks"],
                    secs(t["wall"]), f"server floor (HEAD+GET each, 16 threads): {secs(t['floor'])}",
                    f"{t['wall'] / t['floor']:.2f}× floor", f"< {TINY_GOAL_S:g} s at 10,000",
                    t["wall"] < TINY_GOAL_S if t["objects"] >= 10_000 else None,
                    f"{t['per_object']:.2f} requests per object ({t['heads']:.2f} HEAD, {t['gets']:.2f} GET); "
                    f"load {t['load']:.1f}"))
    for r in measure(ctx.scale_name, list(ctx.ranks), ROOT / "benchmarks" / "_work" / "objects"):
        if r["unit"] == "s":
            rows.append(Row("objects", r["what"] + ": s3:// vs local", r["ranks"], secs(r["s3"]),
                            f"local: {secs(r['local'])}", f"{r['ratio']:.2f}× local", "", None,
                            "same content_hash" if r["same_hash"] else "content_hash DIFFERS"))
        else:
            rows.append(Row("objects", r["what"], r["ranks"], f"{r['s3']:,.0f}/s", f"local: {r['local']:,.0f}/s",
                            f"{r['ratio']:.2f}× slower", "", None, ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the table of figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--workdir", default=str(ROOT / "benchmarks" / "_work" / "objects"))
    ap.add_argument("--only", choices=["tiny", "files"], help="one part only")
    args = ap.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",") if x]
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    if args.only in (None, "tiny"):
        t = measure_tiny(args.scale, Path(args.workdir))
        print(f"analyze of {t['objects']:,} tiny JSONL objects at {t['ranks']} ranks: {t['wall']:.2f} s whole command "
              f"(goal < {TINY_GOAL_S:g} s at 10,000); server floor, one HEAD and one GET of each from 16 threads: "
              f"{t['floor']:.2f} s ({t['wall'] / t['floor']:.2f}x); {t['per_object']:.2f} requests per object "
              f"({t['heads']:.2f} HEAD, {t['gets']:.2f} GET); load {t['load']:.1f} on {os.cpu_count()} cores")
        if args.only == "tiny":
            return 0
    rows = measure(args.scale, ranks, Path(args.workdir))
    print(f"{'figure':<100} {'P':>2} {'local':>12} {'s3 (moto, 127.0.0.1)':>22} {'ratio':>8}")
    for r in rows:
        fmt = (lambda v: f"{v:.3f} s") if r["unit"] == "s" else (lambda v: f"{v:,.0f}/s")
        print(f"{r['what']:<100} {r['ranks']:>2} {fmt(r['local']):>12} {fmt(r['s3']):>22} {r['ratio']:>7.2f}x")
        if "same_hash" in r:
            print(f"{'':<100}    content_hash local == s3: {r['same_hash']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
