"""The training recipes of docs/training.md run for a few steps on CPU on indexes the real pipeline wrote."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support import ROOT, run_gloo_ranks, run_sortpack

pytestmark = pytest.mark.torch
RECIPES = ROOT / "examples" / "recipes"
TIMEOUT = 240


def doc_commands() -> dict[str, list[str]]:
    """Return the ``sortpack run data/ -o NAME/ ...`` commands of docs/training.md by output name (their options)."""
    doc = (ROOT / "docs" / "training.md").read_text()
    found = re.findall(r"^sortpack run data/ -o (\w+)/ (.*?)\s*(?:#.*)?$", doc, flags=re.MULTILINE)
    return {name: opts.split() for name, opts in found}


def write_docs_data(directory: Path) -> np.ndarray:
    """Write ``data/`` as a user's texts: mostly short, one longer than 4096 bytes, 20 empty, one non-ASCII."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = np.concatenate([rng.lognormal(5.0, 0.8, 300).astype(int).clip(1, 1500), [4200], [0] * 20])
    rng.shuffle(sizes)
    letters = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz.\n", dtype=np.uint8)
    texts = [letters[rng.integers(0, len(letters), k)].tobytes().decode() for k in sizes]
    texts[int(np.flatnonzero(sizes > 100)[0])] = "\u00e9t\u00e9 " * 60  # 2-byte characters: sizes in bytes
    pq.write_table(pa.table({"text": texts}), directory / "part-0.parquet", row_group_size=100)
    return sizes


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    """Build the plans with the exact ``sortpack run`` commands of docs/training.md over one text dataset.

    The one change: ``--rows-per-microbatch 8`` becomes 1, so the CPU's dense document mask of
    the flex recipe stays small (4096 x 4096 per row).
    """
    base = tmp_path_factory.mktemp("recipes")
    write_docs_data(base / "data")
    commands = doc_commands()
    assert set(commands) == {"plan", "shapes", "rows"}, commands
    out = {}
    for name, opts in commands.items():
        if name == "rows":
            opts = [("1" if prev == "--rows-per-microbatch" else o) for prev, o in zip([""] + opts, opts)]
        out[name] = base / name
        proc = run_sortpack(["run", base / "data", "-o", out[name], *opts], timeout=TIMEOUT)
        assert "dropped 20 empty samples" in proc.stdout  # never a micro-batch of pure padding
    out["padded"] = out["plan"]
    return out


def steps_past_longest(index: Path, grad_accum: int = 2, seed: int = 0, warmup_shapes: bool = False) -> int:
    """Return the steps a recipe must run (order shuffle) to have trained on the plan's longest micro-batch."""
    from sortpack.torch import PackedBatchSampler

    sampler = PackedBatchSampler(index, rank=0, world_size=1, grad_accum=grad_accum, order="shuffle", seed=seed,
                                 warmup_shapes=warmup_shapes)
    padded = sampler.index["padded_size"]
    steps = np.flatnonzero((padded[sampler.schedule()] == padded.max()).any(axis=1))
    return int(steps[0]) + 1


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
            "TOKENIZERS_PARALLELISM": "false", **extra}


def run_recipe(name: str, index: Path, *args: str) -> str:
    """Run a recipe script; return its output (the test fails on a non-zero exit)."""
    proc = subprocess.run([sys.executable, str(RECIPES / name), str(index), *args], capture_output=True,
                          text=True, check=False, timeout=TIMEOUT, env=_env(), cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def step_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"(rank \d+ )?step \d+", line)]


def lrs(out: str) -> list[float]:
    return [float(line.split(" lr ")[1].split()[0]) for line in step_lines(out)]


def losses(out: str) -> list[str]:
    return [line.split(" loss ")[1].split()[0] for line in step_lines(out)]


@pytest.mark.slow
def test_ddp_two_gloo_ranks(indexes):
    from sortpack.torch import PackedBatchSampler

    steps = PackedBatchSampler(indexes["padded"], rank=0, world_size=2, grad_accum=2).steps_per_epoch
    outs = run_gloo_ranks([RECIPES / "ddp.py", indexes["padded"], "--steps", str(steps)], timeout=TIMEOUT,
                          env={"CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"})
    per_rank = [[line for line in step_lines(out) if line.startswith(f"rank {r} ")] for r, out in enumerate(outs)]
    assert [len(lines) for lines in per_rank] == [steps, steps], outs  # the whole epoch: every micro-batch
    assert steps >= 2 and not any("nan" in out for out in outs)
    assert lrs(outs[0]) == lrs(outs[1])  # the step's global batch sets one LR on every rank
    shapes = [[line.split(" shape ")[1].split(" lr")[0] for line in lines] for lines in per_rank]
    assert shapes[0] != shapes[1]  # each rank trains on its own micro-batches


