"""sortpack: sort variable-length datasets by size and pack them into token-budgeted micro-batches.

Importing the package stays cheap (no numpy, no MPI); the stages live in submodules.
``sortpack.plan_batch`` (``sortpack.batch``) is imported on first use.
"""
__version__ = "0.1.0"


def __getattr__(name: str):
    """Return ``plan_batch`` or ``BatchPlan``, imported on first use (numpy and the kernels load then, never MPI)."""
    if name in ("plan_batch", "BatchPlan"):
        from . import batch

        return getattr(batch, name)
    raise AttributeError(f"module 'sortpack' has no attribute {name!r}")
