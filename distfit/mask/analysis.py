"""Analyses of a sealed mask store: its Gram matrix and the corrected regression (docs/mask.md)."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from distfit.mask.ols import Regression, corrected_ols
from distfit.mask.scaling import INTERCEPT
from distfit.stores.mask import Masked, read_verified_mask

__all__ = ["gram", "regression"]


def gram(store: Masked) -> np.ndarray:
    """``Y^T Y`` of the masked rows, summed block by block (memory of one block)."""
    width = len(store.columns)
    total = np.zeros((width, width))
    for rows in store.blocks():
        total += rows.T @ rows
    return total


def regression(store_path: str | os.PathLike, y: str, x: Sequence[str] | None = None, *,
               corrected: bool = True) -> Regression:
    """The least-squares regression of column ``y`` on the columns ``x`` (None: every other data
    column; ``[]``: none, the intercept alone: ``y``'s mean) with an intercept,
    from the mask store at ``store_path`` (verified first: its checksum recomputed), corrected
    for the release's noise (:func:`distfit.mask.ols.corrected_ols`: coefficients and standard
    errors in the data's units). ``corrected=False``: the naive OLS of the masked rows (biased
    towards zero), for comparison. ValueError (a :class:`distfit.stores.mask.MaskError` for the
    store) saying what is wrong."""
    store = read_verified_mask(store_path)
    if x is None:
        x = [c for c in store.columns if c not in (y, INTERCEPT)]
    x = [x] if isinstance(x, str) else list(x)
    return corrected_ols(gram(store), store.rows, store.sigma, store.columns, store.centre, store.scale, y, x,
                         constant=INTERCEPT, corrected=corrected)
