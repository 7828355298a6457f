"""The solver's one failure: a plan it could not certify (``distfit.solver.solve``).

A module of its own so that the command line maps it to exit code 1 without importing the
solver and, through it, scipy: ``distfit --help`` imports neither.
"""
from __future__ import annotations

__all__ = ["ConvergenceError"]


class ConvergenceError(RuntimeError):
    """The solver could not certify its plan within the requested optimality gap."""
