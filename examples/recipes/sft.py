"""Supervised fine-tuning on chats: packed rows, loss on the assistant's turns only, a Hugging Face model, resume.

    sortpack run chats.jsonl -o PLAN --chat-template tokenizer_config.json --tokenizer tokenizer.json \\
        --rows 1024 --store-tokens
    python examples/recipes/sft.py PLAN --tokenizer tokenizer.json --steps 4 --save ckpt.pt
    python examples/recipes/sft.py PLAN --tokenizer tokenizer.json --steps 8 --resume ckpt.pt

The plan stores each conversation's token ids (as ``apply_chat_template`` gives them) and its
labels (-100 but on the assistant's turns); ``varlen_collate`` lays a micro-batch's packed
rows out with those labels, -100 also at each conversation's first token and at the rows'
padding, and ``hf_inputs(batch, rows=True)`` hands the rows to the model with
``position_ids`` restarting in every conversation, so no conversation attends to another.
The loss is ``step_loss``: the summed per-token losses over the step's targets (the
assistant tokens of every rank's micro-batches of the step), the same gradient at any world
size and accumulation. The model is a small Llama built from a config (nothing is
downloaded); ``--resume`` continues at the step after the checkpoint's, on the same samples.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from common import train_batches
from torch.utils.data import DataLoader

from sortpack.torch import (
    PackedBatchSampler,
    SourceDataset,
    VariableBatchSizeLR,
    hf_inputs,
    step_loss,
    varlen_collate,
)


# --- recipe ---
def sft_token_losses(model, batch) -> torch.Tensor:
    """Return the per-token losses of a packed-rows batch (0 where the label is -100: prompts, padding)."""
    inputs = hf_inputs(batch, rows=True)  # (rows, ROW_LEN); position_ids restart in every conversation
    labels = inputs.pop("labels")
    logits = model(**inputs).logits
    targets = F.pad(labels[:, 1:], (0, 1), value=-100)  # position t predicts label t + 1, as HF shifts
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none", ignore_index=-100)


def sft_forward(model, batch) -> torch.Tensor:
    """Return this micro-batch's share of its step's mean loss over the assistant tokens (``step_loss``)."""
    return step_loss(sft_token_losses(model, batch), batch)
# --- end recipe ---


def tiny_llama(vocab_size: int, max_len: int):
    """Return a small Llama (2 layers, width 64) for ``vocab_size`` tokens, built from a config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_len,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def main() -> None:
    """Train for --steps optimizer steps (from --resume's step on), print each step, save --save."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index", help="a --rows plan of chats stored with --store-tokens")
    ap.add_argument("--tokenizer", required=True, help="the tokenizer.json the plan was tokenized with")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps to have run in all (resumed included)")
    ap.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step and rank")
    ap.add_argument("--lr", type=float, default=1e-3, help="LR at the mean step's tokens")
    ap.add_argument("--save", help="write a checkpoint (model, optimizer, sampler) here at the end")
    ap.add_argument("--resume", help="continue from this checkpoint")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    torch.manual_seed(0)
    sampler = PackedBatchSampler(args.index, grad_accum=args.grad_accum, order="shuffle", seed=0)
    loader = DataLoader(SourceDataset(args.index), batch_sampler=sampler, collate_fn=varlen_collate(key="input_ids"))
    row_len = int(sampler.index["padded_size"].max())
    model = tiny_llama(Tokenizer.from_file(args.tokenizer).get_vocab_size(), row_len)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ref = max(1, round(int(sampler.index["tokens"].sum()) / sampler.steps_per_epoch))
    sched = VariableBatchSizeLR(opt, sampler, ref_batch_size=ref, method="sqrt", by="tokens")
    done = 0
    if args.resume and os.path.exists(args.resume):
        state = torch.load(args.resume)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sampler.load_state_dict(state["sampler"])
        sched.load_state_dict(state["sched"])
        done = state["steps"]
    losses = 0.0
    for step, batch in train_batches(sampler, loader, sched, args.steps - done):
        loss = sft_forward(model, batch)
        loss.backward()  # not divided by grad_accum: step_loss weighs every target of the step alike
        losses += loss.item()
        if batch["microbatch"]["last"]:
            lr = opt.param_groups[0]["lr"]
            opt.step()
            opt.zero_grad()
            sched.step()
            rows, width = batch["row_shape"]
            print(f"step {done + step} rows {rows}x{width} lr {lr:.3e} loss {losses:.6f}", flush=True)
            losses = 0.0
    if args.save:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sampler": sampler.state_dict(),
                    "sched": sched.state_dict(), "steps": args.steps}, args.save)
        print(f"saved {args.save} after {args.steps} steps")


if __name__ == "__main__":
    main()
