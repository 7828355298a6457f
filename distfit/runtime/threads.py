"""The BLAS thread rule: distfit's linear algebra runs with one BLAS thread unless
``DISTFIT_BLAS_THREADS=N`` says otherwise.

OpenBLAS's threads make small factorisations far slower on shared 2-core machines (an SVD of a
252 x 126 matrix: 3 s with 2 threads, 0.01 s with 1), and distfit parallelises over blocks and
chunks with processes instead. This is the only module that reads the environment variable or
talks to ``threadpoolctl``; the mathematics calls :func:`blas_limit` around its dense work.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator

from threadpoolctl import ThreadpoolController

ENV_VARIABLE = "DISTFIT_BLAS_THREADS"


def blas_threads() -> int:
    """BLAS threads for distfit's linear algebra: 1 unless ``DISTFIT_BLAS_THREADS`` says otherwise."""
    value = os.environ.get(ENV_VARIABLE, "1")
    try:
        return max(1, int(value))
    except ValueError:
        raise ValueError(f"{ENV_VARIABLE}: expected a positive integer, got {value!r}") from None


@functools.lru_cache(maxsize=1)
def thread_pools() -> ThreadpoolController:
    """This process's thread pools, looked up once (``threadpool_limits`` looks them up on every
    call: a few ms in a worker, per chunk task)."""
    return ThreadpoolController()


@contextlib.contextmanager
def blas_limit() -> Iterator[None]:
    """Run the enclosed block under the BLAS thread rule (restored on exit)."""
    with thread_pools().limit(limits=blas_threads(), user_api="blas"):
        yield
