"""Stored data at scale: the --store job's memory and time, reads out of plan order, cold starts.

    python benchmarks/bench_stored.py --scale small    # 100k rows, about a minute (CI runs it)
    python benchmarks/bench_stored.py --scale full     # 20M rows of text (~8 GB), tens of minutes
    python benchmarks/bench_stored.py --scale full --rows 5000000 --only store

Text rows with log-normal lengths (median 300 characters, mean ~413 B) in Parquet files of
1M rows (row groups of 100k). Hugging Face ``datasets`` is the baseline, measured in the
same run on the same rows (``Dataset.from_parquet`` + ``save_to_disk``, read back with
``load_from_disk``). Prints one table:

- ``store``: ``mpiexec -n 2 sortpack run --store text --profile`` with the default memory
  limit (small scale: ``--memory-limit 8M``, so rows spill), its wall time against
  ``datasets``' own conversion, the peak RSS of each rank polled with psutil every 0.1 s
  against the memory limit the job reports, and the job's per-stage profile.
- ``take``: random sample ids (batches of 1024) read out of plan order, as Python rows:
  ``SourceDataset.__getitems__`` on the stored plan against ``Dataset.__getitems__``, and
  as Arrow: ``PackedIndex.stored.take`` against ``ds.with_format("arrow")[ids]``;
  interleaved, medians.
- ``cold``: samples/s of the first seconds of an epoch (micro-batches in the sampler's
  ``shuffle`` order, rank 0 of ``--world``, items as Python rows) from a cold page cache
  (``posix_fadvise(DONTNEED)`` on every file read, after ``sync``; ``fincore`` checks it),
  without and with ``Prefetched``, against ``datasets`` on the same ids in the same order,
  each in a fresh process, plus the same loop with the stored plan warm in the cache. Over
  the first 10 s and the first ``cold_s`` (a loop that finishes the epoch sooner stops there).

Generated data lives under ``--workdir`` (default ``benchmarks/_work/stored``) and is
deleted at the end unless ``--keep``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCALES = {
    "small": {"rows": 100_000, "limit": "8M", "cold_s": 3.0, "take_s": 1.0, "repeat": 1, "store_rows": [100_000]},
    "full": {"rows": 20_000_000, "limit": None, "cold_s": 60.0, "take_s": 5.0, "repeat": 3,
             "store_rows": [5_000_000, 20_000_000]},
}
FILE_ROWS = 1_000_000
MAX_TOKENS = 65536


# --- data -------------------------------------------------------------------------------
def make_data(directory: Path, rows: int, seed: int = 0) -> list[Path]:
    """Write ``rows`` text rows as Parquet files of up to 1M rows; return the files (reused when present)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sortpack import kernels

    directory.mkdir(parents=True, exist_ok=True)
    files = []
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz", dtype=np.uint8)
    pool = alphabet[rng.integers(0, len(alphabet), 1 << 24)]
    for k, start in enumerate(range(0, rows, FILE_ROWS)):
        path = directory / f"part-{k:04d}.parquet"
        files.append(path)
        n = min(FILE_ROWS, rows - start)
        lengths = np.clip(rng.lognormal(np.log(300), 0.8, n), 1, 20000).astype(np.int64)
        offs = rng.integers(0, len(pool) - 20001, n)
        if path.exists() and pq.ParquetFile(path).metadata.num_rows == n:
            continue  # a smaller run's last file is shorter: written again
        data = np.empty(int(lengths.sum()), np.uint8)
        kernels.gather_bytes(np.array([pool.ctypes.data], np.uint64), [pool], np.zeros(n, np.int64), offs, lengths,
                             data)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
        text = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        tmp = path.with_suffix(".tmp")
        pq.write_table(pa.table({"text": text, "id": np.arange(start, start + n)}), tmp, row_group_size=100_000)
        tmp.rename(path)
    return files


def env() -> dict:
    """Return a subprocess environment running this checkout, one thread per rank."""
    out = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out.pop("SORTPACK_TEST_PIECE_BYTES", None)
    return out


def hf_convert(files: list[Path], out: Path) -> float:
    """Return seconds of ``datasets``' own conversion (from_parquet + save_to_disk) in a fresh process."""
    code = ("import sys, time, datasets; t=time.perf_counter(); "
            "ds=datasets.Dataset.from_parquet(sys.argv[2:], cache_dir=sys.argv[1] + '-cache'); "
            "ds.save_to_disk(sys.argv[1]); print(time.perf_counter()-t)")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(str(out) + "-cache", ignore_errors=True)
    proc = subprocess.run([sys.executable, "-c", code, str(out), *map(str, files)], check=True, env=env(),
                          capture_output=True, text=True)
    shutil.rmtree(str(out) + "-cache", ignore_errors=True)  # the saved copy is what is read
    return float(proc.stdout.strip().splitlines()[-1])


