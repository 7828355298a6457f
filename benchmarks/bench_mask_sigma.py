"""The sigma of setting A beside setting B's for one column, like paper 003's Table 1 (issue 33).

Usage::

    python benchmarks/bench_mask_sigma.py [--epsilons 1,0.1,0.001] [--deltas 1e-3,1e-6]
                                          [--rows 2,10,100,1000,10000,65536]

For each budget and block size (one block of that many rows) prints setting A's sigma (the
analytic Gaussian mechanism, sensitivity 2), setting B's least sigma for one column
(:func:`distfit.mask.account.mask_account`: the exact account of docs/privacy.md, "Setting B for
one column"), their ratio, and the CPU-seconds of B's calibration.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit.mask.account import mask_account  # noqa: E402


def _numbers(text: str, kind=float) -> list:
    return [kind(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="1,0.1,0.001")
    parser.add_argument("--deltas", default="1e-3,1e-6")
    parser.add_argument("--rows", default="2,10,100,1000,10000,65536")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'epsilon':>8} {'delta':>7} {'rows':>7} {'sigma A':>9} {'sigma B':>9} {'A / B':>7} {'CPU-s':>6}")
    for epsilon in _numbers(args.epsilons):
        for delta in _numbers(args.deltas):
            for rows in _numbers(args.rows, int):
                started = time.process_time()
                account = mask_account(epsilon, delta, 1, [rows])
                cpu = time.process_time() - started
                print(f"{epsilon:>8g} {delta:>7g} {rows:>7d} {account.sigma_gaussian:>9.4g} {account.sigma:>9.4g} "
                      f"{account.sigma_gaussian / account.sigma:>7.3g} {cpu:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
