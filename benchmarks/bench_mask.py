"""``distfit mask`` against the bare numpy loop doing the same arithmetic (issue 33).

Usage::

    python benchmarks/bench_mask.py [--rows 10000000] [--columns 10] [--workers 2] [--workdir DIR]

Writes a synthetic CSV of N rows and P numeric columns once (``<workdir>/data-N-P.csv``, reused),
then, each in a fresh spawned process (wall seconds and CPU-seconds of the process and its reaped
children, the workers included):

* **mask, serial**: ``run_mask(..., placement=Placement(serial=True))``: read and check the CSV,
  stage it, scale, noise and mask block by block, write and seal the store;
* **mask, W workers**: the same on a local cluster of W worker processes;
* **read the CSV**: pandas reading the same columns chunk by chunk (the driver's one pass);
* **bare numpy loop**: the arithmetic alone on the data already in memory: per block of
  65,536 rows, scale and clip, draw the noise, the Gaussian matrix and the permutation, two
  thin QRs and the product (``distfit.mask.haar.mask_block``'s arithmetic written out), no
  store, no checks.

The store is deleted after each run.
"""
from __future__ import annotations

import argparse
import io
import multiprocessing
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

from distfit.mask.haar import DEFAULT_BLOCK_ROWS  # noqa: E402
from distfit.mask.job import run_mask  # noqa: E402
from distfit.runtime.placement import Placement  # noqa: E402


def write_csv(path: Path, rows: int, columns: int) -> None:
    rng = np.random.default_rng(0)
    names = [f"c{j}" for j in range(columns)]
    with open(path, "w") as f:
        f.write(",".join(names) + "\n")
        for start in range(0, rows, 500_000):
            block = rng.uniform(0, 100, size=(min(500_000, rows - start), columns)).round(3)
            pd.DataFrame(block).to_csv(f, header=False, index=False)


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_mask_case(csv: str, out: str, columns: int, workers: int | None) -> None:
    names = [f"c{j}" for j in range(columns)]
    placement = Placement(serial=True) if workers is None else Placement(workers=workers)
    run_mask(csv, out, columns=names, bounds={n: (0.0, 100.0) for n in names}, epsilon=1.0, delta=1e-6,
             placement=placement, log=io.StringIO())


def read_case(csv: str, _out: str, columns: int, _workers) -> None:
    names = [f"c{j}" for j in range(columns)]
    for frame in pd.read_csv(csv, usecols=names, chunksize=1 << 17, engine="c"):
        frame.to_numpy(dtype=np.float64)


def bare_case(csv: str, _out: str, columns: int, _workers) -> float:
    """The arithmetic alone; returns its own wall seconds (the data is loaded first, untimed)."""
    data = pd.read_csv(csv, usecols=[f"c{j}" for j in range(columns)]).to_numpy(dtype=np.float64)
    started = time.perf_counter()
    centre, scale, sigma = 50.0, 50.0, 10.0
    rng = np.random.default_rng(1)
    total = 0.0
    for start in range(0, len(data), DEFAULT_BLOCK_ROWS):
        x = np.clip((data[start:start + DEFAULT_BLOCK_ROWS] - centre) / scale, -1, 1)
        b = len(x)
        m = np.column_stack([x + sigma * rng.standard_normal(x.shape), np.ones(b)])
        q, r = np.linalg.qr(rng.standard_normal((b, columns + 1)))
        q *= np.where(np.diagonal(r) < 0, -1.0, 1.0)
        y = (q @ np.linalg.qr(m, mode="r"))[rng.permutation(b)]
        total += y[0, 0]
    return time.perf_counter() - started


def measured(case, *args, queue) -> None:
    started, cpu = time.perf_counter(), cpu_seconds()
    inner = case(*args)
    queue.put((time.perf_counter() - started, cpu_seconds() - cpu, inner))


def measure(case, *args) -> tuple[float, float, float | None]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=measured, args=(case, *args), kwargs={"queue": queue})
    process.start()
    result = queue.get()
    process.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--columns", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-mask-"))
    workdir.mkdir(parents=True, exist_ok=True)
    csv = workdir / f"data-{args.rows}-{args.columns}.csv"
    if not csv.exists():
        started = time.perf_counter()
        write_csv(csv, args.rows, args.columns)
        print(f"wrote {csv} ({csv.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.1f} s")
    out = str(workdir / "m.zarr")
    print(f"{args.rows:,} rows x {args.columns} columns; load average {os.getloadavg()[0]:.2f}")
    cases = [("mask, serial", run_mask_case, None), (f"mask, {args.workers} workers", run_mask_case, args.workers),
             ("read the CSV (pandas)", read_case, None), ("bare numpy loop", bare_case, None)]
    for label, case, workers in cases:
        wall, cpu, inner = measure(case, str(csv), out, args.columns, workers)
        extra = f"   (arithmetic alone: {inner:.1f} s wall)" if inner is not None else ""
        print(f"{label:28s} {wall:7.1f} s wall {cpu:7.1f} CPU-s{extra}", flush=True)
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