# --- store: time, memory, profile -------------------------------------------------------------
def run_store(files: list[Path], plan: Path, ranks: int, limit: str | None, store: bool = True) -> dict:
    """Run ``sortpack run --store text --profile`` under mpiexec, polling each rank's RSS; return the figures.

    ``store=False``: the same plan without ``--store`` (the memory every rank has without the shuffle).
    """
    import psutil

    cmd = [sys.executable, "-m", "sortpack", "run", *map(str, files), "-o", str(plan), "--column", "text",
           "--max-tokens", str(MAX_TOKENS), "--profile", "--overwrite", "--quiet"]
    cmd += ["--store", "text"] if store else []
    if limit and store:
        cmd += ["--memory-limit", limit]
    if ranks > 1:
        cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks), *cmd]
    peaks: dict[int, int] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def poll():
        top = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                kids = [top] + top.children(recursive=True)
            except psutil.Error:
                break
            for p in kids:
                try:
                    if "python" in p.name() or "sortpack" in " ".join(p.cmdline()[:3]):
                        peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
                except psutil.Error:
                    pass
            stop.wait(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    poller.join()
    if proc.returncode:
        raise RuntimeError(f"sortpack run failed ({proc.returncode}): {err.strip()[-2000:]}")
    prov = json.loads((plan / "manifest.json").read_text())["provenance"]
    # the rank processes: the largest peaks (mpiexec's hydra proxy is not python)
    polled = sorted(peaks.values(), reverse=True)[:ranks]
    return {"wall_s": wall, "polled_rss": polled, "profile": prov["profile"], "exchange": prov.get("exchange") or {}}


# --- workers: one fresh process per cold measurement -------------------------------------------
def drop_cache(paths: list[Path]) -> None:
    """Ask the kernel to drop these files' clean pages (after a sync, so none is dirty)."""
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(paths: list[Path]) -> None:
    """Read these files once, so their pages are in the page cache."""
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(1 << 24):
                pass


def cached_fraction(paths: list[Path]) -> float:
    """Return the fraction of these files' bytes in the page cache (``fincore``; NaN without it)."""
    tool = shutil.which("fincore")
    if not tool or not paths:
        return float("nan")
    out = subprocess.run([tool, "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *map(str, paths)],
                         capture_output=True, text=True)
    res = size = 0
    for line in out.stdout.split("\n"):
        parts = line.split()
        if len(parts) == 2:
            res, size = res + int(parts[0]), size + int(parts[1])
    return res / size if size else float("nan")


def files_of(directory: Path) -> list[Path]:
    """Return every regular file under ``directory``."""
    return sorted(p for p in directory.rglob("*") if p.is_file())


def cold_worker(args: dict) -> dict:
    """Iterate micro-batches in shuffle order for ``seconds``; return samples read and the per-second timeline."""
    from sortpack.reader import PackedIndex, Prefetched
    from sortpack.torch import PackedBatchSampler

    index = PackedIndex(args["plan"])
    sampler = PackedBatchSampler(index, rank=0, world_size=args["world"], order="shuffle", seed=1)
    if args["kind"] == "hf":
        import datasets

        ds = datasets.load_from_disk(args["hf"])

        def fetch(mb):
            return ds.__getitems__(list(mb))
    else:
        from sortpack.reader import SourceDataset

        sds = SourceDataset(args["plan"])
        fetch = sds.__getitems__
    loop = Prefetched(sampler) if args["kind"] == "prefetch" else sampler
    n, t0, marks = 0, time.perf_counter(), []
    for mb in loop:
        n += len(fetch(mb))
        dt = time.perf_counter() - t0
        while len(marks) < int(dt):
            marks.append(n)
        if dt >= args["seconds"]:
            break
    seconds = time.perf_counter() - t0
    return {"samples": n, "seconds": seconds, "timeline": marks}


def run_worker(kind: str, args: dict, timeout: float) -> dict:
    """Run ``cold_worker`` in a fresh process; return its result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps({**args, "kind": kind})]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{kind} worker failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- take: reads out of plan order ----------------------------------------------------------------
def take_rates(plan: Path, hf: Path, seconds: float, repeat: int) -> dict:
    """Return samples/s of random-id reads, sortpack and datasets interleaved (medians), and the map's build time."""
    import datasets

    from sortpack.reader import PackedIndex, SourceDataset

    index = PackedIndex(plan)
    stored, sds = index.stored, SourceDataset(plan)
    ds = datasets.load_from_disk(str(hf))
    ds_arrow = ds.with_format("arrow")
    rng = np.random.default_rng(2)
    n = len(ds)
    warm = rng.integers(0, n, 1024)
    t0 = time.perf_counter()
    stored.positions(warm)
    build = time.perf_counter() - t0
    # the same rows: a stored take equals datasets' rows of the same ids
    assert stored.take(warm).column("text").to_pylist() == ds_arrow[warm.tolist()].column("text").to_pylist()

    def rate(fn):
        k, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds:
            ids = rng.integers(0, n, 1024)
            fn(ids)
            k += len(ids)
        return k / (time.perf_counter() - t)

    jobs = {
        "rows_sortpack": lambda ids: sds.__getitems__(ids),
        "rows_hf": lambda ids: ds.__getitems__(ids.tolist()),
        "arrow_sortpack": lambda ids: stored.take(ids),
        "arrow_hf": lambda ids: ds_arrow[ids.tolist()],
    }
    got: dict = {k: [] for k in jobs}
    for _ in range(repeat):
        for name, fn in jobs.items():
            got[name].append(rate(fn))
    out = {k: float(np.median(v)) for k, v in got.items()}
    out["build_s"] = build
    return out


# --- driver --------------------------------------------------------------------------------------
def fmt_bytes(b: float) -> str:
    """Return bytes as MiB or GiB."""
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> list[str]:
    """Measure and print the table; return its lines."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--rows", type=int, help="rows of the take and cold parts (default: the scale's)")
    ap.add_argument("--only", default="store,take,cold", help="comma-separated parts: store, take, cold")
    ap.add_argument("--world", type=int, default=1, help="world size of the cold-start sampler (rank 0 reads)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "_work" / "stored")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--json", type=Path, help="also write the table and notes as JSON here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        job = json.loads(args.worker)
        if job["kind"] == "take":
            print(json.dumps(take_rates(Path(job["plan"]), Path(job["hf"]), job["seconds"], job["repeat"])))
        else:
            print(json.dumps(cold_worker(job)))
        return []
    scale = SCALES[args.scale]
    rows = args.rows or scale["rows"]
    parts = {p.strip() for p in args.only.split(",")}
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"{'part':<6} {'measure':<52} {'sortpack':>12} {'datasets':>12} {'ratio':>7}"]
    notes: list[str] = []
    table: list[list[str]] = []

    def row(part, what, value, base=None, digits=0):
        ratio = f"{value / base:.2f}" if base else ""
        baseline = "" if base is None else f"{base:,.{digits}f}"
        lines.append(f"{part:<6} {what:<52} {value:>12,.{digits}f} {baseline:>12} {ratio:>7}")
        table.append([part, what, f"{value:,.{digits}f}", baseline, ratio])
        print(lines[-1], flush=True)

    print(lines[0], flush=True)
    store_rows = sorted({r for r in scale["store_rows"] if r <= rows} | {rows}) if "store" in parts else []
    files = make_data(work / "data", rows)
    plan, hf = work / f"plan-{rows}", work / f"hf-{rows}"
    try:
        for n in store_rows:
            use = files[:max(1, -(-n // FILE_ROWS))]
            out = work / f"plan-{n}"
            res = run_store(use, out, 2, scale["limit"])
            base = run_store(use, work / f"plain-{n}", 2, None, store=False)
            shutil.rmtree(work / f"plain-{n}", ignore_errors=True)
            limit = int(res["exchange"].get("memory_limit", 0))
            hf_s = hf_convert(use, work / f"hf-{n}")
            row("store", f"{n / 1e6:g}M rows: run --store s, P=2 vs from_parquet+save", res["wall_s"], hf_s, 1)
            plain, polled = max(base["polled_rss"]), max(res["polled_rss"])
            lines.append(f"store  {n / 1e6:g}M rows: peak RSS per rank {', '.join(map(fmt_bytes, res['polled_rss']))} "
                         f"polled, {', '.join(map(fmt_bytes, res['profile']['peak_rss_bytes_per_rank']))} in "
                         f"--profile; {fmt_bytes(plain)} without --store: the store adds "
                         f"{(polled - plain) / limit:.2f}x its memory limit of {fmt_bytes(limit)}")
            table.append(["store", lines[-1][7:], "", "", ""])
            print(lines[-1], flush=True)
            stages = {k: v["wall_s"] for k, v in res["profile"].items() if isinstance(v, dict)}
            notes.append(f"{n / 1e6:g}M rows, P=2 stages (s, max over ranks): "
                         + ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
                         + f"; exchange {res['exchange']}")
            if n != rows:
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(work / f"hf-{n}", ignore_errors=True)
        if not plan.exists():
            run_store(files, plan, 2, scale["limit"])
        if not hf.exists():
            hf_convert(files, hf)
        if "take" in parts:
            # both warm: random reads from a cold cache would time the disk, whichever was written last
            warm_cache(files_of(plan) + files_of(hf))
            notes.append(f"take: cached before start: stored plan {cached_fraction(files_of(plan)):.2f}, "
                         f"datasets {cached_fraction(files_of(hf)):.2f}")
            # in a fresh process: the maps it opens would keep the files' pages from being dropped
            t = run_worker("take", {"plan": str(plan), "hf": str(hf), "seconds": scale["take_s"],
                                    "repeat": scale["repeat"]}, 1800)
            row("take", "random ids as Python rows, samples/s", t["rows_sortpack"], t["rows_hf"])
            row("take", "random ids as Arrow, samples/s", t["arrow_sortpack"], t["arrow_hf"])
            notes.append(f"take: the sample id -> row map built on first use in {t['build_s']:.2f} s")
        if "cold" in parts:
            sec = scale["cold_s"]
            plan_files, hf_files = files_of(plan), files_of(hf)
            common = {"plan": str(plan), "hf": str(hf), "world": args.world, "seconds": sec}
            got: dict = {"plain": [], "prefetch": [], "hf": [], "warm": []}
            cached: dict = {k: [] for k in got}
            for _ in range(scale["repeat"]):
                for kind in ("plain", "prefetch", "hf", "warm"):
                    if kind == "warm":
                        warm_cache(plan_files)
                    else:
                        drop_cache(plan_files + hf_files)
                    cached[kind].append(cached_fraction(hf_files if kind == "hf" else plan_files))
                    got[kind].append(run_worker(kind, common, sec * 3 + 600))
            def rate(r, first=None):  # over the first seconds, or the whole loop (it ends with the epoch)
                tl = r["timeline"]
                return tl[first - 1] / first if first and len(tl) >= first else r["samples"] / r["seconds"]

            for first in ([10] if sec > 10 else []) + [None]:
                med = {k: float(np.median([rate(r, first) for r in v])) for k, v in got.items()}
                span = f"first {first or sec:g} s" + ("" if first else " (or the epoch)")
                row("cold", f"{span}, cold cache, no prefetch, samples/s", med["plain"], med["hf"])
                row("cold", f"{span}, cold cache, Prefetched, samples/s", med["prefetch"], med["hf"])
                row("cold", f"{span}, stored plan warm in the cache, samples/s", med["warm"], med["hf"])
                row("cold", f"{span}: Prefetched cold / warm", med["prefetch"], med["warm"])
            for kind, runs in got.items():
                tl = runs[0]["timeline"]
                per_s = np.diff([0] + tl)
                notes.append(f"cold {kind}: cached before start {np.round(cached[kind], 3).tolist()}; samples per "
                             f"second (first run): {per_s.tolist()[:20]}{' ...' if len(per_s) > 20 else ''}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    notes.append(f"load average at the end {load} ({os.cpu_count()} cores, shared machine)")
    for note in notes:
        lines.append(f"note: {note}")
        print(lines[-1], flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": table, "notes": notes}))
    return lines


def bench(ctx) -> list:
    """The suite's ``stored`` benchmark: this script in a subprocess (5M rows at full scale), its table as a section."""
    from .report import Section
    from .runner import launch

    out = ROOT / "benchmarks" / "_work" / "stored.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    full = ctx.scale_name == "full"
    args = ["--scale", ctx.scale_name, "--json", str(out), "--workdir", str(out.parent / "stored-suite")]
    args += ["--rows", "5000000"] if full else []
    ctx.log(f"stored data at scale {ctx.scale_name}" + (" (5M rows; the 20M run: bench_stored.py --scale full)"
                                                        if full else ""))
    launch([sys.executable, str(Path(__file__).resolve()), *args], 7200 if full else 900)
    res = json.loads(out.read_text())
    ctx.sections.append(Section(f"Stored data (`python benchmarks/bench_stored.py {' '.join(args[:2])}`): sortpack "
                                "against Hugging Face datasets in the same run",
                                ["part", "measure", "sortpack", "datasets", "ratio"], res["rows"]))
    ctx.notes.extend(f"stored: {n}" for n in res["notes"])
    return []


if __name__ == "__main__":
    main()
