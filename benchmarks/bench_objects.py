"""Object-store inputs: what reading from a local S3 server costs against local files.

    PYTHONPATH=$PWD python -m benchmarks.bench_objects --scale small   # 100k rows, under a minute
    PYTHONPATH=$PWD python -m benchmarks.bench_objects --scale full    # 2M rows
    PYTHONPATH=$PWD python -m benchmarks --only objects                 # in the suite's table

The same Parquet files (text rows, log-normal lengths, row groups of 25k rows) on local disk
and as objects of moto's S3 server on 127.0.0.1 (started here, in its own process; boto3
uploads). Interleaved over rounds, best of each kept, measured in the same run:

- ``analyze``: ``sortpack analyze --size length`` of the files against the objects, per rank count;
- ``read``: ``SourceDataset`` samples per second over an unstored plan (micro-batches in the
  sampler's ``shuffle`` order, rank 0 of 2, rows as Python objects, ``cache_units=4``), reading
  the local files, the objects, and the objects with ``Prefetched(sampler, dataset=ds)``;
- ``tiny`` (``--only tiny``): a prefix of tiny JSONL objects (300 at small scale, 10,000 at
  full) analyzed at 2 ranks: the whole command's wall and CPU time, the server's CPU during it
  and the requests per object counted in the server's log, against the server's floors in the
  same run (one process reading every object from 16 threads: a HEAD and a GET each, what a
  pyarrow client pays, and one signed GET each, what sortpack pays for a listed small object).
  ``--code OLD --code NEW --rounds 2`` times checkouts alternated. Goal: one request per
  object, 10,000 objects under 30 s.

    PYTHONPATH=$PWD python -m benchmarks.bench_objects --only tiny --scale full --code /old/checkout --code .

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
SCALES = {"small": {"rows": 100_000, "files": 4, "rounds": 1, "read_mbs": 60, "tiny": 300},
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


def _cli(args: list[str], ranks: int, env: dict, timeout: float = 1200, code: Path = ROOT) -> float:
    """Run ``sortpack ARGS`` of checkout ``code`` under ``mpiexec -n ranks``; return its wall seconds."""
    return _cli_timed(args, ranks, env, timeout, code)[0]


def _cli_timed(args: list[str], ranks: int, env: dict, timeout: float = 1200, code: Path = ROOT) -> tuple[float, float]:
    """Run ``sortpack ARGS`` of checkout ``code`` under ``mpiexec -n ranks``; return its wall and CPU seconds.

    The CPU is user + system of every process the command started (the ranks), from the
    children's resource usage.
    """
    import resource

    from .runner import bench_env, mpiexec

    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "sortpack", *args]
    base = bench_env()
    base["PYTHONPATH"] = os.pathsep.join([str(code), base["PYTHONPATH"]])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=code, env={**base, **env}, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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


_FLOOR = """
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
import pyarrow.fs as fs
from sortpack.inputs import object_get
e = os.environ["AWS_ENDPOINT_URL"]
s3 = fs.S3FileSystem(endpoint_override=e, scheme="http", region="us-east-1")
p = sys.argv[1][len("s3://"):]
infos = s3.get_file_info(fs.FileSelector(p, recursive=True))
setup = object_get.setup_from_env("us-east-1")
if sys.argv[2] == "2":  # what pyarrow's filesystem costs: a HEAD and a GET
    one = lambda i: s3.open_input_file(i.path).read_buffer().size
else:  # one signed GET, as sortpack reads a listed small object
    one = lambda i: object_get.get_small(setup, *i.path.split("/", 1), 1 << 20, 30.0).size
cpu, t = time.process_time(), time.perf_counter()
with ThreadPoolExecutor(16) as pool:
    n = sum(pool.map(one, infos))
