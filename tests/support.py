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


def modules_loaded_by(argv: list, env: dict | None = None) -> list[str]:
    """Return the modules a fresh interpreter holds after ``sortpack ARGV`` (one rank, no MPI) succeeded."""
    code = ("import sys; from sortpack.cli import main\n"
            f"try: main({[str(a) for a in argv]!r})\nexcept SystemExit as e: assert not e.code, e.code\n"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "SORTPACK_NO_MPI": "1", **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1].split()


def help_with(module: str, registry: str, cls, command: str = "pack") -> str:
    """Return ``sortpack COMMAND --help`` (whitespace folded) of a fresh interpreter in which a class named and
    helped like ``cls`` joins ``module``'s ``registry`` before the command line loads."""
    code = (f"from {module.rsplit('.', 1)[0]} import {module.rsplit('.', 1)[1]} as table\n"
            f"class Added(table.{cls.__mro__[1].__name__}):\n"
            f"    name, help = {cls.name!r}, {cls.help!r}\n"
            f"table.{registry}[Added.name] = Added\n"
            "from sortpack.cli import main\n"
            f"main([{command!r}, '--help'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(ROOT),
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())


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


CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>"]
CHAT_WORDS = ("the quick brown fox jumps over the lazy dog. hello world, how are you? fine thanks! "
              "what is two plus two? it is four. explain packing: documents share a row without padding.")


def make_chat_tokenizer(directory, template: str = CHATML_TEMPLATE, bos: str = "<|begin_of_text|>",
                        eos: str = "<|im_end|>"):
    """Write a small byte-level BPE tokenizer.json (GPT-2/Qwen style, chat special tokens) and a
    tokenizer_config.json carrying ``template``; return (tokenizer.json, tokenizer_config.json) paths."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=CHAT_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CHAT_WORDS] * 20, trainer)
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "pad_token": "<|endoftext|>", "chat_template": template, "model_max_length": 1 << 20}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return str(directory / "tokenizer.json"), str(directory / "tokenizer_config.json")


CHAT_WORD_LIST = ("the quick brown fox jumps over lazy dog hello world how are you fine thanks what is two plus "
                  "four").split()


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """Return n generated chats: an optional system turn, then user/assistant turns of varied lengths."""
    rng = np.random.default_rng(seed)

    def text(k):
        words = [CHAT_WORD_LIST[i] for i in rng.integers(0, len(CHAT_WORD_LIST), k)]
        if rng.random() < 0.2:
            words.append("\u00fcn\u00efcode \U0001f98a")
        return " ".join(words)

    out = []
    for _ in range(n):
        chat = [{"role": "system", "content": text(3)}] if rng.random() < 0.5 else []
        for _ in range(int(rng.integers(1, 4))):
            chat.append({"role": "user", "content": text(int(rng.integers(1, 12)))})
            chat.append({"role": "assistant", "content": text(int(rng.integers(0, 12)))})
        out.append(chat)
    return out
