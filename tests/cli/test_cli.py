"""The CLI end to end under real mpiexec: identical bytes for 1-4 ranks, atomic outputs,
a failing rank ends the job, inspect and verify."""
from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import assert_same_at_ranks, assert_same_outputs, modules_loaded_by, read_manifest, run_sortpack

# small shards and segments so that 2-4 ranks really split the work
SMALL = {"SORTPACK_TEST_SHARD_ROWS": "100"}


@pytest.mark.mpi
@pytest.mark.slow
def test_run_is_byte_identical_for_1_to_4_ranks(tmp_path, text_dataset):
    files, lengths = text_dataset
    outs = assert_same_at_ranks(["run", *files, "--column", "text", "--max-tokens", "1500", "--segment-size", "700",
                                 "--quiet"], tmp_path, env=SMALL, timeout=120)
    m = read_manifest(outs[0])
    assert len(m["shards"]) >= 2 and m["num_samples"] == len(lengths)
    assert m["schema"]["sample_ids"] == "list<item: int32>"  # the default id width for < 2^31 rows


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_the_numpy_fallback_plans_what_the_compiled_kernels_plan(tmp_path, text_dataset, ranks):
    # a machine without a compiler: at 2 ranks the sort receives without its own block and merges it from
    # what it sent, which the fallback must fill in first
    files, _ = text_dataset
    args = ["run", *files, "--column", "text", "--max-tokens", "1500", "--segment-size", "700", "--quiet"]
    run_sortpack([*args, "-o", tmp_path / "compiled"], ranks=ranks, env=SMALL)
    got = run_sortpack([*args, "-o", tmp_path / "numpy"], ranks=ranks, env={**SMALL, "SORTPACK_NO_CKERNELS": "1"})
    assert "numpy fallback" in got.stderr
    assert_same_outputs(tmp_path / "compiled", tmp_path / "numpy")


@pytest.mark.mpi
@pytest.mark.slow
def test_three_stage_jobs_write_what_run_writes_in_one(tmp_path, text_dataset):
    # each stage at 1-4 ranks: tests/mpi/test_invariance_mpi.py, in process
    files, _ = text_dataset
    m, s, p = (tmp_path / x for x in ("metrics", "sorted", "index"))
    run_sortpack(["analyze", *files, "-o", m, "--column", "text", "--quiet"], ranks=3, env=SMALL)
    run_sortpack(["sort", m, "-o", s, "--descending", "--quiet"], ranks=3, env=SMALL)
    run_sortpack(["pack", s, "-o", p, "--max-tokens", "1500", "--segment-size", "700", "--quiet"], ranks=3, env=SMALL)
    run_sortpack(["run", *files, "-o", tmp_path / "one", "--column", "text", "--descending", "--max-tokens", "1500",
                  "--segment-size", "700", "--quiet", "--keep-intermediate"], ranks=2, env=SMALL)
    assert_same_outputs(p, tmp_path / "one")
    assert_same_outputs(m, tmp_path / "one.metrics")
    assert_same_outputs(s, tmp_path / "one.sorted")


def test_sorted_directory_is_a_sorted_permutation(tmp_path, text_dataset):
    files, lengths = text_dataset
    run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500",
                  "--keep-intermediate", "--quiet"])
    s = tmp_path / "plan.sorted"
    table = pa.concat_tables(pa.ipc.open_file(str(s / e["file"])).read_all() for e in read_manifest(s)["shards"])
    ids, size = table["sample_id"].to_numpy(), table["size"].to_numpy()
    assert sorted(ids.tolist()) == list(range(len(lengths)))
    assert np.array_equal(size, lengths[ids])
    assert np.all((np.diff(size) > 0) | ((np.diff(size) == 0) & (np.diff(ids) > 0)))
    index = tmp_path / "plan"
    mb = pa.concat_tables(pa.ipc.open_file(str(index / e["file"])).read_all()
                          for e in read_manifest(index)["shards"])
    assert np.array_equal(np.concatenate(mb["sample_ids"].to_numpy(zero_copy_only=False)), ids)


