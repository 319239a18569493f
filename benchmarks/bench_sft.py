"""Fine-tuning chats and pairs: raw JSONL to a stored, packed plan at 2 ranks vs TRL's tokenize-and-pack.

Real chat templates (Llama 3's and Qwen 2.5's own, as TRL ships them) with a real vocabulary
(openai-whisper's multilingual ranks with the family's pattern and special tokens: ``sft_data``),
and Mistral 7B v0.2's and v0.3's own templates on Mistral's own SentencePiece vocabularies
(``real_templates``, ``real_vocab``; TRL then runs without ``assistant_only_loss``, which it
refuses for a template it has no training variant of);
20k generated conversations at ``--scale full`` (1k at small, Llama 3's and v0.2's chats and the pairs
alone): an optional system turn, then 1-4 user/assistant exchanges, each turn's words log-normal (a few
non-ASCII); and as many
prompt/completion pairs. sortpack: ``sortpack run part-*.jsonl --chat-template
tokenizer_config.json --tokenizer tokenizer.json --rows ROW_LEN --store-tokens`` (pairs:
``--prompt-column prompt --completion-column completion``) under ``mpiexec -n 2`` (render,
tokenize, labels, sort, pack, store ids and labels), the whole command timed. TRL:
``SFTTrainer(..., SFTConfig(packing=True, max_length=ROW_LEN, assistant_only_loss=True,
dataset_num_proc=2))`` on ``load_dataset("json", ...)``, timed from the load to the trainer's
packed dataset (TRL's own tokenize and BFD pack, a fresh datasets cache), in one subprocess.
Rounds alternate (sortpack, TRL, sortpack, TRL, ...: 3 at full, 1 at small), the best of each
kept; each case starts with an empty conversion cache (``SORTPACK_CACHE_DIR`` in the work
folder), so its first sortpack round proves the tokenizer's conversion as a first job does and
the later ones read it back as later jobs do: the first round is printed beside the best. The same
command on 8 of the rows gives the floor (start-up, the tokenizer's load, the stages' fixed costs).
Rendering alone (every conversation's text, no tokens) is timed in this process, by the path a
job takes (``fast_render``) and by the template's Jinja (``render_chats``). Skipped with a line
when openai-whisper, trl or tokenizers is not importable. Registered in ``suite.py`` as
``sft``: ``python -m benchmarks --only sft``.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from . import data, sft_data
from .report import Row, secs
from .runner import sortpack_cli

ROW_LEN = 4096
RANKS = 2


TRL_SCRIPT = """
import json, sys, tempfile, time
t0 = time.perf_counter()
from datasets import load_dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import SFTConfig, SFTTrainer
args = json.loads(sys.argv[1])
tok = AutoTokenizer.from_pretrained(args["tokenizer_dir"])
model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2))
t1 = time.perf_counter()
ds = load_dataset("json", data_files=args["jsonl"], split="train", cache_dir=args["cache"])
cfg = SFTConfig(output_dir=args["out"], packing=True, max_length=args["row_len"], assistant_only_loss=args["chats"],
                dataset_num_proc=args["procs"], report_to=[], per_device_train_batch_size=1, use_cpu=True,
                bf16=False)
trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
t2 = time.perf_counter()
packed = trainer.train_dataset
print("BENCH_JSON " + json.dumps({"prepare_s": t2 - t1, "setup_s": t1 - t0, "rows": len(packed)}))
"""


def trl_pack(jsonl: list[Path], tokenizer_dir: Path, work: Path, timeout: float, chats: bool = True,
             assistant_only: bool = True) -> dict:
    """Return TRL's tokenize-and-pack of ``jsonl`` (seconds from the load to the packed dataset), in a subprocess;
    chats with ``assistant_only_loss`` where ``assistant_only`` (TRL refuses it for a template it has no training
    variant of, such as Mistral's)."""
    from .runner import launch

    cache = work / "trl-cache"
    shutil.rmtree(cache, ignore_errors=True)
    args = {"jsonl": [str(p) for p in jsonl], "tokenizer_dir": str(tokenizer_dir), "cache": str(cache),
            "out": str(work / "trl"), "row_len": ROW_LEN, "procs": RANKS, "chats": chats and assistant_only}
    _, out = launch([sys.executable, "-c", TRL_SCRIPT, json.dumps(args)], timeout)
    shutil.rmtree(cache, ignore_errors=True)
    for line in reversed(out.splitlines()):
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON "):])
    raise RuntimeError("the TRL run printed no result")


def render_times(config: Path, jsonl: list[Path]) -> dict:
    """Return the seconds rendering every conversation takes (no tokens): the path a job takes, and Jinja's."""
    import time

    import pyarrow as pa
    import pyarrow.json as pj

    from sortpack.inputs.finetune import load_chat_template, render_chats

    template = load_chat_template(config)
    col = pa.concat_arrays([pj.read_json(p).column("messages").combine_chunks() for p in jsonl])
    from sortpack.inputs.finetune.fast_render import render_column

    render_column(template, col.slice(0, 8))  # its imports and pyarrow's kernels: a job's start-up, not rendering
    t0 = time.perf_counter()
    fast = render_column(template, col)
    t1 = time.perf_counter()
    render_chats(template, col.to_pylist())
    t2 = time.perf_counter()
    return {"fast_s": t1 - t0 if fast is not None else None, "jinja_s": t2 - t1}


def _sortpack(files: list[Path], out: Path, tok_file: Path, config: Path, chats: bool, timeout: float) -> float:
    shape = ["--chat-template", str(config)] if chats else ["--prompt-column", "prompt", "--completion-column",
                                                             "completion"]
    return sortpack_cli(["run", *map(str, files), "-o", str(out), *shape, "--tokenizer", str(tok_file), "--rows",
                         str(ROW_LEN), "--store-tokens", "--overwrite", "--quiet"], timeout, RANKS)


def _case(ctx, family: str, chats: bool, n: int, rounds: int) -> list[Row]:
    """Return the rows of one family's chats (or pairs): sortpack vs TRL in alternated rounds, and rendering."""
    work = data.work_dir("sft")
    got = sft_data.real_tokenizer(family, work / "tokenizers")
    kind = "chats" if chats else "pairs"
    mistral = family in sft_data.MISTRAL
    if got is None:
        need = "MISTRAL_COMMON_DATA and CHAT_TEMPLATES_DATA (.ci/run)" if mistral else "openai-whisper and trl"
        return [Row("sft", f"{family} {kind}", RANKS, "skipped", note=f"needs {need}")]
    tok_file, config = got
    words = sft_data.WORDS + sft_data.MORE_WORDS
    if chats:
        share = sft_data.MISTRAL[family][1] if mistral else 0.5
        files = sft_data.make_chats(work / f"{kind}-{n}-{share}", n, words=words, system_share=share)
    else:
        files = sft_data.make_pairs(work / f"{kind}-{n}", n, words=words)
    out, best, trl_best, trl_rows = work / "plan", float("inf"), float("inf"), 0
    cache = work / "conversion-cache"  # empty: the first round proves the conversion, as a first job does
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["SORTPACK_CACHE_DIR"] = str(cache)
    first = None
    for r in range(rounds):  # alternated: a machine's load falls on both alike
        ctx.log(f"{family} {kind} round {r + 1}/{rounds}: sortpack run at P={RANKS}, then TRL")
        took = _sortpack(files, out, tok_file, config, chats, ctx.scale.timeout)
        first, best = took if first is None else first, min(best, took)
        info = trl_pack(files, config.parent, work, ctx.scale.timeout, chats, assistant_only=not mistral)
        trl_best, trl_rows = min(trl_best, info["prepare_s"]), info["rows"]
    man = json.loads((out / "manifest.json").read_text())
    prov = man.get("provenance", {})
    path = prov.get("chat_render") or prov.get("tokenizers")
    trl_loss = "; TRL without assistant_only_loss (it has no training template of Mistral's)" if mistral else ""
    note = (f"first job (conversion proven) {secs(first)}, {first / trl_best:.3f}x TRL{trl_loss}; "
            f"{man['num_microbatches']} rows, {man['stats']['targets']} targets; path {json.dumps(path)}")
    shutil.rmtree(out, ignore_errors=True)
    ratio = best / trl_best
    full = n >= 20_000  # at small scale the floor (start-up, the tokenizer's load) is most of either run
    rows = [Row("sft", f"{family}: {n // 1000}k {kind} to a stored packed plan", RANKS, secs(best),
                f"TRL SFTTrainer: {secs(trl_best)} ({trl_rows} rows)", f"{ratio:.3f}x TRL",
                "<= 0.125x" if full else "", ratio <= 0.125 if full else None, note)]
    # the floor: the same command on 8 of the conversations (start-up, the tokenizer's load, the stages' fixed costs)
    tiny = work / f"{kind}-tiny"
    tiny.mkdir(exist_ok=True)
    (tiny / "part-0.jsonl").write_text("".join(files[0].read_text(encoding="utf-8").splitlines(True)[:8]))
    floor = min(_sortpack([tiny / "part-0.jsonl"], out, tok_file, config, chats, ctx.scale.timeout)
                for _ in range(rounds))
    shutil.rmtree(out, ignore_errors=True)
    rows.append(Row("sft", f"{family}: the same command on 8 {kind} (the floor)", RANKS, secs(floor),
                    ratio=f"{floor / trl_best:.3f}x TRL", note=f"{floor / best:.0%} of the {n // 1000}k run"))
    if chats:
        t = render_times(config, files)
        fast = t["fast_s"]
        rows.append(Row("sft", f"{family}: rendering alone (one process)", 1,
                        secs(fast) if fast is not None else "no fast path", f"Jinja: {secs(t['jinja_s'])}",
                        f"{(fast if fast is not None else t['jinja_s']) / trl_best:.3f}x TRL",
                        note=f"Jinja alone is {t['jinja_s'] / trl_best:.3f}x TRL's preparation"))
    return rows


def bench(ctx) -> list[Row]:
    """Return the rows: stored packed plans of chats (Llama 3, Qwen 2.5, Mistral 7B v0.2 and v0.3) and pairs at 2
    ranks vs TRL's."""
    from .runner import missing_modules

    missing = missing_modules("tokenizers", "jinja2", "trl", "datasets", "transformers", "whisper")
    if missing:
        return [Row("sft", "chats to a stored packed plan", RANKS, "skipped", note=f"needs {', '.join(missing)}")]
    full = ctx.scale_name == "full"
    n, rounds = (20_000, 3) if full else (1_000, 1)
    cases = [("llama3", True), ("qwen2_5", True), ("mistral_v0_2", True), ("mistral_v0_3", True), ("llama3", False)]
    if not full:  # the smoke run: each kind of case once (a byte-level and a SentencePiece family's chats, pairs)
        cases = [("llama3", True), ("mistral_v0_2", True), ("llama3", False)]
    rows = []
    for family, chats in cases:
        rows += _case(ctx, family, chats, n, rounds)
    return rows
