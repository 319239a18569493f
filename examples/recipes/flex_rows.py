"""Packed rows (``--rows``) with a ``flex_attention`` document mask: one static shape, no cross-talk.

    sortpack run data/ -o INDEX --column text --rows 4096 --rows-per-microbatch 8
    python examples/recipes/flex_rows.py INDEX --steps 3

Every micro-batch is ``rows_per_microbatch`` rows of ``ROW_LEN`` tokens, each row several
whole samples. ``varlen_collate`` lays the rows out whole (``input_ids.view(R, ROW_LEN)``)
with ``cu_seqlens`` bounding every sample and every row's padding tail; the document id of
a token is the segment it lies in. The block mask lets a token attend causally inside its
own document only. On a GPU the attention is ``flex_attention`` (compiled: one graph, since
the shape never changes). torch 2.13 runs flex_attention's forward on a CPU but not its
backward, so on a CPU this recipe trains with the same mask as a dense boolean mask
(``create_mask``) in ``scaled_dot_product_attention`` and checks at the first step that
flex_attention's forward gives the same output.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from common import TinyLM, parser, ref_batch, token_losses, train_steps, utf8_bytes
from torch.nn.attention.flex_attention import (
    create_block_mask,
    create_mask,
    flex_attention,
)
from torch.utils.data import DataLoader

from sortpack.torch import PackedBatchSampler, SourceDataset, VariableBatchSizeLR, step_loss, varlen_collate

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# --- recipe ---
def document_ids(batch, width: int) -> torch.Tensor:
    """Return (R, L) document ids: the varlen segment of each token (padding tails are segments too)."""
    rows = batch["input_ids"].numel() // width
    seg_len = batch["cu_seqlens"].diff().long()
    return torch.repeat_interleave(torch.arange(len(seg_len)), seg_len).view(rows, width)


def document_mask(doc: torch.Tensor):
    """Return the mask_mod of causal attention inside each document."""
    def mask_mod(b, h, q, kv):
        return (doc[b, q] == doc[b, kv]) & (q >= kv)
    return mask_mod


flex = torch.compile(flex_attention, dynamic=False) if DEVICE == "cuda" else flex_attention


def rows_forward(model, batch, width: int, check: bool = False) -> torch.Tensor:
    """Return a rows-mode ``varlen_collate`` batch's share of its step's mean loss, under the document mask."""
    rows = batch["input_ids"].numel() // width
    ids = batch["input_ids"].view(rows, width).to(DEVICE)
    positions = batch["position_ids"].view(rows, width).to(DEVICE)
    labels = batch["labels"].view(rows, width).to(DEVICE)  # -100 at each document's first token and padding
    doc = document_ids(batch, width).to(DEVICE)
    mask_mod = document_mask(doc)
    if DEVICE == "cuda":
        block_mask = create_block_mask(mask_mod, rows, None, width, width, device=DEVICE)

        def attend(q, k, v):
            return flex(q, k, v, block_mask=block_mask)
    else:
        dense = create_mask(mask_mod, rows, 1, width, width, device=DEVICE)

        def attend(q, k, v):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
            if check:  # flex_attention's CPU forward on the same mask must agree
                block_mask = create_block_mask(mask_mod, rows, None, width, width, device=DEVICE)
                with torch.no_grad():
                    ref = flex_attention(q.detach(), k.detach(), v.detach(), block_mask=block_mask)
                torch.testing.assert_close(out.detach(), ref, atol=1e-5, rtol=1e-4)
            return out
    return step_loss(token_losses(model(ids, positions, attend), labels), batch)
# --- end recipe ---


def main() -> None:
    """Train for --steps steps on a rows-mode index and print each step's shape, LR and loss."""
    args = parser(__doc__).parse_args()
    torch.manual_seed(0)
    sampler = PackedBatchSampler(args.index, grad_accum=args.grad_accum, order="shuffle", seed=0)
    if not sampler.index.has_rows:
        raise SystemExit(f"{args.index}: not a rows-mode index (build it with --rows ROW_LEN)")
    row_len = int(sampler.index.options["rows"])
    loader = DataLoader(SourceDataset(args.index, columns=["text"]), batch_sampler=sampler,
                        num_workers=args.num_workers, collate_fn=varlen_collate(tokenize=utf8_bytes))
    model = TinyLM(max_len=row_len).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = VariableBatchSizeLR(opt, sampler, ref_batch_size=ref_batch(sampler), method="sqrt", by="tokens")

    def describe(batch) -> str:
        docs = int((batch["seq_index"] >= 0).sum())
        return f"rows {batch['input_ids'].numel() // row_len}x{row_len} documents {docs}"

    train_steps(model, sampler, loader, opt, sched, args.steps, describe=describe,
                forward=lambda model, batch, n: rows_forward(model, batch, row_len, check=n == 0))


if __name__ == "__main__":
    main()
