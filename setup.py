"""Builds the optional C kernels; everything else is declared in pyproject.toml."""
from setuptools import Extension, setup

# optional=True: a machine without a C compiler still installs sortpack and falls back
# to the numpy implementations in sortpack.kernels (correct, slower).
setup(
    ext_modules=[
        Extension(
            "sortpack.kernels._ckernels",
            sources=["sortpack/kernels/_ckernels.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
