"""``distfit regress``: the noise-corrected regression of a mask store's columns
(``distfit.mask.regression``; docs/mask.md, "Analysis: the corrected regression").

``distfit regress MASKED.zarr --y COL [--x A,B] [--naive]`` verifies the store as every reader
does (the checksum recomputed, every chunk: ``distfit.stores.mask.read_verified_mask``), fits
``COL`` on the columns ``--x`` (default: every other data column; ``--x ''``: none, the mean)
with an intercept and prints the coefficients and standard errors in the data's units, with
``n``, sigma and which correction was made. It writes nothing. A module of its own, apart from
``distfit mask`` (``distfit.cli.mask``), so that it imports neither pandas nor Dask: it reads one
store. Every refusal is one line and exit 2: an empty name in ``--x`` as the arguments are parsed
(``distfit.cli.main.column_names``), the rest by the library (``ValueError``): an unknown column, ``--y`` among ``--x``, a regressor named
twice, a path that is not a sealed mask store, a store changed after its seal.
"""
from __future__ import annotations

import argparse

from distfit.cli.summary import print_summary
from distfit.mask.analysis import regression
from distfit.mask.ols import Regression

__all__ = ["cmd_regress", "coefficient_table"]

#: What the ``correction`` row says of each kind of fit.
CORRECTED = "errors in variables: Y^T Y - n sigma^2 I (no noise on the intercept; Fuller's standard errors)"
NAIVE = "none (--naive): the OLS of the masked rows, biased towards zero; its standard errors ignore the noise"


def coefficient_table(fit: Regression) -> list[str]:
    """The lines of ``fit``'s table: a header, then one line per term (the intercept first), the
    coefficient and its standard error (6 significant digits), in aligned columns."""
    width = max(len("term"), *(len(name) for name in fit.names))
    lines = [f"  {'term':<{width}}  {'coefficient':>14}  {'standard error':>14}"]
    for name, coefficient, error in zip(fit.names, fit.coefficients, fit.standard_errors):
        lines.append(f"  {name:<{width}}  {coefficient:>14.6g}  {error:>14.6g}")
    return lines


def cmd_regress(args: argparse.Namespace) -> int:
    """``distfit regress``: the regression of ``--y`` on ``--x`` from a verified mask store."""
    fit = regression(args.store, y=args.y, x=args.x, corrected=not args.naive)
    on = ", ".join(fit.names[1:]) or "the intercept alone"
    print_summary(f"regress {args.store}", [
        ("model", f"{fit.y} on {on}"),
        ("rows", f"n {fit.n}"),
        ("sigma", f"{fit.sigma:.6g}  (the release's noise, on the [-1, 1] scale of each column)"),
        ("correction", NAIVE if args.naive else CORRECTED),
        ("residual", f"variance {fit.error_variance:.6g}  (the model's error, in {fit.y}'s units"
                     f"{'' if args.naive else ', the noise removed'})"),
    ])
    print("\n".join(coefficient_table(fit)))
    return 0
