"""Loading of the compiled kernels through ctypes, and the one backend state of the process.

The state here (``_clib``, ``_fallback_reason``, ``_warned``) is shared by every kernel
module: each calls ``_c()`` at run time, so tests patch this module to pick a backend.
``SORTPACK_NO_CKERNELS`` is read once, at the first kernel call, because it picks the
backend for the process.
"""
from __future__ import annotations

import ctypes
import importlib.util
import warnings
from typing import Any

import numpy as np

from ..env import env_flag

_ABI_VERSION = 20  # must equal SP_ABI_VERSION in _ckernels.c
_EXTENSION = __name__.rpartition(".")[0] + "._ckernels"
_UNLOADED: Any = object()
_clib: Any = _UNLOADED
_fallback_reason = ""
_warned = False

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_SIGNATURES = {
    "sp_abi_version": ([], _I64),
    "sp_greedy_pack": ([_PTR, _I64, _I64, _I64, ctypes.c_double, _I64, _I64,
                        ctypes.c_double, _I64, _PTR, _I64, _PTR], _I64),
    "sp_greedy_pack_caps": ([_PTR, _I64, _I64, _I64, ctypes.c_double, _I64, _I64,
                             ctypes.c_double, _I64, _PTR, _I64, _PTR, _PTR, _I64, _PTR], _I64),
    "sp_fit_pack_scratch_words": ([_I64, _I64], _I64),
    "sp_fit_pack": ([_PTR, _I64, _I64, _I64, ctypes.c_double, _I64, _I64, ctypes.c_double, _I64, _PTR, _I64,
                     _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR], _I64),
    "sp_merge_scratch_words": ([_I64, _I64, _I64], _I64),
    "sp_merge_runs_u64": ([_PTR, _PTR, _I64, _PTR, _PTR, _PTR], _I64),
    "sp_merge_keys_u64": ([_PTR, _PTR, _I64, _PTR, _PTR], _I64),
    "sp_merge_runs_pair": ([_PTR, _PTR, _PTR, _I64, _PTR, _PTR], _I64),
    "sp_pack_rows_scratch_words": ([_I64, _I64, _I64], _I64),
    "sp_pack_rows": ([_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR], _I64),
    "sp_optimal_lengths": ([_PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR], _I64),
    "sp_gather_bytes": ([_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _PTR], _I64),
    "sp_wf2q": ([_PTR, _PTR, _PTR, _PTR, _PTR, _I64, ctypes.c_double, _PTR, _I64], _I64),
    "sp_pad_tokens": ([_PTR, _I64, _I64, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR], _I64),
    "sp_varlen_tokens": ([_PTR, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64,
                          _PTR, _PTR, _PTR, _PTR, _PTR], _I64),
    "sp_utf8_cuts": ([_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64], _I64),
    "sp_pad_batch": ([_PTR], _I64),  # one int64 array of arguments (see _ckernels.c)
    "sp_varlen_batch": ([_PTR], _I64),
    "sp_radix_words": ([_I64], _I64),
    "sp_radix_sort_high": ([_PTR, _I64, _I64, _I64, _PTR, _PTR], _I64),
    "sp_merge_two_in_place": ([_PTR, _I64, _I64, _PTR, _I64], _I64),
    "sp_min_subsets": ([_PTR, _PTR, _I64, _I64, _I64, _I64, _PTR], _I64),
    "sp_compose_groups": ([_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR], _I64),
    "sp_deal_equal": ([_PTR, _I64, _I64, _I64, _I64, ctypes.c_double, _I64, _PTR], _I64),
    # _media.c (a second source of the library: new symbols, no change to the ones above)
    "sp_jpeg_sizes": ([_PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR], _I64),
    # _runs.c (a third source, likewise)
    "sp_copy_runs": ([_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _PTR], _I64),
    "sp_write_runs": ([_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR], _I64),
}


def _load_clib() -> Any:
    """Return the ctypes handle of the compiled kernels, or None with the reason recorded."""
    global _fallback_reason
    lib, _fallback_reason = load_extension(_EXTENSION, _SIGNATURES, ("sp_abi_version", _ABI_VERSION))
    return lib


def load_extension(extension: str, signatures: dict, abi: tuple[str, int]) -> tuple[Any, str]:
    """Return (the ctypes handle of a compiled extension, "") or (None, why it is unavailable).

    ``signatures``: function name -> (argument types, result type); ``abi``: the function that
    returns the extension's ABI number and the number this code expects.
    """
    if env_flag("SORTPACK_NO_CKERNELS"):
        return None, "SORTPACK_NO_CKERNELS is set"
    name = extension.rpartition(".")[2]
    try:
        spec = importlib.util.find_spec(extension)
    except (ImportError, ValueError) as exc:
        return None, f"cannot locate {name} ({exc})"
    if spec is None or not spec.origin:
        return None, f"the {name} extension was not built"
    try:
        lib = ctypes.CDLL(spec.origin)
        for fn_name, (args, res) in signatures.items():
            fn = getattr(lib, fn_name)
            fn.argtypes, fn.restype = args, res
    except (OSError, AttributeError) as exc:
        return None, f"cannot load {spec.origin} ({exc})"
    got = getattr(lib, abi[0])()
    if got != abi[1]:
        # an in-place build left over from another checkout: calling it would be unsafe
        return None, f"{spec.origin} is stale (ABI {got}, want {abi[1]})"
    return lib, ""


def _c() -> Any:
    """Return the compiled library, or None (after warning once) when it is unavailable."""
    global _clib, _warned
    if _clib is _UNLOADED:
        _clib = _load_clib()
    if _clib is None and not _warned:
        _warned = True
        # stacklevel 3: the warning points at the caller of the public kernel function
        warnings.warn(f"sortpack.kernels: compiled kernels unavailable ({_fallback_reason}); "
                      "using the slower numpy fallback", RuntimeWarning, stacklevel=3)
    return _clib


def backend() -> str:
    """Return which implementation the kernels use.

    Returns
    -------
    str
        ``"c"`` when the compiled kernels are in use, else ``"numpy"``.
    """
    global _clib
    if _clib is _UNLOADED:
        _clib = _load_clib()
    return "numpy" if _clib is None else "c"


def _ptr(a: np.ndarray) -> int:
    """Return the address of an array's data, for a ctypes pointer argument."""
    return a.ctypes.data


def _i64(a: Any) -> np.ndarray:
    """Return ``a`` as a C-contiguous int64 array (a copy only when needed)."""
    return np.ascontiguousarray(a, dtype=np.int64)


def _scratch(words: int, dtype: Any = np.uint64) -> np.ndarray:
    """Return uninitialised scratch memory for a C kernel.

    Allocated by numpy rather than malloc: numpy asks for transparent huge pages on large
    arrays, and first-touch faults of small pages can cost as much as the kernel itself.
    """
    return np.empty(max(int(words), 1), dtype=dtype)
