"""The valid range of every number and name a pipeline spec gives, checked when the spec is loaded.

The ranges and why they are what they are: ``docs/spec.md`` ("Ranges"). In short, every stage
after loading (the solver, the allocation, a budget's scaling, the audit, the release) multiplies
and divides targets, privacy costs, query weights and sums over cells, and squares some of them
(the noise covariance ``Sigma`` against its inverse in the profile ``b^T Sigma^-1 b``; the
Cholesky factor of ``Sigma``). float64 holds about 1e-308 to 1e308: keeping each input within
[1e-12, 1e12] of 1 (a target within [1e-6, 1e12], a budget within [1e-8, 1e8], a query weight
within [1e-6, 1e6]) keeps a product of a few of them, their squares and their sums over up to
2^30 cells between 1e-150 and 1e150, far inside the normal floats: a spec that loads never
overflows to ``inf``, underflows to 0 or loses its sign in a plan, its audit or its release.
Sizes and names are bounded for memory and for the file system: what the stages allocate per
attribute and per query clique, and the block ids (``r-`` + attribute names joined by ``.``,
``distfit.plan.residual.block_id_for``) that name directories in the stores.

The checks (:func:`distfit.spec.fields.check_range` and the parser's) raise
:class:`distfit.spec.model.SpecError` naming the field, on one line:
``privacy.rho: must be in [1e-08, 1e+08], got 1e+308``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no numpy at run time: distfit --help imports this module (docs/architecture.md)
    import numpy as np


__all__ = [
    "Range",
    "TARGET",
    "RHO",
    "ALPHA",
    "EPSILON",
    "DELTA",
    "MATRIX_ENTRY",
    "NAME_MAX_LENGTH",
    "BLOCK_ID_MAX_LENGTH",
    "ATTRIBUTE_MAX_SIZE",
    "USED_ATTRIBUTE_MAX_SIZE",
    "MAX_CELLS_LIMIT",
    "QUERY_MAX_ENTRIES",
    "WORKLOAD_CELLS_LIMIT",
    "block_id_length",
]


@dataclass(frozen=True)
class Range:
    """A closed interval ``[low, high]`` of positive floats (``open_high``: ``[low, high)``)."""

    low: float
    high: float
    open_high: bool = False

    @property
    def text(self) -> str:
        """How a message states the range: ``in [1e-06, 1e+12]``."""
        return f"in [{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"

    def outside(self, values: np.ndarray) -> np.ndarray:
        """Mask of the float array ``values`` outside the range (NaN included)."""
        above = values >= self.high if self.open_high else values > self.high
        return (values < self.low) | (values != values) | above  # NaN != NaN

    def excludes(self, value: float) -> bool:
        """Whether the number ``value`` is outside the range (NaN included)."""
        return bool(self.outside(float(value)))


#: A query's variance target (people^2): sd from 0.001 to 10^6 people.
TARGET = Range(1e-6, 1e12)
#: A zCDP budget rho; ``alpha`` (= 2 rho) the same decades.
RHO = Range(1e-8, 1e8)
ALPHA = Range(1e-8, 1e8)
#: An (epsilon, delta) budget: the pair converts to alpha in [2e-12, 2e4] (docs/spec.md).
EPSILON = Range(1e-4, 1e4)
DELTA = Range(1e-100, 0.5)
#: The certified gap of a plan's blocks (``distfit plan --gap-tolerance``; 1e-4 by default,
#: ``plan.rounds.BLOCK_GAP``): from far below the default to a draft plan whose every block
#: costs at most twice the least any plan of its target shares can.
BLOCK_GAP = Range(1e-6, 1.0)
#: A nonzero entry of a ``matrix`` query (its absolute value).
MATRIX_ENTRY = Range(1e-6, 1e6)

#: Spec, attribute, level and (written) group names, in characters.
NAME_MAX_LENGTH = 64
#: A block id names a directory in the plan and release stores: at most 255 bytes, the file name
#: limit of Linux, macOS and Windows file systems.
BLOCK_ID_MAX_LENGTH = 255
#: Values of an attribute no query group uses (its labels are made, nothing else is).
ATTRIBUTE_MAX_SIZE = 1 << 20
#: Values of an attribute a query group uses: the spec and the planner hold dense n x n
#: matrices of it (identity, prefix, select, the pseudo-inverse of its difference matrix), at
#: most 128 MiB each.
USED_ATTRIBUTE_MAX_SIZE = 4096
#: The largest ``blocks.max_cells`` (every query clique has at most that many cells).
MAX_CELLS_LIMIT = 1 << 20
#: Entries of one attribute's query matrix (``all_ranges`` has n(n+1)/2 rows): 128 MiB.
QUERY_MAX_ENTRIES = 1 << 24
#: Cells of the workload: the sum over its distinct query cliques of their marginal's cells,
#: what a unit's tabulated data and its release hold (2 GiB of int64 per unit at most).
WORKLOAD_CELLS_LIMIT = 1 << 28


def block_id_length(attributes: tuple[str, ...]) -> int:
    """Characters of the block id of the clique ``attributes`` (``r-`` + names joined by ``.``,
    ``distfit.plan.residual.block_id_for``); the largest block of a query clique is its own."""
    return 2 + sum(len(name) for name in attributes) + len(attributes) - 1

