"""``distfit mask`` against the bare numpy loop doing the same arithmetic: time, CPU, memory, bytes
and flops (issue 33, point 5).

Usage::

    python benchmarks/bench_mask.py [--rows 1000000 10000000] [--columns 10] [--workers 2] [--workdir DIR]

For each N, writes a synthetic CSV of N rows and P uniform numeric columns once
(``<workdir>/data-N-P.csv``, reused), then runs each case in a fresh spawned process
(:func:`benchmarks.common.measured`):

* **mask, serial**: ``run_mask(..., placement=Placement(serial=True))``: read and check the CSV,
  stage it, scale, noise and mask block by block, write, hash and seal the store;
* **mask, W workers**: the same on a local cluster of W worker processes;
* **read the CSV**: pandas reading the same columns chunk by chunk (the driver's one pass);
* **bare numpy loop**: the arithmetic alone on the data already in memory, block by block over
  the same blocks (``distfit.mask.haar.block_sizes``), one BLAS thread as in the command's
  tasks (``distfit.runtime.threads.blas_limit``): scale and clip, draw the noise, the
  Gaussian matrix and the permutation, two thin QRs and the product
  (``distfit.mask.haar.mask_block``'s arithmetic written out), no store, no checks.

Printed per case: wall seconds and CPU-seconds (user + system of the process and of its reaped
children: a local cluster's workers; with workers, the driver's share apart), the peak resident memory of the driver (``ru_maxrss``
of the process: exact) and of each worker process (sampled every 50 ms by
:class:`benchmarks.common.PeakRSS`: the W largest of its descendants), and the arithmetic rate
(:func:`mask_flops` over the wall seconds). Per N: the CSV's bytes, the store's bytes, the
flops and the normal variates the release draws.

The flop count (:func:`block_flops`), per block of ``b`` rows, ``p`` data columns, ``k = p + 1``,
counting the LAPACK operation counts of Householder QR (``dgeqrf``: ``2 b k^2 - 2 k^3 / 3``) and
of forming its thin Q (``dorgqr``: the same again): scaling ``3 b p`` (subtract, divide, clip),
noise ``2 b p`` (scale the variates, add), the R of ``M = [X + C, 1]`` ``2 b k^2 - 2 k^3 / 3``, the
Q of the Gaussian ``G`` twice that, the sign correction ``b k``, the product ``W R`` ``2 b k^2``
(a general product, as numpy does it): ``8 b k^2 + 5 b p + b k - 2 k^3`` in all, and ``b (p + k)``
normal variates and a permutation of ``b``. Hashing and writing are bytes, not flops.
"""
from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import MIB, load, measured, store_bytes  # noqa: E402
from distfit.mask.haar import block_sizes, default_block_rows  # noqa: E402
from distfit.mask.job import run_mask  # noqa: E402
from distfit.runtime.placement import Placement  # noqa: E402
from distfit.runtime.threads import blas_limit  # noqa: E402


def write_csv(path: Path, rows: int, columns: int) -> None:
    rng = np.random.default_rng(0)
    names = [f"c{j}" for j in range(columns)]
    with open(path, "w") as f:
        f.write(",".join(names) + "\n")
        for start in range(0, rows, 500_000):
            block = rng.uniform(0, 100, size=(min(500_000, rows - start), columns)).round(3)
            pd.DataFrame(block).to_csv(f, header=False, index=False)


def block_flops(b: int, p: int) -> float:
    """The floating-point operations of masking one block of ``b`` rows and ``p`` data columns
    (module docstring)."""
    k = p + 1
    qr = 2.0 * b * k * k - 2.0 * k**3 / 3.0
    return 3.0 * b * p + 2.0 * b * p + qr + 2.0 * qr + b * k + 2.0 * b * k * k


def mask_flops(rows: int, p: int) -> tuple[float, int]:
    """``(flops, normal variates)`` of a release of ``rows`` rows of ``p`` columns in the default
    blocks."""
    sizes = block_sizes(rows, p, default_block_rows(p))
    return sum(block_flops(int(b), p) for b in sizes), int(sizes.sum()) * (2 * p + 1)


def _usage() -> dict[str, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu": own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime,
            "own": own.ru_utime + own.ru_stime, "driver": own.ru_maxrss * 1024.0, "child": children.ru_maxrss * 1024.0}


