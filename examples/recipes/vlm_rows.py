"""Vision-language training on packed rows: a tiny Qwen2-VL built from its config, each row within the plan's caps.

    python examples/recipes/vlm_rows.py --make-data vl/          # a small image-text set: PNG bytes and text ids
    sortpack run vl/ -o PLAN --size column:seq --rows 512 \\
        --cap enc=image_tokens:images:qwen2_vl:96 --cap images=image_count:images:6 \\
        --measure vit=image_patches:images:qwen2_vl --measure vit_sq=column:vit_sq \\
        --balance compute --encoder-patches vit --encoder-attention full:vit_sq --store text_ids,images
    python examples/recipes/vlm_rows.py PLAN --steps 4

A sample is its images (each ``<|vision_start|>``, one ``<|image_pad|>`` per token the 2x2 merge
leaves of its 14-px patches, ``<|vision_end|>``) and then its text; ``seq`` counts all of it.
The plan reads each image's size from its PNG header (``image_tokens``, ``image_patches``,
``image_count``: Qwen2-VL's counts, docs/multimodal.md) and packs the samples into rows of 512
tokens of at most 96 image tokens and 6 images (best fit over the three caps), ordered so
that a step's rows cost alike for the LLM and for the ViT. ``VLRows`` decodes the stored PNG
bytes with Qwen2-VL's image processor (its config only) and lays each row out as Qwen2-VL reads
packed sequences: the ids of its samples one after the other, position ids ``[4, rows, 512]``
(text positions restarting in every sample, then the M-RoPE positions ``get_rope_index`` gives
each sample alone), so that no sample attends to another, and the processor's
``pixel_values`` and ``image_grid_thw`` of its images; labels only on text (not the image
tokens, not a sample's first token, not the padding). Every row is checked against the caps
with the processor's own token counts. The loss is the step's mean over its labelled tokens:
summed, and the gradients divided by the step's count before the optimizer step. The model is
built from a config (nothing is downloaded), on CPU.
"""
from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from sortpack.reader import PackedIndex
from sortpack.torch import PackedBatchSampler, SourceDataset

VOCAB = 64  # text ids below VOCAB - 4; the four above are the vision tokens
IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END = VOCAB - 1, VOCAB - 2, VOCAB - 3, VOCAB - 4
PATCH, MERGE, TEMPORAL = 14, 2, 2  # Qwen2-VL's patch size, merge and temporal patch


