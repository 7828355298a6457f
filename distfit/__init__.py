"""distfit: differentially private linear-query release with per-query accuracy targets.

``distfit.solve`` plans one block (SM-II with a dual certificate; ``distfit.solver``);
``distfit.read_plan`` and ``distfit.read_release`` are the public readers of the stores
(docs/design.md section 4). The rooms, one folder each (docs/architecture.md): ``spec`` (YAML specs),
``solver`` (one block), ``plan`` (decomposition, allocation, stitching, the plan job),
``release`` (the noise mathematics and the release job), ``estimate`` (post-processing),
``data`` (synthetic and microdata input), ``stores`` (Zarr), ``mathematics`` (the shared
mathematics: domain, workload, privacy, scaling, packing), ``runtime`` (Dask, chunked jobs,
threads), ``audit``, ``report``, ``pipeline`` (``distfit run``) and ``cli``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # the public names, for readers and type checkers; at run time see __getattr__
    from distfit.mathematics.privacy import Budget, PrivacyAccount, privacy_account, privacy_cost, privacy_profile
    from distfit.solver.convergence import ConvergenceError
    from distfit.solver.solve import BlockSolution, SolverStats, solve
    from distfit.stores.plan import read_plan
    from distfit.stores.release import read_release

#: Where each public name lives. They are imported on first use (PEP 562), not with the package:
#: ``import distfit`` is the first thing ``python -m distfit.cli`` does, before any of the
#: command's code can run, and importing numpy, scipy and zarr here took 3 s in which Ctrl-C
#: printed a traceback instead of the command's one line (distfit.cli.__main__).
_PUBLIC = {
    "Budget": "distfit.mathematics.privacy",
    "PrivacyAccount": "distfit.mathematics.privacy",
    "privacy_account": "distfit.mathematics.privacy",
    "privacy_cost": "distfit.mathematics.privacy",
    "privacy_profile": "distfit.mathematics.privacy",
    "BlockSolution": "distfit.solver.solve",
    "ConvergenceError": "distfit.solver.convergence",
    "SolverStats": "distfit.solver.solve",
    "solve": "distfit.solver.solve",
    "read_plan": "distfit.stores.plan",
    "read_release": "distfit.stores.release",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    """``distfit.NAME`` for the public names (``_PUBLIC``), imported from their module on first use."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'distfit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later lookups find it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
