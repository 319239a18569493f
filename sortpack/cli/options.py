"""The options the stage commands share, as decorators (analyze, sort, pack, store, mixture, common)."""
from __future__ import annotations

import click

from ..errors import SortpackError
from ..inputs.formats import format_names
from ..inputs.size_kinds import spec_forms, split_kinds
from ..stages.caps import CAP_FITS
from ..stages.pack.balance import BALANCE, balance_help
from ..stages.pack.budgets import BUDGETS, budget_help


def _listed(names: tuple[str, ...] | list[str], last: str = "or") -> str:
    """Return ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def _apply(opts: list, f):
    """Return ``f`` with the click options ``opts`` added, shown in ``--help`` in list order."""
    for o in reversed(opts):
        f = o(f)
    return f


def _shapes(ctx, param, value):
    """Return (lengths, K) of --shapes: listed lengths, or auto:K (K None when lengths are listed)."""
    if value is None or value == "":
        return (), None
    from ..stages.shapes import parse_shapes

    try:
        return parse_shapes(value)
    except SortpackError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1]) from None


def _measures(ctx, param, value):
    """Return the (name, SPEC) of each --measure NAME=SPEC (one line naming the option for a bad one)."""
    from ..inputs.measures import parse_measure

    try:
        return tuple(parse_measure(text) for text in value or ())
    except SortpackError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1]) from None


def analyze_options(f):
    """Add the analyze options to a command."""
    opts = [
        click.option("--column", help="Column holding the samples (text, list or binary)."),
        click.option("--size", "size_spec", default="length", show_default=True,
                     help=f"Size SPEC (the budget unit): {', '.join(spec_forms())}, column:NAME[*SCALE], "
                          "python:MODULE:FUNC (media kinds: docs/multimodal.md)."),
        click.option("--difficulty", "difficulty_spec", default=None,
                     help="Difficulty SPEC (curriculum key); defaults to the size."),
        click.option("--size2", "size2_spec", multiple=True, metavar="SPEC",
                     help="A second size per sample (any SPEC, e.g. column:num_patches or column:duration*100: "
                          "encoder patches or frames), summed per micro-batch as the index column size2; "
                          "with --max-size2 N a second cap. Repeat for more: size3, size4, ..., capped by "
                          "the --max-size2 of the same place."),
        click.option("--measure", "measures", multiple=True, callback=_measures, metavar="NAME=SPEC",
                     help="Another per-sample measure (repeatable; any SPEC), summed per micro-batch as the index "
                          "column NAME and handed out by the reader (docs/step-costs.md)."),
        click.option("--tokenizer", type=click.Path(dir_okay=False),
                     help="HF tokenizers JSON file for SPEC tokens (its truncation and padding are ignored)."),
        click.option("--special-tokens/--no-special-tokens", default=True, show_default=True,
                     help="SPEC tokens: count the special tokens the tokenizer adds ([CLS], [SEP], BOS/EOS), "
                          "as the model sees them."),
        click.option("--split", default=None,
                     help="The split to read from a Hugging Face DatasetDict directory (save_to_disk)."),
        click.option("--labels-column", default=None, metavar="COL",
                     help="Fine-tuning: the labels list column aligned to the token ids of --column "
                          "(default input_ids); -100 = no target. A Megatron input's labels: a second "
                          "dataset's prefix beside it, {} for the input's own prefix name ('{}_labels')."),
        click.option("--prompt-column", default=None, metavar="COL",
                     help="Fine-tuning: prompt/completion texts (default columns prompt, completion), encoded "
                          "with --tokenizer as TRL's SFTTrainer does: prompt + completion + the end-of-sequence "
                          "token as one text; the completion and its end token are the targets."),
        click.option("--completion-column", default=None, metavar="COL",
                     help="Fine-tuning: the completion text column (see --prompt-column)."),
        click.option("--eos-token", default=None, metavar="TOKEN",
                     help="With --prompt-column: the end token appended to each completion (default: the "
                          "eos_token of the tokenizer_config.json beside --tokenizer)."),
        click.option("--pair-encoding", type=click.Choice(["trl", "pair"]), default=None,
                     help="With --prompt-column: trl (default: one text, the end token appended, as TRL) or pair "
                          "(the tokenizer's pair template, no end token added)."),
        click.option("--chat-template", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help="Fine-tuning: render the messages of --column (default messages) with this chat "
                          "template (a tokenizer_config.json or a Jinja file) and tokenize with --tokenizer."),
        click.option("--train-on", default=None, metavar="ROLE[,ROLE...]",
                     help="With --chat-template: the roles whose turns are targets (default assistant)."),
        click.option("--input-format", type=click.Choice(["auto", *format_names()]),
                     default="auto", show_default=True, help="Input format (auto: by file extension)."),
    ]
    return _apply(opts, f)


def sort_options(f):
    """Add the sort options to a command."""
    opts = [
        click.option("--key", type=click.Choice(["size", "difficulty"]), default="size", show_default=True,
                     help="Sort key."),
        click.option("--descending", is_flag=True, help="Largest key first (ties still by sample id)."),
        click.option("--stages", type=int, default=1, show_default=True,
                     help="Curriculum stages: exact difficulty quantiles, each ordered by size."),
    ]
    return _apply(opts, f)


def _cap_options() -> list:
    """Return the click options of the caps beside the budget and of the vision encoder's cost."""
    return [
        click.option("--max-size2", type=int, multiple=True, metavar="N",
                     help="Cap a micro-batch's (and with --rows a row's) sum of --size2 at N too "
                          "(a sample over N alone follows --oversize error|skip); repeated, the k-th caps "
                          "the k-th --size2 (0: no cap)."),
        click.option("--cap", "cap_specs", multiple=True, metavar="NAME=SPEC:N|NAME=N",
                     help="Another cap: measure NAME by SPEC (run) and cap its sum per micro-batch (per row "
                          "with --rows) at N, e.g. images=column:num_images:16; NAME=N caps a measure made "
                          "already (--size2's size2, size3.., --measure, an analyzed one). Repeatable."),
        click.option("--cap-fit", type=click.Choice(list(CAP_FITS)), default="auto", show_default=True,
                     help="How micro-batches meet the caps: runs (the greedy cuts runs of the sorted order), "
                          "best (best fit over the budget and every cap, window by window), auto (best from "
                          "two caps on, runs for one)."),
        click.option("--encoder-patches", default=None, metavar="MEASURE",
                     help="With --balance compute: the measure of each sample's vision-encoder patches "
                          "(summed over its images); the encoder's work is balanced beside the LLM's."),
        click.option("--encoder-attention", default=None, metavar="full:MEASURE|window:W",
                     help="The encoder's attention: full:MEASURE (a full-attention ViT; MEASURE the patches "
                          "squared, summed over the images) or window:W (windows of W patches, e.g. 64 for "
                          "Qwen2.5-VL: nearly linear)."),
        click.option("--encoder-coeff", type=float, default=7680.0, show_default=True, metavar="C",
                     help="C_e of the encoder's cost C_e*p + attention per image (6 x the ViT's width)."),
    ]