@pytest.mark.slow
@pytest.mark.mpi
def test_a_failing_rank_ends_the_job_quickly(tmp_path, text_dataset):
    files, _ = text_dataset
    t0 = time.monotonic()
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500"],
                        ranks=3, env={"SORTPACK_FAULT": "sort:1"}, check=False, timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 30
    assert "injected fault" in proc.stderr
    assert not (tmp_path / "plan").exists()


@pytest.mark.slow
def test_output_exists_needs_overwrite(tmp_path, text_dataset):
    files, _ = text_dataset
    args = ["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500", "--quiet"]
    run_sortpack(args)
    proc = run_sortpack(args, check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    run_sortpack(args + ["--overwrite"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow
def test_inspect_json_and_verify(tmp_path, text_dataset):
    files, lengths = text_dataset
    plan = tmp_path / "plan"
    run_sortpack(["run", *files, "-o", plan, "--column", "text", "--max-tokens", "1500", "--quiet"])
    report = json.loads(run_sortpack(["inspect", plan, "--world-size", "4", "--json"]).stdout)
    for field in ("num_samples", "num_microbatches", "padding_ratio", "distinct_shapes",
                  "samples_per_microbatch", "steps", "step_imbalance"):
        assert field in report
    assert report["num_samples"] == len(lengths)
    assert set(report["samples_per_microbatch"]) == {"min", "median", "max"}
    assert report["steps"] == -(-report["num_microbatches"] // 4)
    assert report["step_imbalance"] >= 1.0
    assert "padding_ratio" in run_sortpack(["inspect", plan]).stdout
    assert run_sortpack(["verify", plan]).returncode == 0
    shard = plan / read_manifest(plan)["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = run_sortpack(["verify", plan], check=False)
    assert proc.returncode == 1 and "sha256" in proc.stderr


@pytest.mark.slow
def test_unknown_version_is_refused(tmp_path, text_dataset):
    files, _ = text_dataset
    plan = tmp_path / "plan"
    run_sortpack(["run", *files, "-o", plan, "--column", "text", "--max-tokens", "1500", "--quiet"])
    m = read_manifest(plan)
    m["version"] = 99
    (plan / "manifest.json").write_text(json.dumps(m))
    proc = run_sortpack(["inspect", plan], check=False)
    assert proc.returncode == 2 and "version 99" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("force", [True, False])
def test_runs_as_one_rank_with_a_warning_when_mpi_cannot_load(tmp_path, text_dataset, force):
    # SORTPACK_MPI=1 loads MPI in a process no launcher started; without it such a process never tries (no warning)
    files, lengths = text_dataset
    fake = tmp_path / "fake"
    (fake / "mpi4py").mkdir(parents=True)
    (fake / "mpi4py" / "__init__.py").write_text("")
    (fake / "mpi4py" / "MPI.py").write_text("raise RuntimeError('cannot load MPI library libmpi.so.12')\n")
    import os

    from support import ROOT
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500"],
                        env={"PYTHONPATH": f"{fake}{os.pathsep}{ROOT}", "SORTPACK_MPI": "1" if force else ""})
    warnings = [line for line in proc.stderr.splitlines() if line.strip()]
    if force:
        assert len(warnings) == 1 and "running as one rank" in warnings[0]
    else:
        assert warnings == []
    assert read_manifest(tmp_path / "plan")["num_samples"] == len(lengths)


@pytest.mark.mpi
@pytest.mark.parametrize("mode", [
    ["--budget", "tokens"],
    ["--budget", "quadratic", "--quadratic-scale", "256"],
    ["--shapes", "64,128,256,512", "--batch-multiple", "2"],
    ["--group-size", "4", "--same-shape", "--pad-to-multiple", "32"],
    ["--rows", "1024", "--rows-per-microbatch", "2", "--max-segments", "16"],
    ["--key", "difficulty", "--difficulty", "column:n*0.5", "--stages", "3", "--descending"],
])
@pytest.mark.slow
def test_every_mode_is_identical_at_1_and_3_ranks(tmp_path, text_dataset, mode):
    files, lengths = text_dataset
    outs = assert_same_at_ranks(["run", *files, "--column", "text", "--max-tokens", "1500", "--segment-size", "700",
                                 "--quiet", *mode], tmp_path, ranks=(1, 3), env=SMALL, timeout=120)
    m = read_manifest(outs[0])
    table = pa.concat_tables(pa.ipc.open_file(str(outs[0] / e["file"])).read_all() for e in m["shards"])
    ids = np.concatenate(table["sample_ids"].to_numpy(zero_copy_only=False))
    assert sorted(ids.tolist()) == list(range(len(lengths)))
    if "--rows" in mode:
        splits = table["row_splits"].to_pylist()
        assert all(s[0] == 0 and s[-1] == n for s, n in zip(splits, table["num_samples"].to_pylist()))


@pytest.mark.slow
def test_threads_profile_and_plot_options(tmp_path, text_dataset):
    files, _ = text_dataset
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500",
                         "--threads", "2", "--profile"])
    assert "wall s" in proc.stdout and "peak RSS" in proc.stdout
    profile = read_manifest(tmp_path / "plan")["provenance"]["profile"]
    assert {"analyze", "sort", "pack", "write_index"} <= set(profile)
    bad = run_sortpack(["run", *files, "-o", tmp_path / "x", "--column", "text", "--max-tokens", "1500",
                        "--threads", "-1"], check=False)
    assert bad.returncode == 2 and "--threads" in bad.stderr and not (tmp_path / "x").exists()
    png = tmp_path / "plan.png"
    proc = run_sortpack(["inspect", tmp_path / "plan", "--plot", png], check=False)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert proc.returncode == 2 and "matplotlib" in proc.stderr
    else:
        assert proc.returncode == 0 and png.stat().st_size > 0


@pytest.mark.slow
def test_the_cli_keeps_pyarrow_from_importing_pandas_and_pandas_still_works(tmp_path):
    # pyarrow imports pandas on its first pa.array: ~0.2 s per rank of every job
    import subprocess
    import sys

    pytest.importorskip("pandas")
    code = ("import sys; from sortpack.cli.startup import skip_pandas; skip_pandas(['run']); import pyarrow as pa; "
            "pa.array([1]); print('pandas' in sys.modules); import pandas as pd; "
            "print(type(pa.table({'a': [1]}).to_pandas()).__name__, pa.array(pd.Series([2])).to_pylist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "DataFrame", "[2]"]
    # a python: SPEC may use pandas itself: nothing is changed then
    code = ("import sys; from sortpack.cli.startup import skip_pandas; skip_pandas(['run', '--size', 'python:m:f']); "
            "import pyarrow as pa; pa.array([1]); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True"]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--help"], ["pack", "-h"], ["inspect", "--help"]])
def test_help_and_version_load_neither_pyarrow_nor_numpy(argv):
    # --help is what a user runs first, often on a login node: no Arrow, numpy or MPI start-up for it
    import subprocess
    import sys

    code = (f"import sys; from sortpack.cli import main\ntry: main({argv!r})\nexcept SystemExit as e: code = e.code\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pyarrow', 'numpy', 'mpi4py', 'pandas'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
    assert "Usage: sortpack" in out.stdout or "version" in out.stdout


def test_the_cli_is_a_package_whose_commands_each_have_a_module():
    import sortpack.cli
    from sortpack.cli.group import cli

    assert cli.list_commands(None) == ["analyze", "export", "inspect", "pack", "run", "sort", "verify"]
    for name in cli.list_commands(None):
        assert cli.get_command(None, name).callback.__module__ == f"sortpack.cli.{name}", name
    assert sortpack.cli.main.__module__ == "sortpack.cli"


@pytest.mark.mpi
def test_profile_splits_the_sort_into_phases_and_records_start_up(tmp_path, text_dataset):
    files, _ = text_dataset
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500",
                         "--profile"], ranks=2, env=SMALL)
    profile = read_manifest(tmp_path / "plan")["provenance"]["profile"]
    phases = profile["sort"]["phases"]
    assert {"keys", "local sort", "splitters", "exchange", "merge", "decode", "redistribute"} <= set(phases)
    assert all(v >= 0 for v in phases.values()) and sum(phases.values()) <= profile["sort"]["wall_s"] + 0.01
    assert len(profile["startup_s_per_rank"]) == 2 and 0 < profile["startup_s"] < 60
    assert 0 < profile["startup_cpu_s"] <= profile["startup_s"] * 4  # a process's CPU clock, not a wall clock
    assert "  exchange" in proc.stdout and "start-up (process start to the first stage" in proc.stdout
    # every second to the manifest: start-up, the stages, and the time between them
    staged = sum(v["wall_s"] for v in profile.values() if isinstance(v, dict))
    assert 0 <= profile["outside_stages_s"] and len(profile["cpu_s_per_rank"]) == 2
    assert profile["startup_s"] + staged <= profile["process_s"] + 0.05
    assert profile["process_s"] <= profile["startup_s"] + staged + profile["outside_stages_s"] + 0.5
    assert "between stages" in proc.stdout


THREADS_SPEC = "import os\n\ndef rayon(batch):\n    return [int(os.environ['RAYON_NUM_THREADS'])] * batch.num_rows\n"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,env,expect", [
    (1, {}, None),                              # one rank: every core this process may use
    (2, {}, "half"),                            # ranks x tokenizer threads = cores
    (2, {"RAYON_NUM_THREADS": "3"}, 3),         # the user's setting wins
])
def test_tokenizer_threads_share_the_cores_between_ranks(tmp_path, text_dataset, ranks, env, expect):
    import os

    from support import ROOT

    files, _ = text_dataset
    (tmp_path / "sp_threads_spec.py").write_text(THREADS_SPEC)
    # an empty RAYON_NUM_THREADS counts as unset: the test does not inherit the caller's
    env = {"RAYON_NUM_THREADS": "", **env, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    run_sortpack(["analyze", *files, "-o", tmp_path / "m", "--column", "text", "--size",
                  "python:sp_threads_spec:rayon", "--quiet"], ranks=ranks, env=env)
    cores = len(os.sched_getaffinity(0))
    want = {None: cores, "half": max(cores // 2, 1)}.get(expect, expect)
    sizes = read_manifest(tmp_path / "m")["stats"]
    assert sizes["size_min"] == sizes["size_max"] == want


# Every module a plain `run` of local files loads (--size column:, --quiet): every rank pays for each before its
# first stage (several milliseconds each where the bytecode is not cached). A module that is not here is one such a run
# never imports, whatever was added since: the tokenizer path, fine-tuning data, --oversize split, --store, --holdout,
# mixtures, --balance's orders, rows composed by their targets, --shapes auto, the other commands, the reader, the
# training helpers, the reports. A module a plain run must load joins the list deliberately.
PLAIN_RUN = frozenset(["sortpack", *(f"sortpack.{m}" for m in (
    "arrow_types", "distribute", "env", "errors", "launcher", "parallel", "partition", "permutation", "progress",
    "cli", "cli.builders", "cli.group", "cli.job", "cli.options", "cli.printing", "cli.run", "cli.startup",
    "format", "format.integrity", "format.kinds", "format.manifest", "format.schemas",
    "inputs", "inputs.columnar_formats", "inputs.columns", "inputs.discover", "inputs.fingerprints", "inputs.formats",
    "inputs.input_format", "inputs.locations", "inputs.measures", "inputs.megatron", "inputs.objects",
    "inputs.row_names", "inputs.size_kinds", "inputs.source_file", "inputs.specs", "inputs.text_formats",
    "inputs.validate",
    "kernels", "kernels._loader", "kernels.budget", "kernels.greedy", "kernels.merge", "kernels.radix",
    "pipeline", "pipeline.columns", "pipeline.dataset", "pipeline.job", "pipeline.kept", "pipeline.tail",
    "stages", "stages.analyze", "stages.analyze_options",
    "stages.caps", "stages.key_codes", "stages.plan_options", "stages.read_plan",
    "stages.sample_sort", "stages.samples", "stages.sort", "stages.sort_plan", "stages.pack", "stages.pack.balance",
    "stages.pack.batches", "stages.pack.bestfit", "stages.pack.budgets", "stages.pack.cut", "stages.pack.fits",
    "stages.pack.microbatches", "stages.pack.options", "stages.pack.packed",
    "write", "write.atomic_rename", "write.index_writer", "write.kept", "write.output", "write.output_guard",
    "write.owned", "write.plan_record", "write.provenance", "write.shards", "write.termination"))])
# libraries and option-specific modules no plain job loads (pyarrow's pandas, cloudpickle and dateutil: cli.startup)
NEVER = ("tokenizers", "tiktoken", "torch", "tqdm", "pandas", "cloudpickle", "dateutil", "matplotlib", "transformers",
         "datasets", "pyarrow.dataset", "pyarrow.compute", *(f"sortpack.{m}" for m in (
             "inputs.fast_tokens", "inputs.bpe_conversion", "inputs.sp_conversion", "inputs.token_columns",
             "inputs.finetune", "inputs.pieces", "stages.split", "stages.holdout", "stages.mixture", "pipeline.mixture",
             "write.store", "write.export", "stages.pack.compose", "stages.pack.order", "stages.shapes",
             "kernels.compose", "kernels.fit", "kernels.interleave", "kernels.tokens", "kernels.bpe", "kernels.sp_bpe",
             "reader", "report", "train", "torch", "batch", "lightning")))


def _never_loaded(loaded: list[str]) -> list[str]:
    """Return the modules of ``NEVER`` (and their submodules) among ``loaded``."""
    return [m for m in loaded if m in NEVER or m.startswith(tuple(n + "." for n in NEVER))]


def test_a_run_of_local_parquet_imports_only_what_it_uses(tmp_path):
    pq.write_table(pa.table({"n": np.arange(1, 1001, dtype=np.int32)}), tmp_path / "x.parquet")
    loaded = modules_loaded_by(["run", tmp_path / "x.parquet", "-o", tmp_path / "plan", "--size", "column:n",
                                "--max-tokens", "5000", "--quiet"])
    assert (tmp_path / "plan" / "manifest.json").is_file()
    assert _never_loaded(loaded) == []
    assert sorted(m for m in loaded if m.startswith("sortpack") and m not in PLAIN_RUN) == []


def test_a_run_sized_by_length_bytes_or_words_loads_no_pyarrow_compute(tmp_path):
    # importing pyarrow.compute makes a Python wrapper for each of ~290 functions (about 30 ms of CPU a rank): the
    # size kinds call Arrow's functions through sortpack.arrow_compute
    pq.write_table(pa.table({"text": ["a b", "ccc  d", "\u00e9\u00e9 \u6771", ""] * 50}), tmp_path / "x.parquet")
    for size in ("length", "bytes", "words"):
        loaded = modules_loaded_by(["run", tmp_path / "x.parquet", "-o", tmp_path / size, "--column", "text",
                                    "--size", size, "--max-tokens", "64", "--quiet"])
        assert read_manifest(tmp_path / size)["num_samples"] == 150  # the empty texts are no samples
        assert "pyarrow.compute" not in loaded and "sortpack.arrow_compute" in loaded, size


def test_the_stage_commands_import_none_of_what_their_options_do_not_ask_for(tmp_path):
    # analyze, sort and pack load each other's option records (a plan records all three), not the option-specific paths
    pq.write_table(pa.table({"n": np.arange(1, 1001, dtype=np.int32)}), tmp_path / "x.parquet")
    for argv in (["analyze", tmp_path / "x.parquet", "-o", tmp_path / "m", "--size", "column:n", "--quiet"],
                 ["sort", tmp_path / "m", "-o", tmp_path / "s", "--quiet"],
                 ["pack", tmp_path / "s", "-o", tmp_path / "p", "--max-tokens", "5000", "--quiet"]):
        assert _never_loaded(modules_loaded_by(argv)) == [], argv[0]
