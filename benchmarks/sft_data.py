"""What ``bench_sft`` measures on: real chat templates (the models' own, as TRL ships them, and Mistral's from
``real_templates``) with a real vocabulary (``real_vocab``: openai-whisper's multilingual ranks, with the family's
pattern and its special tokens added; Mistral's own SentencePiece models), generated conversations and
prompt/completion pairs as JSONL files."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from . import real_vocab

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
MORE_WORDS = "usually, naïve café: où? 東京 数据 2024 3.14 «вопрос» ¿qué? ...".split()  # the benchmark's, beyond ASCII
CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
          "{%- if message['role'] == 'assistant' %}{% generation %}{{- message['content'] + '<|im_end|>' }}"
          "{% endgeneration %}{{- '\\n' }}{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}"
          "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# family -> (real_vocab variant, TRL's template file, bos, eos, the template's special tokens)
FAMILIES = {
    "llama3": ("multilingual-llama3", "llama3.jinja", "<|begin_of_text|>", "<|eot_id|>",
               ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    "qwen2_5": ("multilingual-qwen2", "qwen2_5.jinja", None, "<|im_end|>", ("<|im_end|>",)),
}
# family -> (real_vocab.SP_VARIANTS name, the share of conversations with a system turn): Mistral 7B v0.2's template
# on v0.1's vocabulary (as Mistral-7B-Instruct-v0.2 ships), v0.3's on its own (which keeps a system message only in a
# conversation that ends with the user: a trained one has none)
MISTRAL = {"mistral_v0_2": ("mistral-v1", 0.5), "mistral_v0_3": ("mistral-v3", 0.0)}


def trl_template(name: str) -> str | None:
    """Return one of the models' own chat templates TRL ships (None: trl not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "chat_templates" / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def real_tokenizer(family: str, directory: Path) -> tuple[Path, Path] | None:
    """Return (tokenizer.json, tokenizer_config.json) of ``family``: the real vocabulary with the family's pattern and
    special tokens, and the family's own chat template (None: openai-whisper or trl not installed)."""
    folder = directory / family
    tok_file, config = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if tok_file.is_file() and config.is_file():
        return tok_file, config
    if family in MISTRAL:
        return _mistral(family, tok_file, config)
    variant, template_file, bos, eos, specials = FAMILIES[family]
    template = trl_template(template_file)
    assets = real_vocab.whisper_assets()
    if assets is None or template is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    asset, style, ignore = real_vocab.VARIANTS[variant]
    spec = real_vocab.tokenizer_json(real_vocab.load_ranks(assets[asset]), style, ignore)
    top = max(t["id"] for t in spec["added_tokens"]) + 1
    have = {t["content"] for t in spec["added_tokens"]}
    spec["added_tokens"] += [{"id": top + k, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}
                             for k, c in enumerate(c for c in specials if c not in have)]
    tmp = tok_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec), encoding="utf-8")
    os.replace(tmp, tok_file)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": "<|endoftext|>",
           "chat_template": template, "model_max_length": 1 << 20}
    if bos:
        cfg["bos_token"] = bos
    config.write_text(json.dumps(cfg), encoding="utf-8")
    return tok_file, config


def _mistral(family: str, tok_file: Path, config: Path) -> tuple[Path, Path] | None:
    """Return (tokenizer.json, tokenizer_config.json) of a Mistral family: its SentencePiece model converted, its own
    template (None: mistral-common's model files or the templates not found)."""
    from . import real_templates

    templates = real_templates.mistral_templates()
    if templates is None:
        return None
    tok_file.parent.mkdir(parents=True, exist_ok=True)
    written = real_vocab.write_sentencepiece(MISTRAL[family][0], tok_file.parent)
    if written is None:
        return None
    os.replace(written, tok_file)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<unk>",
           "chat_template": templates[family], "model_max_length": 1 << 20, "legacy": False}
    config.write_text(json.dumps(cfg), encoding="utf-8")
    return tok_file, config


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


def _contents(rng, count: int, words: tuple[str, ...] | list[str] = WORDS) -> list[str]:
    """Return ``count`` texts of log-normal word counts (a question, a pasted document, an answer)."""
    words = np.array(words)
    lengths = np.maximum(1, rng.lognormal(3.0, 1.0, count)).astype(np.int64).clip(1, 2000)
    text = words[rng.integers(0, len(words), int(lengths.sum()))]
    ends = np.cumsum(lengths)
    return [" ".join(text[e - k:e]) for e, k in zip(ends, lengths)]


def _write(paths: list[Path], rows: list[dict]) -> list[Path]:
    """Write ``rows`` as JSONL split evenly over ``paths`` (a JSONL file is read whole by one rank)."""
    bounds = np.linspace(0, len(rows), len(paths) + 1).astype(int)
    for k, path in enumerate(paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[bounds[k]:bounds[k + 1]])
    return paths


def make_chats(directory: Path, n: int, seed: int = 0, files: int = 4, words: list[str] = WORDS,
               system_share: float = 0.5) -> list[Path]:
    """Return ``files`` JSONL files of ``n`` conversations of ``words``: a system turn (in ``system_share`` of them),
    then 1-4 user/assistant exchanges (``tests/pipeline/test_finetune_plans.py`` measures ASCII ones)."""
    paths = [directory / f"part-{k}.jsonl" for k in range(files)]
    if all(p.is_file() for p in paths):
        return paths
    rng = np.random.default_rng(seed)
    exchanges = rng.integers(1, 5, n)
    system = rng.random(n) < system_share
    contents = iter(_contents(rng, int(2 * exchanges.sum() + system.sum()), words))
    rows = []
    for i in range(n):
        chat = [{"role": "system", "content": next(contents)}] if system[i] else []
        for _ in range(int(exchanges[i])):
            chat += [{"role": "user", "content": next(contents)}, {"role": "assistant", "content": next(contents)}]
        rows.append({"messages": chat})
    return _write(paths, rows)


def make_pairs(directory: Path, n: int, seed: int = 1, files: int = 4, words: list[str] = WORDS) -> list[Path]:
    """Return ``files`` JSONL files of ``n`` prompt/completion pairs of ``words``."""
    paths = [directory / f"part-{k}.jsonl" for k in range(files)]
    if all(p.is_file() for p in paths):
        return paths
    texts = _contents(np.random.default_rng(seed), 2 * n, words)
    return _write(paths, [{"prompt": texts[2 * i], "completion": " " + texts[2 * i + 1]} for i in range(n)])
