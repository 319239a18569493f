"""Builds the optional C kernels; everything else is declared in pyproject.toml."""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The quadratic budget must round exactly like the Python reference: no fast-math, and no
# contraction of a*b+c into an FMA (GCC contracts by default on targets that have FMA).
# No -march=native either: the built wheel may run on another node of the cluster.
_UNIX_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math"]
_MSVC_FLAGS = ["/O2", "/fp:precise"]


class BuildExt(build_ext):
    """build_ext that picks optimisation flags the compiler understands."""

    def build_extensions(self):
        flags = _MSVC_FLAGS if self.compiler.compiler_type == "msvc" else _UNIX_FLAGS
        for ext in self.extensions:
            ext.extra_compile_args = list(flags)
        super().build_extensions()


# optional=True: a machine without a C compiler still installs sortpack and falls back
# to the numpy implementations in sortpack.kernels (correct, slower).
setup(
    ext_modules=[
        Extension(
            "sortpack.kernels._ckernels",
            sources=["sortpack/kernels/_ckernels.c", "sortpack/kernels/_media.c",
                     "sortpack/kernels/_runs.c"],
            optional=True,
        ),
        # the BPEs of the tokenizer path (sortpack.kernels.bpe, byte-level; sortpack.kernels.sp_bpe,
        # SentencePiece-style), apart from the numeric kernels
        Extension(
            "sortpack.kernels._cbpe",
            sources=["sortpack/kernels/_bpe.c", "sortpack/kernels/_spbpe.c"],
            optional=True,
        ),
        # the SIGBUS handler of sortpack.format.mapped (a shard that shrinks under a reader)
        Extension(
            "sortpack.format._busguard",
            sources=["sortpack/format/_busguard.c"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": BuildExt},
)
