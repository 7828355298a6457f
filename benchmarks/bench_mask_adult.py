"""The corrected regression from a masked release of the Adult data, against OLS on the true data
and on the noisy data without the mask (issue 33, point 4; docs/mask.md, "What to expect").

Usage::

    python benchmarks/bench_mask_adult.py [--data pipelines/data/adult.csv] [--epsilon 1] [--delta 1e-6]
                                          [--seed 2024]

Two cases on the Adult data's numeric columns, each at (epsilon, delta):

* **p = 1**: ``hours-per-week`` (bounds 1:99) alone, its regression on the intercept (its mean);
  sigma is setting B's (the exact account of the mask for one column, docs/privacy.md);
* **p = 2**: ``age`` (17:90) and ``hours-per-week``, hours regressed on age; sigma is setting A's
  (no gain of the mask is claimed for p > 1).

For each, side by side, every coefficient with its standard error and the residual standard
deviation (the model's error, noise removed where corrected), all in the data's units:

* **true data**: OLS on the scaled and clipped columns (what a corrected fit estimates;
  classical standard errors), checked against ``numpy.linalg.lstsq``;
* **X + C**: the same columns with iid ``N(0, sigma^2)`` noise on the [-1, 1] scale and no mask
  (drawn here, seed ``--seed + 1``), at the release's sigma, corrected
  (:func:`distfit.mask.ols.corrected_ols`) and naive; for p = 1 also at setting A's sigma, the
  noise that is private without the mask;
* **masked store**: ``distfit mask`` (:func:`distfit.mask.job.run_mask`, serial, ``--seed``,
  hence marked not private: a benchmark must print the same figures twice) and
  :func:`distfit.mask.regression` on the store, corrected and naive.

Then the sigma of setting A (noise alone) and of setting B (with the mask) for one column side
by side, like paper 003's Table 1, for one block of the data's rows at ``--delta`` and the
epsilons of ``--table-epsilons`` (:func:`distfit.mask.account.mask_account`). Prints the load
average and the wall and CPU-seconds of the whole run.
"""
from __future__ import annotations

import argparse
import io
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit.mask import regression  # noqa: E402
from distfit.mask.account import mask_account  # noqa: E402
from distfit.mask.job import run_mask  # noqa: E402
from distfit.mask.ols import Regression, corrected_ols  # noqa: E402
from distfit.mask.scaling import INTERCEPT, check_scaling, scale_rows  # noqa: E402
from distfit.runtime.placement import Placement  # noqa: E402

#: (columns with their public bounds, the response, the regressors)
CASES = [
    ({"hours-per-week": (1.0, 99.0)}, "hours-per-week", []),
    ({"age": (17.0, 90.0), "hours-per-week": (1.0, 99.0)}, "hours-per-week", ["age"]),
]


def _gram(z: np.ndarray) -> np.ndarray:
    w = np.column_stack([z, np.ones(len(z))])
    return w.T @ w


def _row(label: str, sigma: float, fit: Regression) -> str:
    """One fit: sigma, each coefficient with its standard error in brackets, the residual sd
    (``< 0``: the corrected estimate of its variance came out negative, the noise swamping it)."""
    cells = "".join(f"{c:>12.6g} {'(' + format(s, '.4g') + ')':<11}" for c, s in zip(fit.coefficients, fit.standard_errors))
    sd = format(math.sqrt(fit.error_variance), ".5g") if fit.error_variance >= 0 else "< 0"
    return f"  {label:<38}{sigma:>9.6g}{cells}{sd:>10}"


