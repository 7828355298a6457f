"""``distfit mask``: a CSV's numeric columns -> a sealed store of masked pseudo-data
(``distfit.mask.job.run_mask``; docs/mask.md). This module reads ``--columns`` and ``--bounds``
from argv (``UsageError``, exit 2, naming the flag) and prints the summary; every other check
is the library's."""
from __future__ import annotations

import argparse
import math

from distfit.cli.errors import UsageError
from distfit.cli.summary import print_summary
from distfit.mask.job import run_mask

__all__ = ["cmd_mask", "parse_bounds"]


def parse_bounds(text: str | None) -> dict[str, tuple[float, float]]:
    """``a=LO:HI,b=LO:HI`` -> ``{"a": (LO, HI), ...}``; UsageError naming the entry that is not
    ``NAME=LO:HI`` with numbers, or a column given twice."""
    bounds: dict[str, tuple[float, float]] = {}
    for entry in (text or "").split(","):
        if not entry.strip():
            continue
        name, eq, span = entry.partition("=")
        lo, colon, hi = span.partition(":")
        name = name.strip()
        if not (eq and colon and name):
            raise UsageError(f"--bounds: {entry.strip()!r} is not NAME=LO:HI")
        try:
            pair = (float(lo), float(hi))
        except ValueError:
            raise UsageError(f"--bounds: {name}: LO and HI must be numbers, got {span.strip()!r}") from None
        if not all(math.isfinite(v) for v in pair):
            raise UsageError(f"--bounds: {name}: LO and HI must be finite, got {span.strip()!r}")
        if name in bounds:
            raise UsageError(f"--bounds: {name!r} is given twice")
        bounds[name] = pair
    return bounds


def cmd_mask(args: argparse.Namespace) -> int:
    """``distfit mask``: CSV -> sealed mask store (``distfit.mask.job.run_mask``)."""
    if args.bounds is None and not args.bounds_from_data:
        raise UsageError("--bounds is required (public bounds NAME=LO:HI for every column; or --bounds-from-data, "
                         "which leaks them)")
    if args.bounds is not None and args.bounds_from_data:
        raise UsageError("--bounds and --bounds-from-data exclude each other")
    result = run_mask(
        args.data, args.out, columns=args.columns, bounds=parse_bounds(args.bounds),
        bounds_from_data=args.bounds_from_data, epsilon=args.epsilon, delta=args.delta, block_rows=args.block_rows,
        seed=args.seed, resume=args.resume, overwrite=args.overwrite, placement=args.placement,
    )
    rate = result.rows_drawn / result.seconds if result.seconds > 0 else float("nan")
    masked = "not claimed for p > 1 (docs/privacy.md)" if result.sigma_masked is None else f"{result.sigma_masked:.6g}"
    clipped = ", ".join(f"{c} {n}" for c, n in result.clipped.items() if n) or "none"
    print_summary(f"mask {result.path}", [
        ("rows", f"{result.rows} x {len(result.columns)} columns + (intercept)  ({result.blocks} blocks of "
                 f"{result.block_rows} rows, {result.blocks_drawn} drawn now{', resumed' if result.resumed else ''})"),
        ("privacy", f"({result.account['epsilon']:g}, {result.account['delta']:g})-DP, neighbours differ in one row "
                    f"(n fixed); L2 sensitivity {result.account['sensitivity']:.6g}"),
        ("sigma", f"{result.sigma:.6g} used  (A, noise alone: {result.sigma_gaussian:.6g}; B, with the mask: {masked})"),
        ("clipped", f"{clipped}  (values outside --bounds; not stored)"),
        ("seconds", f"{result.seconds:.1f}  ({rate:.1f} rows/s)"),
        ("checksum", f"{result.checksum}  (sealed)"),
    ] + ([] if result.private else [("NOT PRIVATE", "bounds from the data (--bounds-from-data)" if result.bounds_from_data
                                     else "masked with a fixed --seed (tests only)")]))
    return 0
