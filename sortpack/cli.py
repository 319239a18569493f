"""The ``sortpack`` command line: parse options, call the library, print results."""
from __future__ import annotations

import os

# One thread per rank is the HPC norm (ranks = cores); set before numpy loads BLAS.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import click  # noqa: E402

from .errors import SortpackError, one_line  # noqa: E402

if TYPE_CHECKING:
    from .stages.pack import PackOptions


from .launcher import launcher_rank  # noqa: E402


def _echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def _shapes(ctx, param, value):
    """Return (lengths, K) of --shapes: listed lengths, or auto:K (K None when lengths are listed)."""
    if value is None or value == "":
        return (), None
    from .stages.shapes import parse_shapes

    try:
        return parse_shapes(value)
    except SortpackError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1]) from None


def analyze_options(f):
    """Add the analyze options to a command."""
    opts = [
        click.option("--column", help="Column holding the samples (text, list or binary)."),
        click.option("--size", "size_spec", default="length", show_default=True,
                     help="Size SPEC (the budget unit): length, bytes, words, tokens, column:NAME[*SCALE], "
                          "python:MODULE:FUNC."),
        click.option("--difficulty", "difficulty_spec", default=None,
                     help="Difficulty SPEC (curriculum key); defaults to the size."),
        click.option("--tokenizer", type=click.Path(dir_okay=False),
                     help="HF tokenizers JSON file for SPEC tokens (its truncation and padding are ignored)."),
        click.option("--special-tokens/--no-special-tokens", default=True, show_default=True,
                     help="SPEC tokens: count the special tokens the tokenizer adds ([CLS], [SEP], BOS/EOS), "
                          "as the model sees them."),
        click.option("--split", default=None,
                     help="The split to read from a Hugging Face DatasetDict directory (save_to_disk)."),
        click.option("--input-format", type=click.Choice(["auto", "parquet", "arrow", "jsonl", "csv"]),
                     default="auto", show_default=True, help="Input format (auto: by file extension)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def sort_options(f):
    """Add the sort options to a command."""
    opts = [
        click.option("--key", type=click.Choice(["size", "difficulty"]), default="size", show_default=True,
                     help="Sort key."),
        click.option("--descending", is_flag=True, help="Largest key first (ties still by sample id)."),
        click.option("--stages", type=int, default=1, show_default=True,
                     help="Curriculum stages: exact difficulty quantiles, each ordered by size."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def pack_options(required: bool):
    """Add the pack options to a command (``--max-tokens`` required or not)."""

    def deco(f):
        opts = [
            click.option("--max-tokens", type=int, default=None,
                         help="Token budget of one micro-batch" + (" (required unless --rows)." if required else ".")),
            click.option("--budget", type=click.Choice(["padded", "tokens", "quadratic"]), default="padded",
                         show_default=True,
                         help="padded: count*max_size; tokens: sum of sizes; quadratic: sum of size+size^2/Q."),
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
            click.option("--oversize", type=click.Choice(["error", "skip", "truncate"]), default="error",
                         show_default=True, help="What to do with samples larger than the budget."),
            click.option("--keep-empty", is_flag=True,
                         help="Keep samples of size 0 (default: drop them, with a count; they hold no token)."),
            click.option("--rows", type=int, default=0,
                         help="Row packing: bin-pack samples into rows of ROW_LEN tokens (multipack).",
                         metavar="ROW_LEN"),
            click.option("--rows-per-microbatch", type=int, default=1, show_default=True,
                         help="With --rows: rows per micro-batch."),
            click.option("--max-segments", type=int, default=0,
                         help="With --rows: most samples per row (0: no limit)."),
            click.option("--segment-size", type=int, default=None, hidden=True,
                         help="Packing segment (testing only; default 2^20)."),
        ]
        for o in reversed(opts):
            f = o(f)
        return f

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
                                     help="The tokenizer.json the sizes were counted with (for --store-tokens)."))
        for o in reversed(opts):
            f = o(f)
        return f

    return deco


def _make_store(kw):
    from .write.materialize import StoreOptions, parse_memory, parse_store

    return StoreOptions(columns=parse_store(kw.pop("store_columns")), tokens=kw.pop("store_tokens"),
                        memory_limit=parse_memory(kw.pop("memory_limit")), tokenizer=kw.pop("store_tokenizer", None))


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
    for o in reversed(opts):
        f = o(f)
    return f


def _make_pack(kw) -> PackOptions:
    from .stages.pack import SEGMENT_SIZE, PackOptions

    return PackOptions(max_tokens=kw["max_tokens"], budget=kw["budget"], max_samples=kw["max_samples"],
                       batch_multiple=kw["batch_multiple"], quadratic_scale=kw["quadratic_scale"],
                       pad_to_multiple=kw["pad_to_multiple"], shapes=kw["shapes"][0], group_size=kw["group_size"],
                       same_shape=kw["same_shape"], oversize=kw["oversize"],
                       segment_size=kw["segment_size"] or SEGMENT_SIZE, rows=kw["rows"],
                       rows_per_microbatch=kw["rows_per_microbatch"], max_segments=kw["max_segments"],
                       auto_shapes=kw["shapes"][1], static_shapes=kw["static_shapes"],
                       keep_empty=kw["keep_empty"])


def _make_analyze(kw):
    from .stages.analyze import AnalyzeOptions

    return AnalyzeOptions(column=kw["column"], size=kw["size_spec"], difficulty=kw["difficulty_spec"],
                          tokenizer=kw["tokenizer"], input_format=kw["input_format"],
                          special_tokens=kw["special_tokens"], split=kw["split"])


def _make_sort(kw):
    from .stages.sort import SortOptions

    return SortOptions(key=kw["key"], descending=kw["descending"], stages=kw["stages"])


def _job(fn):
    """Run a stage command on the job's communicator with the error and exit-code rules."""

    @functools.wraps(fn)
    def wrapper(**kw):
        import pyarrow as pa

        from .parallel import get_comm, run_guarded
        from .progress import configure as configure_progress
        from .write.provenance import JobInfo
        from .write.termination import install as clean_up_on_sigterm

        clean_up_on_sigterm()
        threads = kw.pop("threads")
        if threads < 0:
            raise click.BadParameter("must be >= 0", param_hint="--threads")
        if threads:
            pa.set_cpu_count(threads)
            pa.set_io_thread_count(max(threads, 1))
            # the tokenizers library sizes its (rayon) pool from this when first used
            os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        try:
            comm = get_comm()
        except SortpackError as exc:
            # no communicator to agree on who prints: the launcher's rank decides
            if launcher_rank() == 0:
                _fail(exc)
            sys.exit(2)
        configure_progress(comm.is_root() and not kw["quiet"], comm.size)
        job = JobInfo(argv=["sortpack"] + sys.argv[1:])
        result = {}

        def body():
            result["manifest"] = fn(comm, job, **kw)

        code = run_guarded(comm, body, _echo_err)
        if code:
            sys.exit(code)
        manifest = result.get("manifest")
        if comm.is_root() and manifest is not None and not kw["quiet"]:
            click.echo(_summary(kw["output"], manifest))
            dropped = manifest.get("stats", {}).get("empty_dropped", 0)
            if dropped:
                click.echo(f"dropped {dropped} empty samples (size 0; --keep-empty keeps them)")
            if kw.get("profile"):
                click.echo(_profile_table(manifest["provenance"]["profile"]))
        note = _oversize_note(manifest) if comm.is_root() and manifest is not None else None
        if note and (not kw["quiet"] or note.startswith("sortpack: warning")):
            _echo_err(note)

    return wrapper


def _summary(path: str, m: dict) -> str:
    s = m["stats"]
    if m["format"] == "sortpack-index":
        return (f"wrote {path}: {m['num_microbatches']} micro-batches, {m['num_samples']} samples, "
                f"padding {100 * s['padding_ratio']:.2f}%, {s['distinct_shapes']} shapes, "
                f"{len(m['shards'])} shards, content_hash {m['content_hash'][:16]}")
    return (f"wrote {path}: {m['num_samples']} samples, sizes {s['size_min']}..{s['size_max']}, "
            f"{len(m['shards'])} shards, content_hash {m['content_hash'][:16]}")


def _oversize_note(m: dict) -> str | None:
    """Return the line that says how many samples --oversize skipped or truncated (None: none)."""
    s = m.get("stats", {})
    skipped, truncated = int(s.get("skipped", 0) or 0), int(s.get("truncated", 0) or 0)
    total = int(m.get("num_samples", 0)) + skipped
    if skipped and skipped == total:
        return (f"sortpack: warning: --oversize skip dropped all {skipped} samples (none fits the budget alone): "
                f"the index is empty")
    if skipped:
        return f"sortpack: --oversize skip dropped {skipped} of {total} samples (larger than the budget alone)"
    if truncated:
        return f"sortpack: --oversize truncate cut {truncated} of {total} samples to fit the budget"
    return None


def _profile_table(p: dict) -> str:
    stages = [name for name, v in p.items() if isinstance(v, dict)]
    w = max([len("stage")] + [len(name) for name in stages])
    lines = [f"{'stage':<{w}} {'wall s':>9} {'alltoallv MB (max rank)':>24}"]
    for name in stages:
        v = p[name]
        lines.append(f"{name:<{w}} {v['wall_s']:>9.3f} {v['alltoallv_bytes_max'] / 1e6:>24.1f}")
    lines.append(f"peak RSS (max rank): {p['peak_rss_bytes_max'] / 2**20:.1f} MiB")
    if p.get("analyze_rows_per_rank"):
        lines.append(f"analyze rows per rank: {', '.join(map(str, p['analyze_rows_per_rank']))}")
    return "\n".join(lines)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sortpack")
def cli():
    """Sort variable-length datasets by size and pack them into token-budgeted micro-batches.

    Every command runs as one process or under mpiexec/srun with any number of ranks and
    writes byte-identical data either way.
    """


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@analyze_options
@common_options
@_job
def analyze(comm, job, inputs, output, overwrite, quiet, profile, **kw):
    """Measure every sample's size and difficulty; write a metrics directory.

    INPUTS are Parquet, Arrow, JSONL or CSV files, directories and globs, Hugging Face
    save_to_disk directories (a DatasetDict with --split) and to_parquet files.
    """
    from .pipeline.dataset import run_analyze

    return run_analyze(comm, list(inputs), output, _make_analyze(kw), overwrite, job, progress=not quiet)


@cli.command()
@click.argument("metrics", type=click.Path(file_okay=False))
@sort_options
@common_options
@_job
def sort(comm, job, metrics, output, overwrite, quiet, profile, **kw):
    """Sort a metrics directory by (key, sample_id); write a sorted directory."""
    from .pipeline.dataset import run_sort

    return run_sort(comm, metrics, output, _make_sort(kw), overwrite, job)


@cli.command()
@click.argument("sorted_dir", metavar="SORTED", type=click.Path(file_okay=False))
@pack_options(required=True)
@store_options(tokenizer=True)
@common_options
@_job
def pack(comm, job, sorted_dir, output, overwrite, quiet, profile, **kw):
    """Cut a sorted directory into micro-batches; write the index."""
    from .pipeline.dataset import run_pack

    kw["store_tokenizer"] = kw.pop("tokenizer")
    store = _make_store(kw)
    return run_pack(comm, sorted_dir, output, _make_pack(kw), overwrite, job, store)


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
    for o in reversed(opts):
        f = o(f)
    return f


def _make_mixture(inputs, kw, keep_intermediate):
    """Return the Mixture of --mixture/--blend (None without either), refusing what does not go with it.

    Every rank parses the same arguments and files, so every rank raises the same error.
    """
    path, blend = kw.pop("mixture"), kw.pop("blend")
    total, seed = kw.pop("total_tokens"), kw.pop("seed")
    if path is None and blend is None:
        if total is not None or seed is not None:
            raise SortpackError("--total-tokens and --seed apply to a mixture (--mixture or --blend)", collective=True)
        if not inputs:
            raise SortpackError("Missing argument 'INPUTS...' (or --mixture MIX.json, or --blend)", collective=True)
        return None
    from .inputs.mixture import load_mixture, parse_blend

    try:
        if path is not None and blend is not None:
            raise SortpackError("--mixture and --blend exclude each other")
        if inputs:
            raise SortpackError(f"{'--mixture' if path else '--blend'} names the inputs: give no INPUTS "
                                f"(got {inputs[0]!r})")
        if keep_intermediate:
            raise SortpackError("--keep-intermediate does not apply to a mixture")
        mix = load_mixture(path) if path is not None else parse_blend(blend)
        if total is not None:
            if total <= 0:
                raise SortpackError(f"--total-tokens {total}: must be a positive integer")
            mix.total_tokens = total
        if seed is not None:
            if seed < 0:
                raise SortpackError(f"--seed {seed}: must be >= 0")
            mix.seed = seed
    except SortpackError as exc:
        raise SortpackError(str(exc), collective=True) from None
    return mix


@cli.command()
@click.argument("inputs", nargs=-1)
@analyze_options
@sort_options
@pack_options(required=True)
@click.option("--keep-intermediate", is_flag=True, help="Also write OUTPUT.metrics and OUTPUT.sorted.")
@store_options(tokenizer=False)
@mixture_options
@common_options
@_job
def run(comm, job, inputs, output, overwrite, quiet, profile, keep_intermediate, **kw):
    """Analyze, sort and pack in one job; write the index.

    INPUTS are as for analyze: files, directories, globs, Hugging Face save_to_disk
    directories (a DatasetDict with --split). With --mixture MIX.json or --blend, the
    sources come from there instead: one plan over weighted sources (docs/mixtures.md).
    """
    from .pipeline.dataset import run_all

    mix = _make_mixture(inputs, kw, keep_intermediate)
    store = _make_store(kw)
    if mix is not None:
        from .pipeline.mixture import run_mixture

        return run_mixture(comm, mix, output, _make_analyze(kw), _make_sort(kw), _make_pack(kw), overwrite, job,
                           progress=not quiet, store=store)
    return run_all(comm, list(inputs), output, _make_analyze(kw), _make_sort(kw), _make_pack(kw), overwrite,
                   job, keep_intermediate, progress=not quiet, store=store)


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--world-size", type=int, default=None, help="Data-parallel ranks: report steps and step imbalance.")
@click.option("--grad-accum", type=int, default=1, show_default=True, help="Micro-batches per rank per step.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG: sizes, fill, step balance, shapes, LR scale.")
@click.option("--step", type=int, default=None,
              help="List each rank's micro-batches of this run step (epoch * steps_per_epoch + step) with their "
                   "sample ids.")
@click.option("--sample", "samples", type=int, multiple=True,
              help="List the steps and ranks where this sample id comes (repeatable).")
@click.option("--order", type=click.Choice(["index", "shuffle", "curriculum"]), default="index", show_default=True,
              help="With --step/--sample: the sampler's order.")
@click.option("--seed", type=int, default=0, show_default=True, help="With --step/--sample: the sampler's seed.")
@click.option("--epoch", type=int, default=None,
              help="With --step: count the step within this epoch; with --sample: the epoch to search (default 0).")
@click.option("--drop-last", is_flag=True, help="With --step/--sample: the sampler's drop_last.")
@click.option("--largest-first", is_flag=True, help="With --step/--sample: the sampler's largest_first.")
@click.option("--warmup-shapes", is_flag=True, help="With --step/--sample: the sampler's warmup_shapes.")
def inspect(directory, world_size, grad_accum, as_json, plot, step, samples, **sampler):
    """Report on a metrics, sorted or index directory; --step/--sample trace a plan's steps."""
    if launcher_rank() != 0:
        return  # under mpiexec/srun one rank reports (and plots) for all
    if step is not None or samples:
        return _trace(directory, 1 if world_size is None else world_size, grad_accum, step, samples, as_json, sampler)
    from .report.inspect import inspect_directory, render
    from .report.plot import plot_directory

    try:
        report = inspect_directory(directory, world_size, grad_accum)
        if plot:
            os.makedirs(os.path.dirname(os.path.abspath(plot)), exist_ok=True)
            plot_directory(directory, plot, world_size, grad_accum)
    except SortpackError as exc:
        _fail(exc)
    click.echo(json.dumps(report, indent=1) if as_json else render(report))


def _trace(directory, world_size, grad_accum, step, samples, as_json, sampler):
    from .reader.trace import render_trace, sample_trace, step_trace

    try:
        if step is not None and samples:
            raise SortpackError("--step and --sample: give one of them")
        if step is not None:
            trace = step_trace(directory, step, world_size, grad_accum, **sampler)
        else:
            sampler["epoch"] = sampler["epoch"] or 0
            trace = sample_trace(directory, samples, world_size, grad_accum, **sampler)
    except SortpackError as exc:
        _fail(exc)
    click.echo(json.dumps(trace, indent=1) if as_json else render_trace(trace))


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False))
def verify(directory):
    """Re-check every shard's sha256 and the manifest; exit 1 on any mismatch."""
    if launcher_rank() != 0:
        return  # under mpiexec/srun one rank checks for all: the shards are read once
    from .format.shards import verify_directory

    try:
        problems = verify_directory(directory)
    except SortpackError as exc:
        _fail(exc)
    if problems:
        for p in problems:
            click.echo(f"{directory}: {p}", err=True)
        sys.exit(1)
    click.echo(f"{directory}: ok")


