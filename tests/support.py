"""Test helpers: small datasets on disk, a runner for the CLI under mpiexec, rank-count identity checks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec") or shutil.which("mpiexec", path=sysconfig.get_path("scripts"))


def write_text_parquet(path: Path, lengths, row_group_size: int = 1000, extra: dict | None = None) -> Path:
    """Write a parquet file whose `text` column has strings of the given lengths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    texts = [letters[np.arange(n) % 26].tobytes().decode() for n in lengths]
    cols = {"text": texts, "n": lengths}
    cols.update(extra or {})
    pq.write_table(pa.table(cols), path, row_group_size=row_group_size)
    return path


def sortpack_cmd(args: list[str], ranks: int | None = None) -> list[str]:
    """Return the command line running sortpack, under mpiexec when ranks is given."""
    cmd = [sys.executable, "-m", "sortpack", *map(str, args)]
    if ranks is not None:
        if MPIEXEC is None:
            pytest.skip("mpiexec not found (pip install mpich)")
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    return cmd


def run_sortpack(args: list[str], ranks: int | None = None, timeout: float = 120, env: dict | None = None,
                 check: bool = True) -> subprocess.CompletedProcess:
    """Run the sortpack CLI (under ``mpiexec -n ranks`` when given) and return the result."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run(sortpack_cmd(args, ranks), capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=str(ROOT))
    if check and proc.returncode != 0:
        raise AssertionError(f"sortpack {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def read_manifest(directory: Path) -> dict:
    """Return an output directory's manifest.json as a dict."""
    return json.loads((Path(directory) / "manifest.json").read_text())


def output_files(directory: Path) -> dict[str, bytes]:
    """Return every file of an output directory but its manifest, by name, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.name != "manifest.json"}


def assert_same_outputs(first: Path, *others: Path) -> None:
    """Assert that output directories hold the same files, byte for byte, and manifests of the same content_hash."""
    want, want_hash = output_files(first), read_manifest(first)["content_hash"]
    for other in others:
        got = output_files(other)
        assert sorted(got) == sorted(want), (first, other)
        for name in want:
            assert got[name] == want[name], f"{other}/{name} differs from {first}/{name}"
        assert read_manifest(other)["content_hash"] == want_hash, other


def assert_same_at_ranks(args: list, out: Path, ranks=(1, 2, 3, 4), env: dict | None = None,
                         timeout: float = 180) -> list[Path]:
    """Run ``sortpack ARGS -o OUT/plan<K>`` under ``mpiexec -n K`` for each K of ``ranks``; return the outputs.

    The test fails unless every output holds the first's files byte for byte and the same
    manifest ``content_hash`` (the determinism rule: any rank count, the same plan).
    """
    outs = []
    for k in ranks:
        outs.append(Path(out) / f"plan{k}")
        run_sortpack([*args, "-o", outs[-1]], ranks=k, env=env, timeout=timeout)
    assert_same_outputs(*outs)
    assert [read_manifest(o)["provenance"]["world_size"] for o in outs] == list(ranks)
    return outs


def greedy_oracle(sizes, max_tokens, max_samples=0, batch_multiple=1) -> list[list[int]]:
    """Return the sequential greedy's micro-batches (positions into ``sizes``), written plainly (test oracle).

    A sample joins iff count*max <= max_tokens (and count <= max_samples); with
    ``batch_multiple`` a full micro-batch keeps a multiple of it and carries the rest over.
    """
    batches, cur = [], []
    for i, s in enumerate(sizes):
        while cur:
            count = len(cur) + 1
            biggest = max([sizes[j] for j in cur] + [s])
            if count * biggest <= max_tokens and (max_samples == 0 or count <= max_samples):
                break
            keep = len(cur) if len(cur) < batch_multiple else batch_multiple * (len(cur) // batch_multiple)
            batches.append(cur[:keep])
            cur = cur[keep:]
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def lognormal(n, seed=0, maximum=4096):
    """Return n log-normal sizes (median 300, sigma 1, clipped to [1, maximum]): the benchmarks' test set."""
    rng = np.random.default_rng(seed)
    return np.clip(np.ceil(rng.lognormal(np.log(300), 1.0, n)), 1, maximum).astype(np.int64)


def rounding_padding(sizes, lengths):
    """Return the padding fraction when every size is rounded up to the next of ``lengths``."""
    lengths = np.asarray(lengths)
    return 1 - sizes.sum() / lengths[np.searchsorted(lengths, sizes)].sum()


def run_gloo_ranks(args: list, ranks: int = 2, timeout: float = 240, env: dict | None = None) -> list[str]:
    """Run ``python ARGS`` as ``ranks`` processes (RANK/WORLD_SIZE, as torchrun sets them); return each output.

    The test fails unless every rank exits 0; a rank still running at ``timeout`` is killed.
    """
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {}),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(ranks)}
    procs = [subprocess.Popen([sys.executable, *map(str, args)], env={**base, "RANK": str(r)}, cwd=str(ROOT),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(ranks)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * ranks, outs
    return outs

def make_tokenizer(path):
    """Train a tiny word-level tokenizer (whitespace and punctuation splits) and save it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hello world", "the quick brown fox", "hello, fox!"],
                            trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(path))
    return str(path)


def make_special_tokenizer(path, texts=("hello world", "the quick brown fox", "hello, fox!")):
    """Train a tiny word-level tokenizer whose post-processor adds [CLS] ... [SEP] (as BERT's) and save it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(list(texts), trainers.WordLevelTrainer(special_tokens=["[UNK]", "[CLS]", "[SEP]"]))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls),
                                                                                            ("[SEP]", sep)])
    tok.save(str(path))
    return str(path)
