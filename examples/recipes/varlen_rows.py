"""Varlen attention: ``varlen_collate``'s ``cu_seqlens`` with flash-attn's ``flash_attn_varlen_func``.

    sortpack run data/ -o INDEX --column text --rows 4096 --rows-per-microbatch 8   (or --budget tokens)
    python examples/recipes/varlen_rows.py INDEX --steps 3

The micro-batch is one long sequence of concatenated samples (batch dimension 1);
``cu_seqlens`` (int32) bounds every segment, ``position_ids`` restart at 0 in each, and a
varlen kernel attends inside each segment only: no padding is computed and no sample
sees another. On a GPU with ``pip install flash-attn`` the kernel is
``flash_attn_varlen_func``; elsewhere this recipe uses a reference that loops over the
segments with ``scaled_dot_product_attention`` (same result, slow: for checking only).
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from common import TinyLM, max_len, parser, ref_batch, token_losses, train_steps, utf8_bytes
from torch.utils.data import DataLoader

from sortpack.torch import PackedBatchSampler, SourceDataset, VariableBatchSizeLR, step_loss, varlen_collate

try:
    from flash_attn import flash_attn_varlen_func
except ImportError:  # no flash-attn (or no GPU): the reference below
    flash_attn_varlen_func = None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# --- recipe ---
def varlen_reference(q, k, v, cu_seqlens, causal=True):
    """Return causal attention inside each segment of (total, H, Dh) q, k, v (loops over segments)."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for a, b in itertools.pairwise(bounds):
        qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))  # (H, len, Dh)
        out[a:b] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).transpose(0, 1)
    return out


def varlen_attention(cu_seqlens: torch.Tensor, max_seqlen: int):
    """Return an attention function for the (1, H, total, Dh) layout of one concatenated micro-batch."""
    def attend(q, k, v):
        q, k, v = (x[0].transpose(0, 1) for x in (q, k, v))  # (total, H, Dh), flash-attn's layout
        if flash_attn_varlen_func is not None and q.is_cuda:
            out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)
        else:
            out = varlen_reference(q, k, v, cu_seqlens)
        return out.transpose(0, 1)[None]
    return attend


def varlen_forward(model, batch) -> torch.Tensor:
    """Return a ``varlen_collate`` batch's share of its step's mean loss: one (1, total) sequence of whole samples."""
    ids = batch["input_ids"][None].to(DEVICE)
    positions = batch["position_ids"][None].to(DEVICE)
    cu_seqlens = batch["cu_seqlens"].to(DEVICE)  # int32, as flash-attn wants
    labels = batch["labels"][None].to(DEVICE)  # -100 at each segment's first token: no target across a boundary
    logits = model(ids, positions, varlen_attention(cu_seqlens, batch["max_seqlen"]))
    return step_loss(token_losses(logits, labels), batch)
# --- end recipe ---


def main() -> None:
    """Train for --steps steps and print each step's tokens, segments, LR and loss."""
    args = parser(__doc__).parse_args()
    torch.manual_seed(0)
    sampler = PackedBatchSampler(args.index, grad_accum=args.grad_accum, order="shuffle", seed=0)
    loader = DataLoader(SourceDataset(args.index, columns=["text"]), batch_sampler=sampler,
                        num_workers=args.num_workers, collate_fn=varlen_collate(tokenize=utf8_bytes))
    model = TinyLM(max_len=max_len(sampler.index)).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = VariableBatchSizeLR(opt, sampler, ref_batch_size=ref_batch(sampler), method="sqrt", by="tokens")

    def describe(batch) -> str:
        kernel = "flash_attn_varlen_func" if flash_attn_varlen_func and DEVICE == "cuda" else "reference"
        return f"tokens {batch['input_ids'].numel()} segments {len(batch['cu_seqlens']) - 1} kernel {kernel}"

    train_steps(model, sampler, loader, opt, sched, args.steps, lambda model, batch, n: varlen_forward(model, batch),
                describe)


if __name__ == "__main__":
    main()