def run_case(data: str, bounds: dict, y: str, x: list[str], epsilon: float, delta: float, seed: int,
             workdir: Path) -> int:
    """Print one case (module docstring); returns the data's rows."""
    columns = list(bounds)
    values = pd.read_csv(data, usecols=columns)[columns].to_numpy(dtype=np.float64)
    n, p = values.shape
    scaling = check_scaling(columns, bounds)
    z = scale_rows(values, scaling.centre, scaling.scale)
    names = [*columns, INTERCEPT]
    centre, scale = np.append(scaling.centre, 0.0), np.append(scaling.scale, 1.0)

    def fit(gram: np.ndarray, sigma: float, corrected: bool = True) -> Regression:
        return corrected_ols(gram, n, sigma, names, centre, scale, y, x, constant=INTERCEPT, corrected=corrected)

    store = workdir / f"adult-{p}.zarr"
    result = run_mask(data, store, columns=columns, bounds=bounds, epsilon=epsilon, delta=delta, seed=seed,
                      placement=Placement(serial=True), log=io.StringIO(), overwrite=store.exists())
    sigma, sigma_a, sigma_b = result.sigma, result.sigma_gaussian, result.sigma_masked

    truth = fit(_gram(z), 0.0)  # OLS: no noise, nothing to correct
    clipped = scaling.centre + scaling.scale * z  # the data as released: clipped to the bounds
    design = np.column_stack([np.ones(n)] + [clipped[:, columns.index(c)] for c in x])
    reference = np.linalg.lstsq(design, clipped[:, columns.index(y)], rcond=None)[0]
    assert np.allclose(truth.coefficients, reference, rtol=1e-9, atol=1e-9), (truth.coefficients, reference)

    rng = np.random.default_rng(seed + 1)
    noise = rng.standard_normal(z.shape)
    rows = [("true data (scaled, clipped)", 0.0, truth)]
    rows += [("X + C, no mask, corrected", sigma, fit(_gram(z + sigma * noise), sigma)),
             ("X + C, no mask, naive", sigma, fit(_gram(z + sigma * noise), sigma, corrected=False)),
             ("masked store, corrected", sigma, regression(store, y=y, x=x)),
             ("masked store, naive", sigma, regression(store, y=y, x=x, corrected=False))]
    if sigma_b is not None:  # p = 1: what noise alone must add to be private
        rows.append(("X + C at setting A's sigma, corrected", sigma_a, fit(_gram(z + sigma_a * noise), sigma_a)))

    print(f"\np = {p}: {', '.join(f'{c} {lo:g}:{hi:g}' for c, (lo, hi) in bounds.items())}; {y} on "
          f"{', '.join(x) or 'the intercept'}; n = {n} in {result.blocks} block(s) of {result.block_rows} rows; "
          f"epsilon {epsilon:g}, delta {delta:g}")
    print(f"  sigma ([-1, 1] scale): A, noise alone {sigma_a:.6g}; B, with the mask "
          f"{'not claimed for p > 1' if sigma_b is None else f'{sigma_b:.6g}'}; used {sigma:.6g}")
    terms = "".join(f"{name + ' (se)':>23} " for name in truth.names)
    print(f"  {'fit':<38}{'sigma':>9}{terms}{'resid sd':>10}")
    for label, s, f in rows:
        print(_row(label, s, f))
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "pipelines" / "data" / "adult.csv"))
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--table-epsilons", default="0.1,0.5,1,2")
    args = parser.parse_args(argv)
    print(f"load average {'/'.join(f'{v:.1f}' for v in os.getloadavg())}; {args.data}")
    started, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="bench-mask-adult-") as workdir:
        for bounds, y, x in CASES:
            rows = run_case(args.data, bounds, y, x, args.epsilon, args.delta, args.seed, Path(workdir))
    print(f"\nsigma for one column, one block of {rows} rows, delta {args.delta:g} (paper 003's Table 1)")
    print(f"  {'epsilon':>8} {'A, noise alone':>15} {'B, with the mask':>17} {'A / B':>7}")
    for epsilon in (float(e) for e in args.table_epsilons.split(",")):
        account = mask_account(epsilon, args.delta, 1, [rows])
        print(f"  {epsilon:>8g} {account.sigma_gaussian:>15.6g} {account.sigma:>17.6g} "
              f"{account.sigma_gaussian / account.sigma:>7.3g}")
    print(f"\n{time.perf_counter() - started:.1f} s wall, {time.process_time() - cpu:.1f} CPU-s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