def _fail(exc: Exception):
    _echo_err(f"Error: {one_line(exc)}")
    sys.exit(2)


def _skip_pandas(argv) -> None:
    """Keep pyarrow from importing pandas in this process, unless a python: SPEC may want it.

    pyarrow imports pandas, when it is installed, on its first ``pa.array`` (to recognise
    pandas objects): about 0.2 s per rank, a third of a small job's fixed cost. The CLI
    never hands pyarrow pandas objects, so pyarrow's first check runs while pandas cannot
    be imported. pyarrow 26 still converts to and from pandas once the user imports it;
    a ``python:MODULE:FUNC`` job is left alone all the same, in case another version does not.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if "pandas" in sys.modules or any("python:" in str(a) for a in args):
        return
    if not args or "--help" in args or "--version" in args:  # no job: do not load pyarrow for it
        return
    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        import pyarrow as pa

        pa.array([0])  # pyarrow's pandas shim tries the import now and remembers the answer
    finally:
        sys.meta_path.remove(blocker)  # the user's own code can still import pandas


class _NoPandas:
    """A meta path finder under which ``import pandas`` fails, as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        """Raise ModuleNotFoundError for pandas; return None (not found here) for anything else."""
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main(argv=None):
    """Entry point of the ``sortpack`` console script."""
    _skip_pandas(argv)
    try:
        cli.main(args=argv, prog_name="sortpack", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        # one line, printed once: under mpiexec every rank parses the same arguments
        if launcher_rank() == 0:
            ctx_cmd = getattr(getattr(exc, "ctx", None), "command_path", "sortpack")
            _echo_err(f"Error: {ctx_cmd}: {one_line(exc.format_message())}")
        sys.exit(exc.exit_code)
