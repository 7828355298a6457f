"""This process's address space: how much of an RLIMIT_AS cap is left, and glibc's malloc arenas.

A process under ``RLIMIT_AS`` (``ulimit -v``; tests/estimate/test_wide.py runs Adult's
estimate under 4 GiB) fails on whatever maps memory last, reserved or used: a thread that
cannot start, an array that cannot be allocated. What an estimate process of Adult held, in
VmSize (benchmarks/README.md, issue 26): 0.5 GiB of imports; 1 GiB reserved at once by
pyarrow's mimalloc pool, which importing dask.dataframe starts (``distfit estimate`` no longer
imports it: ``distfit.cli.estimating``); 0.3 GiB of jax (the local polytope does not import
it); and up to 64 MiB reserved per thread that calls malloc, glibc's per-thread arenas (zarr's
six asyncio threads, the checksum, read and writer threads: 0.8 GiB), which
:func:`limit_malloc_arenas` caps.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import resource

__all__ = ["ARENAS", "address_space_left", "limit_malloc_arenas"]

#: glibc malloc arenas of a command's process at most (M_ARENA_MAX; glibc's default is 8 per
#: core). Its threads mostly wait on the disk and hold the GIL when they allocate, so they
#: contend little for an arena; measured on Adult's estimate: peak VmSize 2.7 -> 1.8 GiB, the
#: same CPU-seconds.
ARENAS = 2
_M_ARENA_MAX = -8  # mallopt parameter number (malloc.h)


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas in this process at ``arenas`` (``mallopt(M_ARENA_MAX,
    arenas)``): threads started afterwards share them instead of reserving 64 MiB each. False
    where that is not possible (not glibc). Arenas made before the call remain."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_ARENA_MAX, int(arenas)))
    except (OSError, AttributeError):
        return False


def address_space_left() -> int | None:
    """Bytes this process may still map under its RLIMIT_AS soft limit: the limit less the
    current VmSize (``/proc/self/statm``, pages). None when there is no limit or the size
    cannot be read (not Linux)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0, soft - pages * resource.getpagesize())
