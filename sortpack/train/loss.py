"""The step's exact per-token mean loss under data parallelism and gradient accumulation.

A plan knows, before the step runs, how many real tokens and samples every optimizer step
holds over all ranks and accumulation micro-batches (``step_tokens``, ``step_batch`` of
each ``MicroBatch``). Dividing each micro-batch's summed per-token losses by that count,
times the world size W, makes DDP's mean over W ranks of the gradients summed over A
micro-batches exactly the gradient of the mean over the step's tokens: the same at any
``W x A`` and the same as one pass over the step's samples. A per-micro-batch mean divided
by A (the usual loop) weights a token of a short micro-batch more than one of a long one.
No communication and no look-ahead: the counts come from the plan. torch is imported by
the caller's tensors only.
"""
from __future__ import annotations

import warnings

_warned: set = set()


def step_targets(info: dict, causal: bool = True) -> int:
    """Return the loss targets of the whole step over all ranks: the plan's ``step_targets`` when ``causal``.

    A plan of fine-tuning data counts each sample's targets (the positions after its first
    whose label is not -100: a completion, the assistant's turns) and the step's total over
    all ranks comes with every ``MicroBatch``; for other plans it is ``step_tokens`` less one
    per sample: with labels aligned to the inputs and -100 at each document's first position
    (what ``pad_collate``/``varlen_collate`` give and Hugging Face causal LMs shift
    internally), a sample of n tokens has n - 1 targets. Exact when every sample has a token
    (empty samples are dropped at plan time unless ``--keep-empty``). ``causal=False``: the
    step's tokens.
    """
    tokens = int(info["step_tokens"])
    if not causal:
        return tokens
    # 0 also when a hand-built StepFacts leaves it out: a step without targets sums no loss anyway
    planned = int(info.get("step_targets") or 0)
    return planned if planned > 0 else tokens - int(info["step_batch"])


def _info(batch) -> dict:
    if isinstance(batch, dict) and isinstance(batch.get("microbatch"), dict):
        return batch["microbatch"]
    if isinstance(batch, dict) and "step_tokens" in batch:
        return batch
    if hasattr(batch, "info"):
        return batch.info()
    raise TypeError("step_loss needs a batch from pad_collate/varlen_collate (with its 'microbatch' entry), "
                    f"a MicroBatch or its info dict, not {type(batch).__name__}")


def _check_count(info: dict, batch) -> None:
    """Warn once when the collated tokens differ from what the plan counted for this micro-batch."""
    if not isinstance(batch, dict) or "lengths" not in batch or "tokens" not in info or _warned:
        return
    lengths = batch["lengths"]
    if getattr(lengths, "device", None) is not None and lengths.device.type != "cpu":
        return  # counting on an accelerator would synchronise every micro-batch
    got, want = int(lengths.sum()), int(info["tokens"])
    if got != want:
        _warned.add(info.get("microbatch"))
        warnings.warn(f"micro-batch {info.get('microbatch')}: {got} tokens collated, the plan counted {want}: "
                      "the tokens collated are not the sizes the plan was built from (another tokenizer, or "
                      "sequences cut to padded_size), so step_loss is not the step's exact mean; build the plan "
                      "with the same token count (--size tokens with the tokenizer, --size bytes for bytes)",
                      RuntimeWarning, stacklevel=3)


def step_loss(token_losses, batch, causal: bool = True, world_size: int | None = None, divided_by: int = 1):
    """Return this micro-batch's share of the step's exact per-token mean loss (call ``backward`` on it as is).

    ``token_losses`` holds the per-token losses of this micro-batch, 0 where there is no
    target (``F.cross_entropy(..., reduction="none", ignore_index=-100)``); ``batch`` is
    the collated batch (or a ``MicroBatch``). The result is ``token_losses.sum() * W /
    targets`` with ``targets`` the step's loss targets over all ranks (``step_targets``):
    under DDP (gradients averaged over W ranks), summing the gradients of the A
    micro-batches without dividing by A gives the gradient of the mean loss over every
    target of the step. ``world_size`` overrides W (1 when gradients are summed, not
    averaged, over ranks). ``divided_by`` undoes a framework's own division before
    backward (``accelerator.backward`` and Lightning's ``accumulate_grad_batches`` divide
    by A: pass A). The returned values summed over a rank's micro-batches and averaged over
    ranks are the step's mean loss.

    Examples
    --------
    A micro-batch of a step with 10 loss targets over 2 ranks: its summed losses times W
    over the step's targets.

    >>> import torch
    >>> from sortpack.reader import MicroBatch, StepFacts
    >>> from sortpack.torch import step_loss
    >>> mb = MicroBatch([4, 5], facts=StepFacts(step_batch=4, step_tokens=14, world_size=2, step_targets=10))
    >>> token_losses = torch.tensor([[2.0, 1.0, 0.0], [3.0, 0.0, 0.0]])  # 0 where there is no target
    >>> step_loss(token_losses, mb)  # 6.0 * 2 / 10
    tensor(1.2000)
    """
    info = _info(batch)
    causal = bool(causal)
    _check_count(info, batch)
    w = int(info.get("world_size", 1)) if world_size is None else int(world_size)
    targets = step_targets(info, causal)
    # a step without targets (only empty or one-token samples) adds nothing, instead of a NaN
    return token_losses.sum() * (w * int(divided_by) / max(targets, 1))
