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

__version__ = "0.1.0"

from distfit.mathematics.privacy import Budget, PrivacyAccount, privacy_account, privacy_cost, privacy_profile  # noqa: E402
from distfit.solver.solve import BlockSolution, ConvergenceError, SolverStats, solve  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from distfit.stores.release import read_release  # noqa: E402

__all__ = [
    "BlockSolution",
    "Budget",
    "ConvergenceError",
    "PrivacyAccount",
    "SolverStats",
    "privacy_account",
    "privacy_cost",
    "privacy_profile",
    "read_plan",
    "read_release",
    "solve",
]
