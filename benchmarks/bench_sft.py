"""Fine-tuning chats: raw ``messages`` JSONL to a stored, packed plan at 2 ranks vs TRL's tokenize-and-pack.

100k generated conversations at ``--scale full`` (1k at small): an optional system turn, then 1-4
user/assistant exchanges, each turn's words log-normal. sortpack: ``sortpack run part-*.jsonl
--chat-template tokenizer_config.json --tokenizer tokenizer.json --rows ROW_LEN --store-tokens``
under ``mpiexec -n 2`` (render, tokenize, assistant labels, sort, pack, store ids and labels). TRL:
``SFTTrainer(..., SFTConfig(packing=True, max_length=ROW_LEN, assistant_only_loss=True,
dataset_num_proc=2))`` on ``load_dataset("json", ...)``, timed from the load to the trainer's
packed dataset (TRL's own tokenize and BFD pack, a fresh datasets cache), in one subprocess;
skipped with a line when ``trl`` is not importable. Both read the same 4 JSONL files (a JSONL file
is read whole by one rank) with the same tokenizer and template; one run of each. The plan's
targets imbalance at W=64 is reported beside. Registered in ``suite.py`` as ``sft``:
``python -m benchmarks --only sft``.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

from . import data
from .report import Row, secs

ROW_LEN = 4096
RANKS = 2
WORDS = ("the of and to in is it that for on with as was at by an be this from or are not have but what all were "
         "when we there can your which their said if do will each about how up out them then she many some so "
         "these would other into has more her two like him see time could no make than first been its who now "
         "people my made over did down only way find use may water long little very after words called just where "
         "most know get through back much go good new write our me man too any day same right look think also "
         "around another came come work three word must because does part even place well such here take why "
         "things help put years different away again off went old number great tell men say small every found "
         "still between name should home big give air line set own under read last never us left end along while "
         "might next sound below saw something thought both few those always looked show large often together "
         "asked house world going want school important until form food keep children feet land side without boy "
         "once animals life enough took sometimes four head above kind began almost live page got earth need far "
         "hand high year mother light parts country father let night following picture being study second eyes "
         "soon times story boys since white days ever paper hard near sentence better best across during today "
         "others however sure means knew try told young miles sun ways thing whole hear example heard several "
         "change answer room sea against top turned learn point city play toward five using himself usually").split()
CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
          "{%- if message['role'] == 'assistant' %}{% generation %}{{- message['content'] + '<|im_end|>' }}"
          "{% endgeneration %}{{- '\\n' }}{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}"
          "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def make_tokenizer(directory: Path) -> tuple[Path, Path]:
    """Return (tokenizer.json, tokenizer_config.json): a byte-level BPE of 2k tokens with ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok_file, config = directory / "tokenizer.json", directory / "tokenizer_config.json"
    if tok_file.is_file() and config.is_file():
        return tok_file, config
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = np.random.default_rng(0)
    corpus = [" ".join(rng.choice(WORDS, 50)) for _ in range(2000)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=2048, special_tokens=[
        "<|endoftext|>", "<|im_start|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tok_file))
    config.write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                                  "pad_token": "<|endoftext|>", "chat_template": CHATML,
                                  "model_max_length": 1 << 20}))
    return tok_file, config


def make_chats(directory: Path, n: int, seed: int = 0, files: int = 4) -> list[Path]:
    """Write ``n`` conversations (role turns of log-normal word counts; prompts and answers vary) as JSONL files.

    Several files: a JSONL file is read whole by one rank.
    """
    paths = [directory / f"part-{k}.jsonl" for k in range(files)]
    if all(p.is_file() for p in paths):
        return paths
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    exchanges = rng.integers(1, 5, n)
    system = rng.random(n) < 0.5
    turns = int(2 * exchanges.sum() + system.sum())
    # user turns short or long (a question, a pasted document), answers of their own spread
    lengths = np.maximum(1, rng.lognormal(3.0, 1.0, turns)).astype(np.int64).clip(1, 2000)
    text = words[rng.integers(0, len(words), int(lengths.sum()))]
    ends = np.cumsum(lengths)
    contents = [" ".join(text[e - k:e]) for e, k in zip(ends, lengths)]
    directory.mkdir(parents=True, exist_ok=True)
    at = 0
    bounds = np.linspace(0, n, files + 1).astype(int)
    for k, path in enumerate(paths):
        with open(path, "w") as f:
            for i in range(bounds[k], bounds[k + 1]):
                chat = []
                if system[i]:
                    chat.append({"role": "system", "content": contents[at]})
                    at += 1
                for _ in range(int(exchanges[i])):
                    chat.append({"role": "user", "content": contents[at]})
                    chat.append({"role": "assistant", "content": contents[at + 1]})
                    at += 2
                f.write(json.dumps({"messages": chat}) + "\n")
    return paths


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
cfg = SFTConfig(output_dir=args["out"], packing=True, max_length=args["row_len"], assistant_only_loss=True,
                dataset_num_proc=args["procs"], report_to=[], per_device_train_batch_size=1, use_cpu=True,
                bf16=False)
trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
t2 = time.perf_counter()
packed = trainer.train_dataset
print("BENCH_JSON " + json.dumps({"prepare_s": t2 - t1, "setup_s": t1 - t0, "rows": len(packed)}))
"""


def trl_pack(jsonl: list[Path], tokenizer_dir: Path, work: Path, timeout: float) -> dict:
    """Return TRL's tokenize-and-pack of ``jsonl`` (seconds from the load to the packed dataset), in a subprocess."""
    from .runner import launch

    cache = work / "trl-cache"
    shutil.rmtree(cache, ignore_errors=True)
    args = {"jsonl": [str(p) for p in jsonl], "tokenizer_dir": str(tokenizer_dir), "cache": str(cache),
            "out": str(work / "trl"), "row_len": ROW_LEN, "procs": RANKS}
    _, out = launch([sys.executable, "-c", TRL_SCRIPT, json.dumps(args)], timeout)
    shutil.rmtree(cache, ignore_errors=True)
    for line in reversed(out.splitlines()):
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON "):])
    raise RuntimeError("the TRL run printed no result")


def bench(ctx) -> list[Row]:
    """Return the rows: sortpack's stored packed plan of the chats at 2 ranks vs TRL's, and the plan's figures."""
    from .runner import missing_modules, sortpack_cli

    missing = missing_modules("tokenizers", "jinja2")
    if missing:
        return [Row("sft", "chats to a stored packed plan", RANKS, "skipped", note=f"needs {', '.join(missing)}")]
    n = 100_000 if ctx.scale_name == "full" else 1_000
    work = data.work_dir("sft")
    tok_file, config = make_tokenizer(work / "tokenizer")
    ctx.log(f"generating {n} conversations")
    jsonl = make_chats(work / f"chats-{n}", n)
    out = work / "plan"
    trl_missing = missing_modules("trl", "datasets", "transformers")
    best, trl_best, trl_info = float("inf"), float("inf"), {}
    rounds = 1  # one run of each: TRL's alone takes minutes at full scale
    for r in range(rounds):
        ctx.log(f"round {r + 1}/{rounds}: sortpack run at P={RANKS}")
        best = min(best, sortpack_cli(["run", *map(str, jsonl), "-o", str(out), "--chat-template", str(config),
                                       "--tokenizer", str(tok_file), "--rows", str(ROW_LEN), "--store-tokens",
                                       "--overwrite", "--quiet"], ctx.scale.timeout, RANKS))
        if not trl_missing:
            ctx.log(f"round {r + 1}/{rounds}: TRL SFTTrainer tokenize and pack, {RANKS} processes")
            trl_info = trl_pack(jsonl, config.parent, work, ctx.scale.timeout)
            trl_best = min(trl_best, trl_info["prepare_s"])
    man = json.loads((out / "manifest.json").read_text())
    from sortpack.report.inspect import inspect_directory

    report = inspect_directory(str(out), world_size=64, grad_accum=1)
    targets = report.get("targets_imbalance", {})
    note = (f"{man['num_microbatches']} rows of {ROW_LEN}, fill {report['fill']:.4f}, {man['stats']['targets']} "
            f"targets of {report['tokens']} tokens; targets imbalance at W=64: p99 {targets.get('p99', 0):.2f}, "
            f"weighted {targets.get('weighted', 0):.3f}")
    if trl_missing:
        ctx.notes.append(f"sft: TRL's tokenize-and-pack skipped ({', '.join(trl_missing)} not importable)")
        row = Row("sft", f"{n // 1000}k chats JSONL to a stored packed plan (--rows {ROW_LEN})", RANKS, secs(best),
                  "TRL skipped", note=note)
    else:
        ratio = best / trl_best
        row = Row("sft", f"{n // 1000}k chats JSONL to a stored packed plan (--rows {ROW_LEN})", RANKS, secs(best),
                  f"TRL SFTTrainer pack: {secs(trl_best)} ({trl_info.get('rows', 0)} rows)", f"{ratio:.2f}× TRL",
                  "≤ 1×", ratio <= 1.0, note)
    shutil.rmtree(out, ignore_errors=True)
    return [row]
