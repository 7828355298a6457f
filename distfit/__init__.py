"""distfit: differentially private linear-query release with per-query accuracy targets.

``distfit.solve`` plans one block (SM-II with a dual certificate); ``distfit.privacy`` holds the
privacy accounting, ``distfit.workload`` the workload builders and ``distfit.solver.baselines`` the
mechanisms users compare against. The pipeline: ``spec`` (YAML specs), ``blocks`` and ``plan``
(decomposition, allocation, stitching), ``runtime`` (Dask), ``store`` (Zarr plan stores),
``audit``, and ``planning`` (spec to plan store). Release: ``data`` (synthetic unit histograms),
``release`` (the noise mathematics) and ``releasing`` (plan + data to a release store).
"""
from __future__ import annotations

from distfit.privacy import Budget, PrivacyAccount, privacy_account, privacy_cost, privacy_profile
from distfit.solver.solve import BlockSolution, ConvergenceError, SolverStats, solve

__version__ = "0.1.0"

__all__ = [
    "BlockSolution",
    "Budget",
    "ConvergenceError",
    "PrivacyAccount",
    "SolverStats",
    "privacy_account",
    "privacy_cost",
    "privacy_profile",
    "solve",
]
