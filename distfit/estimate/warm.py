"""``python -m distfit.estimate.warm``: the estimate's compiled kernels written to numba's
on-disk cache ahead of use (:func:`distfit.estimate.compiled.warm`; docs/compiled.md), one line
a kernel: loaded from the cache or compiled, the seconds, the cache directory."""
from __future__ import annotations

import sys

from distfit.estimate import orthant, query_sums, region_graph, simplex
from distfit.estimate.compiled import Warmed, warm

__all__ = ["KERNELS", "warm_estimate"]

#: Every compiled entry point of the estimate.
KERNELS = orthant.KERNELS + query_sums.KERNELS + region_graph.KERNELS + simplex.KERNELS


def warm_estimate() -> tuple[Warmed, ...]:
    """Every kernel of :data:`KERNELS` compiled into numba's cache, or loaded from it."""
    return warm(KERNELS)


def main() -> int:
    """Warm every kernel and say how each went (exit 0)."""
    for done in warm_estimate():
        how = "loaded from the cache" if done.loaded else "compiled"
        where = done.cache or "no writable cache: compiled for this process only"
        print(f"distfit: kernel {done.name} {how} in {done.seconds:.1f} s ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
