"""How the estimate's kernels are compiled (numba; :mod:`distfit.estimate.orthant`,
:mod:`distfit.estimate.query_sums`): one decorator, :func:`jit`."""
from __future__ import annotations

import functools

import numba

__all__ = ["jit"]


def jit(function=None, *, fastmath: tuple[str, ...] = ()):
    """``numba.njit`` without the GIL, cached on disk where numba finds a writable cache
    directory (beside the package, else the user's cache), else compiled once per process.
    Fastmath off (the float64 steps are the exact method's) but for the ``fastmath`` flags a
    kernel names: ``reassoc`` for its sums, ``contract`` for fused multiply-adds (rounding only)."""
    if function is None:
        return functools.partial(jit, fastmath=fastmath)
    flags = set(fastmath) or False
    try:
        return numba.njit(nogil=True, cache=True, fastmath=flags)(function)
    except RuntimeError:  # pragma: no cover - no writable cache directory
        return numba.njit(nogil=True, fastmath=flags)(function)
