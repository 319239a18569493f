"""sortpack: sort variable-length datasets by size and pack them into token-budgeted micro-batches.

Importing the package stays cheap (no numpy, no MPI); the stages live in submodules.
"""
__version__ = "0.1.0"