def png(width: int, height: int, rng: np.random.Generator) -> bytes:
    """Return a PNG of random pixels of the given size."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def make_data(directory: Path, n: int = 600, seed: int = 0) -> None:
    """Write ``directory/part-0.parquet``: n samples of text ids and 0-3 PNG images (35% none) of 56-168 px a side
    (28-px multiples, which Qwen2-VL's processor keeps as they are), ``seq`` and ``vit_sq`` beside them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    text = [rng.integers(0, VOCAB - 4, int(k)).astype(np.int32)
            for k in np.clip(rng.lognormal(np.log(40), 0.8, n), 4, 300)]
    count = np.where(rng.random(n) < 0.35, 0, rng.integers(1, 4, n))
    sides = [PATCH * MERGE * rng.integers(2, 7, (c, 2)) for c in count]  # (width, height) in pixels
    patches = [(s[:, 0] // PATCH) * (s[:, 1] // PATCH) for s in sides]
    table = pa.table({
        "text_ids": text,
        "images": [[png(int(w), int(h), rng) for w, h in s] for s in sides],
        # the sequence: the text, and per image its tokens and the two vision markers
        "seq": np.array([len(t) + int(p.sum()) // MERGE ** 2 + 2 * len(p) for t, p in zip(text, patches)]),
        "vit_sq": np.array([int((p.astype(np.int64) ** 2).sum()) for p in patches]),  # a full-attention ViT's term
    })
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / "part-0.parquet")


def tiny_qwen2_vl():
    """Return a small Qwen2-VL (LLM: 2 layers of width 64; ViT: 2 layers of width 32) built from a config."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=PATCH,
                  spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, in_channels=3)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_PAD,
                           video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
                           vision_end_token_id=VISION_END)
    config._attn_implementation = "sdpa"
    return Qwen2VLForConditionalGeneration(config)


# --- recipe ---
class VLRows:
    """Collate a micro-batch of packed rows into Qwen2-VL's packed inputs (picklable: DataLoader workers)."""

    def __init__(self, rope_index, row_len: int):
        from transformers import Qwen2VLImageProcessorPil

        self.rope_index, self.row_len = rope_index, row_len  # the model's get_rope_index: M-RoPE of one sample
        self.processor = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL)

    def sample(self, item: dict):
        """Return (ids, labels, positions [4, n], grids, pixels) of one sample: its images, then its text."""
        ids, kinds, grids, pixels = [], [], torch.zeros(0, 3, dtype=torch.long), None
        if item["images"]:
            from PIL import Image

            out = self.processor(images=[Image.open(io.BytesIO(b)).convert("RGB") for b in item["images"]],
                                 return_tensors="pt")
            grids, pixels = out["image_grid_thw"], out["pixel_values"]
        for t, h, w in grids.tolist():
            ids += [VISION_START] + [IMAGE_PAD] * (t * h * w // MERGE ** 2) + [VISION_END]
            kinds += [0] + [1] * (t * h * w // MERGE ** 2) + [0]
        ids += list(item["text_ids"])
        kinds += [0] * len(item["text_ids"])
        x = torch.tensor([ids])
        if len(grids):
            m_rope, _ = self.rope_index(x, torch.tensor([kinds]), image_grid_thw=grids)
        else:
            m_rope = torch.arange(len(ids)).view(1, 1, -1).expand(3, 1, -1)
        positions = torch.cat([torch.arange(len(ids)).view(1, 1, -1), m_rope])[:, 0]  # text positions first
        labels = torch.tensor([-100 if k or t in (VISION_START, VISION_END) else t for t, k in zip(ids, kinds)])
        labels[0] = -100  # a sample's first token is not predicted from the one before it in the row
        return x[0], labels, positions, grids, pixels

    def __call__(self, samples) -> dict:
        """Return the model's inputs and labels for the rows of a micro-batch (``samples.microbatch.row_splits``)."""
        mb = samples.microbatch
        splits = mb.row_splits if mb.row_splits is not None else [0, len(samples)]
        rows, labels, positions, grids, pixels = [], [], [], [], []
        for a, b in zip(splits[:-1], splits[1:]):
            parts = [self.sample(samples[i]) for i in range(a, b)]
            pad = self.row_len - sum(len(p[0]) for p in parts)
            rows.append(torch.cat([p[0] for p in parts] + [torch.zeros(pad, dtype=torch.long)]))
            labels.append(torch.cat([p[1] for p in parts] + [torch.full((pad,), -100)]))
            # the padding's positions restart too: it is a sequence of its own, attended by no sample
            positions.append(torch.cat([p[2] for p in parts] + [torch.arange(pad).view(1, -1).expand(4, -1)], 1))
            grids += [p[3] for p in parts]
            pixels += [p[4] for p in parts if p[4] is not None]
        batch = {"input_ids": torch.stack(rows), "labels": torch.stack(labels),
                 "position_ids": torch.stack(positions, 1), "microbatch": mb.info()}
        if pixels:
            batch.update(image_grid_thw=torch.cat(grids), pixel_values=torch.cat(pixels))
        return batch


def token_losses(model, batch) -> torch.Tensor:
    """Return the summed losses of the labelled tokens of a micro-batch's rows (the model shifts nothing here)."""
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "microbatch")}
    logits = model(**inputs, use_cache=False).logits  # no cache: the packed positions build the sample mask
    targets = F.pad(batch["labels"][:, 1:], (0, 1), value=-100)  # position t predicts token t + 1
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum", ignore_index=-100)
# --- end recipe ---


def check_caps(index: PackedIndex, batch: dict) -> None:
    """Assert the micro-batch's rows hold what the plan capped, counted by the processor: each row's image tokens
    and images within the caps, and the micro-batch's as many as the plan read from the images' headers."""
    caps = dict(index.options.get("caps") or [])
    ids, planned = batch["input_ids"], batch["microbatch"]
    assert ids.shape[1] == int(index.options["rows"])
    per_row = (ids == IMAGE_PAD).sum(dim=1)
    assert int(per_row.max()) <= caps["enc"] and int(per_row.sum()) == planned["enc"], (per_row, planned)
    images = (ids == VISION_START).sum(dim=1)
    assert int(images.max()) <= caps["images"] and int(images.sum()) == planned["images"], (images, planned)


def main() -> None:
    """Train for --steps optimizer steps; print each step's rows, image tokens, LR and mean loss."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index", nargs="?", help="a --rows plan stored with text_ids,images")
    ap.add_argument("--make-data", metavar="DIR", help="write the small image-text set to DIR and stop (Pillow)")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps")
    ap.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    if args.make_data:
        make_data(Path(args.make_data))
        return
    torch.manual_seed(0)
    model = tiny_qwen2_vl()
    sampler = PackedBatchSampler(args.index, grad_accum=args.grad_accum, order="shuffle", seed=0)
    collate = VLRows(model.model.get_rope_index, int(sampler.index.options["rows"]))
    loader = DataLoader(SourceDataset(args.index), batch_sampler=sampler, collate_fn=collate)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step, epoch, total, count, images = 0, 0, 0.0, 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            check_caps(sampler.index, batch)
            loss = token_losses(model, batch)
            loss.backward()
            total, count = total + loss.item(), count + int((batch["labels"] != -100).sum())
            images += int((batch["input_ids"] == IMAGE_PAD).sum())
            if batch["microbatch"]["last"]:
                for p in model.parameters():  # the step's mean over its labelled tokens
                    if p.grad is not None:
                        p.grad /= max(count, 1)
                opt.step()
                opt.zero_grad()
                rows = batch["input_ids"].shape
                print(f"step {step} rows {rows[0]}x{rows[1]} image tokens {images} lr {args.lr:.3e} "
                      f"loss {total / max(count, 1):.6f}", flush=True)
                step, total, count, images = step + 1, 0.0, 0, 0
                if step == args.steps:
                    break
        epoch += 1


if __name__ == "__main__":
    main()