def pack_options(required: bool):
    """Add the pack options to a command (``--max-tokens`` required or not)."""

    def deco(f):
        opts = [
            click.option("--max-tokens", type=int, default=None,
                         help="Token budget of one micro-batch" + (" (required unless --rows)." if required else ".")),
            click.option("--budget", type=click.Choice(list(BUDGETS)), default="padded", show_default=True,
                         help=budget_help()),
            click.option("--quadratic-scale", type=float, help="Q of the quadratic budget."),
            click.option("--max-samples", type=int, default=0, help="Most samples per micro-batch (0: no limit)."),
            click.option("--batch-multiple", type=int, default=1, show_default=True,
                         help="Sample count a multiple of M (unless fewer than M)."),
            click.option("--pad-to-multiple", type=int, default=0,
                         help="Round each micro-batch's padded length up to a multiple of K."),
            click.option("--shapes", callback=_shapes,
                         help="Round padded lengths up to the next of L1,L2,...; auto:K chooses the K lengths "
                              "that pad this dataset least."),
            click.option("--static-shapes", is_flag=True,
                         help="With --shapes/--pad-to-multiple: fix each length's batch size too (padding slots), "
                              "one (batch, length) shape per length."),
            click.option("--group-size", type=int, default=1, show_default=True,
                         help="With --same-shape: runs of G micro-batches share (samples, padded length)."),
            click.option("--same-shape", is_flag=True, help="Make every G-run of micro-batches one shape."),
            click.option("--oversize", type=click.Choice(["error", "skip", "truncate", "split"]), default="error",
                         show_default=True, help="What to do with samples larger than the budget (split: cut "
                                                 "them into consecutive pieces that fit, no token lost; "
                                                 f"--size {_listed(split_kinds())})."),
            click.option("--keep-empty", is_flag=True,
                         help="Keep samples without content (size 0, or only the special tokens under "
                              "--size tokens; default: drop them, with a count)."),
            click.option("--rows", type=int, default=0,
                         help="Row packing: bin-pack samples into rows of ROW_LEN tokens (multipack).",
                         metavar="ROW_LEN"),
            click.option("--rows-per-microbatch", type=int, default=1, show_default=True,
                         help="With --rows: rows per micro-batch."),
            click.option("--max-segments", type=int, default=0,
                         help="With --rows: most samples per row (0: no limit)."),
            *_cap_options(),
            click.option("--balance", default="none", show_default=True, metavar="|".join(BALANCE),
                         help=balance_help()),
            click.option("--cost-coeff", type=float, default=6144.0, show_default=True, metavar="C",
                         help="With --balance compute: C of the cost C*s + s^2 (C ~ 6 * d_model)."),
            click.option("--segment-size", type=int, default=None, hidden=True,
                         help="Packing segment (testing only; default 2^20)."),
        ]
        return _apply(opts, f)

    return deco


