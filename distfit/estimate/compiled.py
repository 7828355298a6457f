"""How the estimate's kernels are compiled (numba; :mod:`distfit.estimate.orthant`,
:mod:`distfit.estimate.query_sums`): entry points by :func:`kernel`, the helpers they call by
:func:`jit`.

Ahead of use (docs/compiled.md): every entry point has one explicit signature (arrays, sizes
as int64 arguments: no type depends on the structure's shape), so one compilation serves every
plan, and :func:`warm` (``python -m distfit.estimate.warm``, run by the set-up and by ``distfit
estimate``'s driver before its workers take chunks) writes it to numba's on-disk cache, from
which every later process loads it (PL94: 0.2-0.5 s) instead of compiling (about 10 s). The
helpers are compiled only into the entry points that call them (typed as part of the caller;
the caller's cached code holds them), so a process that loads the entry points from the cache
compiles nothing.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

import numba

__all__ = ["Kernel", "Warmed", "jit", "kernel", "warm"]


def _njit(function, fastmath: tuple[str, ...], signatures: list[str] | None = None):
    flags = set(fastmath) or False
    options = dict(nogil=True, fastmath=flags)
    try:
        if signatures is None:
            return numba.njit(cache=True, **options)(function)
        return numba.njit(signatures, cache=True, **options)(function)
    except RuntimeError:  # pragma: no cover - no writable cache directory
        return numba.njit(**options)(function) if signatures is None else numba.njit(signatures, **options)(function)


def jit(function=None, *, fastmath: tuple[str, ...] = ()):
    """``numba.njit`` without the GIL for a helper that kernels call (compiled into them, for
    the types they pass). Fastmath off (the float64 steps are the exact method's) but for the
    ``fastmath`` flags a helper names: ``reassoc`` for its sums, ``contract`` for fused
    multiply-adds (rounding only)."""
    if function is None:
        return functools.partial(jit, fastmath=fastmath)
    return _njit(function, fastmath)


class Kernel:
    """An entry point compiled for its one ``signature`` (a numba signature string) on first use
    or by :func:`warm`: ``numba.njit([signature], nogil=True, cache=True)`` (fastmath as
    :func:`jit`), loaded from numba's on-disk cache where it is there. Compilation for other
    types is disabled: arguments convert to the signature's types (a C-contiguous array to
    ``[:, :]``) or the call raises TypeError, so no call compiles anew."""

    def __init__(self, function, signature: str, fastmath: tuple[str, ...]) -> None:
        self.function, self.signature, self.fastmath = function, signature, fastmath
        self.__name__ = function.__name__
        self.__doc__ = function.__doc__
        self._lock = threading.Lock()
        self._dispatcher = None

    @property
    def dispatcher(self):
        """The numba dispatcher, its one signature compiled or loaded from the cache."""
        with self._lock:  # worker threads share the kernel: one load
            if self._dispatcher is None:
                self._dispatcher = _njit(self.function, self.fastmath, [self.signature])
            return self._dispatcher

    def __call__(self, *args):
        dispatcher = self._dispatcher if self._dispatcher is not None else self.dispatcher
        return dispatcher(*args)


def kernel(signature: str, *, fastmath: tuple[str, ...] = ()):
    """Decorator: the function as a :class:`Kernel` of the one ``signature``."""
    return lambda function: Kernel(function, signature, fastmath)


@dataclass(frozen=True)
class Warmed:
    """One kernel after :func:`warm`: ``loaded`` from numba's cache (else compiled, and written
    there where the cache is writable), the ``seconds`` it took and the cache's directory (None:
    no cache, compiled in this process only)."""

    name: str
    loaded: bool
    seconds: float
    cache: str | None


def warm(kernels: tuple[Kernel, ...]) -> tuple[Warmed, ...]:
    """Every kernel of ``kernels`` compiled or loaded from numba's cache in this process
    (module docstring), in order."""
    done = []
    for entry in kernels:
        start = time.perf_counter()
        dispatcher = entry.dispatcher
        stats = dispatcher.stats
        cache = getattr(dispatcher._cache, "cache_path", None)  # noqa: SLF001 - numba has no public accessor
        done.append(Warmed(name=entry.__name__, loaded=sum(stats.cache_hits.values()) > 0,
                           seconds=time.perf_counter() - start, cache=cache))
    return tuple(done)