print(time.perf_counter() - t, time.process_time() - cpu, len(infos))
"""


def _floor(prefix: str, urls_n: int, env: dict, requests: int) -> tuple[float, float]:
    """Return the wall and CPU seconds one process takes to read every object below ``prefix`` from 16 threads.

    ``requests`` 2: pyarrow's HEAD and GET of each; 1: one signed GET of each (``inputs.object_get``).
    """
    from .runner import bench_env

    proc = subprocess.run([sys.executable, "-c", _FLOOR, prefix, str(requests)], env={**bench_env(), **env},
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"floor worker failed\n{proc.stderr[-2000:]}")
    wall, cpu, n = proc.stdout.split()
    assert int(n) == urls_n, (n, urls_n)
    return float(wall), float(cpu)


def _cpu_of(pid: int) -> float:
    """Return the user + system CPU seconds process ``pid`` used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_tiny(scale: str, workdir: Path, ranks: int = 2, codes: list[Path] | None = None,
                 rounds: int = 1) -> dict:
    """Return the tiny-objects figures: each checkout's whole analyze at ``ranks`` and the server's floors.

    Per checkout (``codes``, alternated over ``rounds``, best wall kept): the wall and CPU of
    the whole command, the server's CPU during it, the requests per object in the server's log.
    The floors, measured in the same run: one process reading every object from 16 threads,
    with two requests each (pyarrow: HEAD, GET) and with one (a signed GET).
    """
    from concurrent.futures import ThreadPoolExecutor

    n = SCALES[scale]["tiny"]
    codes = codes or [ROOT]
    server = Server()
    out: dict = {"objects": n, "ranks": ranks, "runs": {}}
    try:
        client = server.client()
        client.create_bucket(Bucket="tiny")

        def put(i: int) -> None:
            client.put_object(Bucket="tiny", Key=f"p/{i:06d}.jsonl",
                              Body=(json.dumps({"text": "word " * (1 + i % 50)}) + "\n").encode())

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, range(n)))
        out["load"] = os.getloadavg()[0]
        for requests in (2, 1):
            cpu0 = _cpu_of(server.proc.pid)
            wall, cpu = _floor("s3://tiny/p/", n, server.env, requests)
            out[f"floor{requests}"] = {"wall": wall, "cpu": cpu, "server_cpu": _cpu_of(server.proc.pid) - cpu0}
        for _ in range(rounds):
            for code in codes:
                mark = server.log.stat().st_size
                cpu0 = _cpu_of(server.proc.pid)
                wall, cpu = _cli_timed(["analyze", "s3://tiny/p/", "-o", str(workdir / "tiny"), "--overwrite",
                                        "--quiet"], ranks, server.env, code=code)
                server_cpu = _cpu_of(server.proc.pid) - cpu0
                reqs = [r for r in server.requests_since(mark) if r[1].startswith("/tiny/p/")]
                run = {"wall": wall, "cpu": cpu, "server_cpu": server_cpu, "per_object": len(reqs) / n,
                       "heads": sum(m == "HEAD" for m, _ in reqs) / n, "gets": sum(m == "GET" for m, _ in reqs) / n,
                       "load": os.getloadavg()[0]}
                best = out["runs"].get(str(code))
                if best is None or run["wall"] < best["wall"]:
                    out["runs"][str(code)] = run
    finally:
        server.stop()
    return out


def bench(ctx) -> list:
    """Return the suite's rows: analyze and SourceDataset reads, objects of a local S3 server vs local files."""
    from .report import Row, secs

    ctx.log("objects: writing Parquet files, starting moto's S3 server, uploading")
    rows = []
    t = measure_tiny(ctx.scale_name, ROOT / "benchmarks" / "_work" / "objects")
    run, f1 = t["runs"][str(ROOT)], t["floor1"]
    rows.append(Row("objects", f"analyze a prefix of {t['objects']:,} tiny JSONL objects (whole command)", t["ranks"],
                    secs(run["wall"]), f"server floor (one GET each, 16 threads): {secs(f1['wall'])}",
                    f"{run['wall'] / f1['wall']:.2f}× floor", f"< {TINY_GOAL_S:g} s at 10,000",
                    run["wall"] < TINY_GOAL_S if t["objects"] >= 10_000 else None,
                    f"{run['per_object']:.2f} requests per object ({run['heads']:.2f} HEAD, {run['gets']:.2f} GET); "
                    f"CPU {run['cpu']:.1f} s, server {run['server_cpu']:.1f} s; load {t['load']:.1f}"))
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
    ap.add_argument("--code", action="append", type=Path,
                    help="tiny: a checkout to time (repeatable, alternated over --rounds; default: this one)")
    ap.add_argument("--rounds", type=int, default=1, help="tiny: rounds over the checkouts (best wall kept)")
    args = ap.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",") if x]
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    if args.only in (None, "tiny"):
        codes = [c.resolve() for c in args.code or [ROOT]]
        t = measure_tiny(args.scale, Path(args.workdir), codes=codes, rounds=args.rounds)
        print(f"{t['objects']:,} tiny JSONL objects below one prefix, moto on 127.0.0.1, {os.cpu_count()} cores, "
              f"load {t['load']:.1f} at the start; goal < {TINY_GOAL_S:g} s at 10,000 and 2 ranks")
        for k, what in ((2, "HEAD + GET of each (pyarrow)"), (1, "one signed GET of each")):
            f = t[f"floor{k}"]
            print(f"  server floor, {what}, 16 threads of one process: {f['wall']:.2f} s wall "
                  f"(client CPU {f['cpu']:.2f} s, server CPU {f['server_cpu']:.2f} s)")
        for code, run in t["runs"].items():
            print(f"  sortpack analyze at {t['ranks']} ranks, {code}: {run['wall']:.2f} s wall "
                  f"({run['wall'] / t['floor1']['wall']:.2f}x the one-GET floor), CPU of the ranks {run['cpu']:.2f} s, "
                  f"server CPU {run['server_cpu']:.2f} s; {run['per_object']:.2f} requests per object "
                  f"({run['heads']:.2f} HEAD, {run['gets']:.2f} GET); load {run['load']:.1f}")
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