@pytest.mark.slow
def test_rl_batches_two_gloo_ranks_plan_in_memory():
    outs = run_gloo_ranks([RECIPES / "rl_batches.py", "--steps", "2"], timeout=TIMEOUT,
                          env={"CUDA_VISIBLE_DEVICES": ""})
    plans = [line for line in outs[0].splitlines() if line.startswith("step ")]
    assert len(plans) == 2 and not any("nan" in out for out in outs)
    ranks = [re.findall(r"rank \d step (\d) micro-batches (\d+) tokens \d+ largest (\d+)", out) for out in outs]
    assert [s for s, _, _ in ranks[0]] == [s for s, _, _ in ranks[1]] == ["0", "1"]
    assert [c for _, c, _ in ranks[0]] == [c for _, c, _ in ranks[1]]  # equal counts: DDP's all-reduces pair up
    assert all(int(top) <= 1024 for r in ranks for _, _, top in r)  # no micro-batch over --max-tokens


def expected_lrs(index: Path, steps: int, lr: float = 1e-3, grad_accum: int = 2, seed: int = 0) -> list[float]:
    """Return the LR of each step: lr x sqrt(step tokens / mean tokens per step), as the recipes set it.

    The recipes' loss is ``step_loss``, a mean over the step's tokens: the LR scales by tokens.
    """
    from sortpack.torch import PackedBatchSampler

    sampler = PackedBatchSampler(index, rank=0, world_size=1, grad_accum=grad_accum, order="shuffle", seed=seed)
    ref = max(1, round(int(sampler.index["tokens"].sum()) / sampler.steps_per_epoch))
    return [lr * (b / ref) ** 0.5 for b in sampler.step_batches(by="tokens")[:steps]]


@pytest.mark.slow
def test_hf_trainer(indexes):
    steps = steps_past_longest(indexes["padded"], seed=42)  # the sampler takes the Trainer's seed, 42
    out = run_recipe("hf_trainer.py", indexes["padded"], "--steps", str(steps))
    assert f"trained {steps} steps" in out and "nan" not in out
    # constant base schedule: the LR moves only with the step's batch
    assert lrs(out) == pytest.approx(expected_lrs(indexes["padded"], steps, seed=42), rel=1e-3)


@pytest.mark.slow
def test_accelerate(indexes):
    steps = steps_past_longest(indexes["padded"])
    out = run_recipe("accelerate_loop.py", indexes["padded"], "--steps", str(steps))
    assert len(step_lines(out)) == steps and "nan" not in out
    assert lrs(out) == pytest.approx(expected_lrs(indexes["padded"], steps), rel=1e-3)


@pytest.mark.slow
def test_lightning(indexes):
    steps = steps_past_longest(indexes["padded"])
    out = run_recipe("lightning_module.py", indexes["padded"], "--steps", str(steps))
    assert f"trained {steps} steps" in out and len(step_lines(out)) == steps and "nan" not in out
    assert lrs(out) == pytest.approx(expected_lrs(indexes["padded"], steps), rel=1e-3)


@pytest.mark.slow
def test_compile_static_shapes_compiles_every_shape_up_front(indexes):
    from sortpack.reader import PackedIndex

    ix = PackedIndex(indexes["shapes"])
    distinct = len(set(zip(ix["batch_size"].tolist(), ix["padded_size"].tolist())))
    out = run_recipe("compile_static.py", indexes["shapes"], "--steps", str(distinct + 2), "--grad-accum", "1",
                     "--backend", "aot_eager")
    news = [int(line.split(" new ")[1].split()[0]) for line in step_lines(out)]
    assert news == [1] * distinct + [0, 0]  # warmup_shapes: every shape in the first steps, then none new
    assert "nan" not in out  # no micro-batch of pure padding (empty samples dropped), no empty loss
    assert f"distinct shapes {distinct}, shapes seen {distinct}, graphs compiled {distinct}" in out


@pytest.mark.slow
def test_flex_document_mask_and_varlen_reference_agree(indexes):
    flex = run_recipe("flex_rows.py", indexes["rows"], "--steps", "3")
    varlen = run_recipe("varlen_rows.py", indexes["rows"], "--steps", "3")
    assert len(step_lines(flex)) == len(step_lines(varlen)) == 3
    assert "kernel reference" in varlen
    # the same micro-batches, weights and masking: the losses match step for step
    assert losses(flex) == losses(varlen) and "nan" not in flex


