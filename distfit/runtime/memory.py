"""This process's memory: how much of an RLIMIT_AS cap is left, and glibc's malloc tuning (arenas, mmap and trim thresholds).

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

__all__ = [
    "ARENAS", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "address_space_left", "limit_malloc_arenas",
    "raise_mmap_threshold",
]

#: glibc malloc arenas of a command's process at most (M_ARENA_MAX; glibc's default is 8 per
#: core). Its threads mostly wait on the disk and hold the GIL when they allocate, so they
#: contend little for an arena; measured on Adult's estimate: peak VmSize 2.7 -> 1.8 GiB, the
#: same CPU-seconds.
ARENAS = 2
#: glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): arrays up to this size
#: are served from the heap and reused rather than mapped and page-faulted afresh.
MMAP_THRESHOLD_BYTES = 32 << 20
#: glibc's trim threshold, set with the mmap threshold: setting either stops glibc adjusting
#: both, and the trim threshold stayed at 128 KiB, so the freed top of the heap went back to
#: the OS after every task and the next task's arrays were page-faulted afresh (a release's
#: chunk tasks, 100k PL94 units: 166k minor faults, 97k untouched, 19k with this). Freed memory
#: up to this size stays in the worker for reuse.
TRIM_THRESHOLD_BYTES = 4 * MMAP_THRESHOLD_BYTES
# mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _mallopt(*settings: tuple[int, int]) -> bool:
    """glibc's ``mallopt(parameter, value)`` for each pair in turn, stopping at the first
    refused; False where that is not possible (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return all(bool(libc.mallopt(parameter, int(value))) for parameter, value in settings)
    except (OSError, AttributeError):
        return False


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas in this process at ``arenas`` (``mallopt(M_ARENA_MAX,
    arenas)``): threads started afterwards share them instead of reserving 64 MiB each. False
    where that is not possible (not glibc). Arenas made before the call remain."""
    return _mallopt((_M_ARENA_MAX, arenas))


def raise_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Set glibc's mmap threshold in this process (``mallopt(M_MMAP_THRESHOLD, threshold)``)
    and its trim threshold to ``TRIM_THRESHOLD_BYTES`` (at least ``threshold``); False where
    that is not possible (not glibc). A Dask worker with Dask's MALLOC_TRIM_THRESHOLD_ has its
    threshold pinned at 128 KiB (``distfit.runtime.cluster.WORKER_ENV``); raising it recovers
    most of the speed of an untouched worker (three marginals.yaml block solves: 23 s pinned,
    17.6 s raised, 15.3 s untouched)."""
    return _mallopt((_M_MMAP_THRESHOLD, threshold), (_M_TRIM_THRESHOLD, max(int(threshold), TRIM_THRESHOLD_BYTES)))


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