def store_options(tokenizer: bool):
    """Add --store, --store-tokens and --memory-limit (and, for pack, --tokenizer) to a command."""

    def deco(f):
        opts = [
            click.option("--store", "store_columns", default=None, metavar="COL[,COL...]",
                         help="Also store these input columns in plan order (data shards in the index)."),
            click.option("--store-tokens", is_flag=True,
                         help="Also store the token ids of --size tokens as input_ids (list<int32>)."),
            click.option("--memory-limit", default=None, metavar="BYTES",
                         help="Bytes per rank for moving the stored data (e.g. 4G; default: half of "
                              "physical memory divided by the ranks on the node)."),
        ]
        if tokenizer:
            opts.append(click.option("--tokenizer", type=click.Path(dir_okay=False),
                                     help="The tokenizer.json the sizes were counted with (for --store-tokens, and for "
                                          "--oversize split|truncate of prompts/completions or chats)."))
            opts.append(click.option("--chat-template", "store_chat_template", type=click.Path(dir_okay=False),
                                     default=None, metavar="FILE",
                                     help="The chat template chats were rendered with (for --store-tokens and "
                                          "--oversize split|truncate of chats)."))
        return _apply(opts, f)

    return deco


def mixture_options(f):
    """Add --mixture, --blend, --total-tokens and --seed (a plan over weighted sources) to a command."""
    opts = [
        click.option("--mixture", type=click.Path(dir_okay=False),
                     help="MIX.json: weighted sources, schedule and total_tokens (docs/mixtures.md); no INPUTS."),
        click.option("--blend", help='Megatron-style weighted sources, e.g. "70 data/web 30 data/code"; no INPUTS.'),
        click.option("--total-tokens", type=int, default=None,
                     help="Tokens (size units) of the mixture run (overrides MIX.json; default: the largest run "
                          "that uses no sample twice)."),
        click.option("--seed", type=int, default=None,
                     help="Seed of a mixture's repeats, subsets and orders (overrides MIX.json; default 0)."),
    ]
    return _apply(opts, f)


def holdout_options(f):
    """Add --holdout and --holdout-seed (a held-out plan in OUTPUT/holdout) to a command."""
    return _apply([
        click.option("--holdout", default=None, metavar="N|FRACTION",
                     help="Set aside N samples (or FRACTION of the rows) of each source, chosen at random with "
                          "--holdout-seed, as a plan of their own in OUTPUT/holdout; the training plan never "
                          "holds them."),
        click.option("--holdout-seed", type=int, default=None,
                     help="Seed of the held-out choice (default 0; recorded in the manifest)."),
    ], f)


def common_options(f):
    """Add -o, --overwrite, --quiet, --threads and --profile to a command."""
    opts = [
        click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
                     help="Output directory (written atomically; missing parents are created)."),
        click.option("--overwrite", is_flag=True, help="Replace an existing output directory."),
        click.option("--quiet", is_flag=True, help="Print nothing but errors."),
        click.option("--threads", type=int, default=1, show_default=True,
                     help="Arrow threads per rank (0: Arrow's default, all cores)."),
        click.option("--profile", is_flag=True, help="Print per-stage wall time and bytes moved (max over ranks)."),
    ]
    return _apply(opts, f)