def _timed(work) -> dict[str, float]:
    """Run ``work()`` and return its wall seconds, CPU-seconds and this process's peak RSS."""
    before, started = _usage(), time.perf_counter()
    inner = work()
    after = _usage()
    return {"wall": time.perf_counter() - started, "cpu": after["cpu"] - before["cpu"], "own": after["own"] - before["own"],
            "driver": after["driver"], "child": after["child"], "inner": inner}


def run_mask_case(csv: str, out: str, columns: int, workers: int | None) -> dict:
    names = [f"c{j}" for j in range(columns)]
    placement = Placement(serial=True) if workers is None else Placement(workers=workers)

    def work():
        run_mask(csv, out, columns=names, bounds={n: (0.0, 100.0) for n in names}, epsilon=1.0, delta=1e-6,
                 placement=placement, log=io.StringIO())
        return store_bytes(out)
    return _timed(work)


def read_case(csv: str, _out: str, columns: int, _workers) -> dict:
    names = [f"c{j}" for j in range(columns)]

    def work():
        for frame in pd.read_csv(csv, usecols=names, chunksize=1 << 17, engine="c"):
            frame.to_numpy(dtype=np.float64)
    return _timed(work)


def bare_case(csv: str, _out: str, columns: int, _workers) -> dict:
    """The arithmetic alone (the data loaded first, untimed: ``inner`` is the arithmetic's own
    wall seconds)."""
    data = pd.read_csv(csv, usecols=[f"c{j}" for j in range(columns)]).to_numpy(dtype=np.float64)

    def work():
        started = time.perf_counter()
        centre, scale, sigma = 50.0, 50.0, 10.0
        rng = np.random.default_rng(1)
        total, start = 0.0, 0
        with blas_limit():  # one BLAS thread, as every task of the command runs
            for b in block_sizes(len(data), columns, default_block_rows(columns)).tolist():
                x = np.clip((data[start:start + b] - centre) / scale, -1, 1)
                m = np.column_stack([x + sigma * rng.standard_normal(x.shape), np.ones(b)])
                q, r = np.linalg.qr(rng.standard_normal((b, columns + 1)))
                q *= np.where(np.diagonal(r) < 0, -1.0, 1.0)
                y = (q @ np.linalg.qr(m, mode="r"))[rng.permutation(b)]
                total += y[0, 0]
                start += b
        return time.perf_counter() - started
    return _timed(work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--columns", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-mask-"))
    workdir.mkdir(parents=True, exist_ok=True)
    out = str(workdir / "m.zarr")
    print(f"{os.cpu_count()} CPUs; {args.columns} columns; workdir {workdir}")
    for rows in args.rows:
        csv = workdir / f"data-{rows}-{args.columns}.csv"
        if not csv.exists():
            started = time.perf_counter()
            write_csv(csv, rows, args.columns)
            print(f"wrote {csv.name} in {time.perf_counter() - started:.1f} s")
        flops, normals = mask_flops(rows, args.columns)
        print(f"\n{rows:,} rows x {args.columns} columns: CSV {csv.stat().st_size / MIB:.0f} MiB; "
              f"{flops / 1e9:.2f} Gflop, {normals / 1e6:.0f} M normal variates")
        print(f"  {'case':<24}{'wall s':>8}{'CPU-s':>8}{'driver MiB':>12}  {'workers MiB':<14}{'Gflop/s':>8}  load")
        cases = [("mask, serial", run_mask_case, None), (f"mask, {args.workers} workers", run_mask_case, args.workers),
                 ("read the CSV (pandas)", read_case, None), ("bare numpy loop", bare_case, None)]
        for label, case, workers in cases:
            before = load()
            result, memory = measured(case, str(csv), out, args.columns, workers)
            peaks = sorted(memory.children.values(), reverse=True)[:args.workers] if workers else []
            shown = ", ".join(f"{p / MIB:.0f}" for p in peaks) or "-"
            rate = f"{flops / 1e9 / result['wall']:.2f}" if case is not read_case else "-"
            extra = ""
            if case is bare_case:
                extra = f"  (arithmetic alone {result['inner']:.1f} s: {flops / 1e9 / result['inner']:.2f} Gflop/s)"
            elif case is run_mask_case and workers is None:
                extra = f"  (store {result['inner'] / MIB:.0f} MiB)"
            elif case is run_mask_case:
                extra = f"  (CPU-s: driver {result['own']:.1f}, workers {result['cpu'] - result['own']:.1f})"
            print(f"  {label:<24}{result['wall']:>8.1f}{result['cpu']:>8.1f}{result['driver'] / MIB:>12.0f}  "
                  f"{shown:<14}{rate:>8}  {before}{extra}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
