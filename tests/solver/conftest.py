"""Fixtures of the solver tests."""
from __future__ import annotations

import pytest

from tests.reference import cvx_optimal_alpha


@pytest.fixture(scope="module")
def cvx_alphas(request) -> dict[str, float]:
    """The cvx optimum (``tests.reference.cvx_optimal_alpha``) of every case of the requesting
    test module's ``CASES`` (tuples ``(id, W, targets, ...)``), computed once per module."""
    return {name: cvx_optimal_alpha(W, targets) for name, W, targets, *_ in request.module.CASES}