@pytest.mark.slow
def test_varlen_on_a_padded_index(indexes):
    steps = steps_past_longest(indexes["padded"])
    out = run_recipe("varlen_rows.py", indexes["padded"], "--steps", str(steps))
    assert len(step_lines(out)) == steps and "nan" not in out


def recipe_section(path: Path) -> str:
    """Return the code between a recipe file's ``# --- recipe ---`` and ``# --- end recipe ---`` lines, dedented."""
    text = path.read_text()
    start = text.index("# --- recipe ---\n") + len("# --- recipe ---\n")
    end = text.rindex("\n", 0, text.index("# --- end recipe ---")) + 1
    return textwrap.dedent(text[start:end])


def test_docs_quote_the_recipes():
    doc = "".join((ROOT / "docs" / name).read_text() for name in ("training.md", "fine-tuning.md", "plan-batch.md",
                                                                 "multimodal.md"))
    blocks = re.findall(r"<!-- recipe: (\S+) -->\n```python\n(.*?)```", doc, flags=re.DOTALL)
    assert {path for path, _ in blocks} == {f"examples/recipes/{p.name}" for p in RECIPES.glob("*.py")
                                            if "# --- recipe ---" in p.read_text()}
    for path, code in blocks:
        assert code == recipe_section(ROOT / path), f"the docs' copy of {path} is out of date"


@pytest.fixture(scope="module")
def chat_plan(tmp_path_factory) -> tuple[Path, str]:
    """A --rows plan of generated chats stored with their ids and assistant-only labels (docs/fine-tuning.md)."""
    import json

    from support import conversations, make_chat_tokenizer

    base = tmp_path_factory.mktemp("sft")
    tokenizer, config = make_chat_tokenizer(base / "tok")
    with open(base / "chats.jsonl", "w") as f:
        for chat in conversations(200, seed=11):
            f.write(json.dumps({"messages": chat}) + "\n")
    run_sortpack(["run", base / "chats.jsonl", "-o", base / "plan", "--chat-template", config, "--tokenizer",
                  tokenizer, "--rows", "512", "--store-tokens", "--quiet"], timeout=TIMEOUT)
    return base / "plan", tokenizer


@pytest.mark.slow
def test_sft_trains_assistant_tokens_and_resumes_on_the_same_steps(chat_plan, tmp_path):
    pytest.importorskip("transformers")
    plan, tokenizer = chat_plan
    straight = run_recipe("sft.py", plan, "--tokenizer", tokenizer, "--steps", "4")
    first = run_recipe("sft.py", plan, "--tokenizer", tokenizer, "--steps", "2", "--save", str(tmp_path / "c.pt"))
    resumed = run_recipe("sft.py", plan, "--tokenizer", tokenizer, "--steps", "4", "--resume", str(tmp_path / "c.pt"))
    assert len(step_lines(straight)) == 4 and "nan" not in straight
    # the resumed run continues on the same samples with the same weights: the very same losses
    assert losses(first) + losses(resumed) == losses(straight)
    assert [line.split()[1] for line in step_lines(resumed)] == ["2", "3"]


def multimodal_command() -> list[str]:
    """Return the options of docs/multimodal.md's ``sortpack run vl/ -o plan/ ...`` command of the VLM recipe."""
    doc = (ROOT / "docs" / "multimodal.md").read_text()
    found = re.search(r"^sortpack run vl/ -o plan/ (.*?)```", doc, flags=re.MULTILINE | re.DOTALL)
    assert found, "docs/multimodal.md gives the recipe's command"
    return found.group(1).replace("\\\n", " ").split()


@pytest.mark.slow
def test_vlm_rows_trains_a_tiny_qwen2_vl_on_rows_within_the_caps(tmp_path):
    pytest.importorskip("transformers")
    subprocess.run([sys.executable, str(RECIPES / "vlm_rows.py"), "--make-data", str(tmp_path / "vl")], check=True,
                   timeout=TIMEOUT, env=_env(), cwd=str(ROOT))
    run_sortpack(["run", tmp_path / "vl", "-o", tmp_path / "plan", *multimodal_command()], timeout=TIMEOUT)
    from sortpack.reader import PackedIndex

    index = PackedIndex(tmp_path / "plan")
    caps = dict(index.options["caps"])
    assert (index["enc"] <= caps["enc"]).all() and (index["images"] <= caps["images"]).all()
    out = run_recipe("vlm_rows.py", tmp_path / "plan", "--steps", "3")
    lines = step_lines(out)
    assert len(lines) == 3 and "nan" not in out  # check_caps held on every micro-batch it trained
    assert all(0 < float(loss) < 10 for loss in losses(out))
