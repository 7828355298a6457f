"""Release throughput: ``run_release`` on 2 local worker processes against a minimal numpy loop.

Usage::

    python benchmarks/bench_release.py [--units 100000 300000 1000000] [--workers 2] [--workdir DIR]
                                       [--repeat N]

Plans ``pipelines/pl94.yaml`` once (``run_plan``, serial) into the workdir; then, for each N,
synthesises N unit histograms with ``write_synthetic`` (252 cells, timed separately: not part
of the comparison), releases them with ``run_release(..., workers=W)`` (its own local
cluster; start-up, audit, store layout, the chunk tasks and sealing with its checksum and
fsync are all inside the timed call) and runs a minimal single-process baseline doing the same
arithmetic and writes: per data chunk, read the counts, take each block's marginals,
``(X_b B^T + Z) L^T`` with ``Z = Xi C^T`` (``C`` the Cholesky factor of ``Sigma_b``, computed
once per block; ``Xi`` from ``default_rng`` per (block, chunk) as in distfit), sum the block
columns into the query answers, and write block answers, query answers and unit ids into a
plain Zarr v3 group with the same chunking and the same codecs
(``distfit.stores.release.ANSWER_COMPRESSORS`` for the answers). No Dask, no validation, no
checksum, no fsync. ``--repeat N`` runs the pair
(distfit, then the baseline) N times per N and reports the median and the range.

Memory: peak RSS is *sampled* (every 50 ms, psutil) in a background thread, separately for
each phase: the driver process, and each descendant process of the driver (the nanny and
worker processes of the local cluster; the largest one is reported). Nothing is added to the
library. ``ru_maxrss`` of the driver over the whole run is printed at the end.
Stores are deleted after each N.
"""
from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import scipy.linalg  # noqa: E402
import zarr  # noqa: E402

from distfit.stores.data import read_histograms, write_synthetic  # noqa: E402
from distfit.plan.job import run_plan  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.release.noise import load_blocks  # noqa: E402
from distfit.release.job import run_release  # noqa: E402
from distfit.stores.release import ANSWER_COMPRESSORS, answer_chunks  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402

MIB = 2.0**20


class PeakRSS:
    """Sample RSS of this process and of its descendants until stopped (peak per process)."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.driver = 0
        self.children: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                self.driver = max(self.driver, me.memory_info().rss)
                for child in me.children(recursive=True):
                    try:
                        rss = child.memory_info().rss
                    except psutil.Error:
                        continue
                    self.children[child.pid] = max(self.children.get(child.pid, 0), rss)
            except psutil.Error:
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def worker(self) -> int:
        return max(self.children.values(), default=0)


def baseline(plan_path: str, data_path: str, out: str, entropy: int) -> float:
    """The minimal loop (module docstring); returns seconds."""
    start = time.perf_counter()
    plan = read_plan(plan_path)
    blocks = load_blocks(plan)  # sorted ids: position = noise-stream block index
    schema = plan.attrs["schema"]
    shape = tuple(schema["sizes"])
    names = list(schema["attributes"])
    m = int(np.asarray(plan.queries_targets).shape[0])
    prepared = []
    for position, (block_id, block) in enumerate(blocks.items()):
        keep = {names.index(a) for a in block.attributes}
        drop = tuple(1 + ax for ax in range(len(shape)) if ax not in keep)
        prepared.append((position, block_id, drop, np.asarray(block.basis, dtype=np.float64).T,
                         np.asarray(block.recon, dtype=np.float64).T,
                         scipy.linalg.cholesky(np.asarray(block.sigma, dtype=np.float64), lower=True).T,
                         np.asarray(block.query_index),
                         np.unique(block.query_index).size == np.size(block.query_index)))
    data = read_histograms(data_path)
    units, step = data.units, data.chunk_units
    root = zarr.open_group(store=out, mode="w-", zarr_format=3)
    config = {"write_empty_chunks": True}
    arrays = {}
    for _position, block_id, _drop, _bt, recon_t, _ct, _qi, _u in prepared:
        arrays[block_id] = root.create_array(
            f"blocks/{block_id}/answers", shape=(units, recon_t.shape[1]), dtype=np.float64,
            chunks=answer_chunks(step, recon_t.shape[1]), compressors=ANSWER_COMPRESSORS, config=config)
    queries = root.create_array("queries/answers", shape=(units, m), dtype=np.float64,
                                chunks=answer_chunks(step, m), compressors=ANSWER_COMPRESSORS, config=config)
    ids_out = root.create_array("unit_ids", shape=(units,), dtype=np.int64, chunks=(step,), config=config)
    for chunk, lo in enumerate(range(0, units, step)):
        hi = min(lo + step, units)
        counts = np.asarray(data.counts[lo:hi])
        cube = counts.reshape((hi - lo,) + shape)
        q = np.zeros((hi - lo, m))
        for position, block_id, drop, basis_t, recon_t, chol_t, qi, unique in prepared:
            marg = cube.sum(axis=drop).reshape(hi - lo, -1).astype(np.float64)
            rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(position, chunk)))
            z = rng.standard_normal((hi - lo, chol_t.shape[0])) @ chol_t
            ans = (marg @ basis_t + z) @ recon_t
            arrays[block_id][lo:hi] = ans
            if unique:
                q[:, qi] += ans
            else:
                np.add.at(q, (slice(None), qi), ans)
        queries[lo:hi] = q
        ids_out[lo:hi] = np.asarray(data.unit_ids[lo:hi])
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="default: a new temporary directory (deleted)")
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "pl94.yaml"))
    parser.add_argument("--repeat", type=int, default=1,
                        help="release and baseline runs per N (alternating); the table shows the median and range")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")

    own = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-release-"))
    workdir.mkdir(parents=True, exist_ok=True)
    plan_path = str(workdir / "plan.zarr")
    if Path(plan_path).exists():
        shutil.rmtree(plan_path)
    start = time.perf_counter()
    run_plan(load_spec(args.spec), plan_path, serial=True, log=io.StringIO())
    plan = read_plan(plan_path)
    blocks = load_blocks(plan)
    print(f"plan {Path(args.spec).name}: {len(blocks)} block(s) "
          f"{[(b.recon.shape[0], b.basis.shape[1]) for b in blocks.values()]} (m_b, d_b), "
          f"{len(plan.queries_targets)} queries, planned in {time.perf_counter() - start:.1f} s; "
          f"workdir {workdir}", flush=True)

    rows = []
    try:
        for n in args.units:
            data_path, out, base_out = (str(workdir / f"{name}-{n}.zarr") for name in ("data", "release", "baseline"))
            for p in (data_path, out, base_out):
                shutil.rmtree(p, ignore_errors=True)
            start = time.perf_counter()
            write_synthetic(args.spec, n, data_path, seed=n)
            synth = time.perf_counter() - start
            chunk_units = read_histograms(data_path).chunk_units
            data_mib = sum(f.stat().st_size for f in Path(data_path).rglob("*") if f.is_file()) / MIB
            print(f"N={n}: synthesised in {synth:.1f} s ({chunk_units} units/chunk, {data_mib:.0f} MiB on disk)",
                  flush=True)
            runs = []
            for rep in range(args.repeat):
                with PeakRSS() as mem_d:
                    result = run_release(plan_path, data_path, out, workers=args.workers, log=io.StringIO())
                seconds = result.seconds
                out_mib = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file()) / MIB
                shutil.rmtree(out)
                with PeakRSS() as mem_b:
                    base = baseline(plan_path, data_path, base_out, entropy=12345 + n + rep)
                shutil.rmtree(base_out)
                runs.append((seconds, base, mem_d.driver / MIB, mem_d.worker / MIB, mem_b.driver / MIB, out_mib))
                print(f"N={n} run {rep + 1}/{args.repeat}: distfit {seconds:.1f} s, baseline {base:.1f} s, "
                      f"ratio {seconds / base:.2f}; release {out_mib:.0f} MiB on disk; load average "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
            shutil.rmtree(data_path)
            rows.append((n, synth, runs))
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)

    def spread(values: list[float], fmt: str) -> str:
        if len(values) == 1:
            return format(values[0], fmt)
        return f"{format(float(np.median(values)), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    print()
    if args.repeat > 1:
        print(f"median (min-max) of {args.repeat} runs; each run: distfit, then the baseline")
    print(f"{'units':>9} {'synth s':>8} {'distfit s':>18} {'units/s':>9} {'base s':>18} {'units/s':>9} "
          f"{'ratio':>16} {'drv MiB':>8} {'wrk MiB':>8} {'base MiB':>8} {'out MiB':>8}")
    for n, synth, runs in rows:
        seconds = [r[0] for r in runs]
        bases = [r[1] for r in runs]
        ratios = [r[0] / r[1] for r in runs]
        print(f"{n:>9} {synth:>8.1f} {spread(seconds, '.1f'):>18} {n / float(np.median(seconds)):>9.0f} "
              f"{spread(bases, '.1f'):>18} {n / float(np.median(bases)):>9.0f} {spread(ratios, '.2f'):>16} "
              f"{max(r[2] for r in runs):>8.0f} {max(r[3] for r in runs):>8.0f} {max(r[4] for r in runs):>8.0f} "
              f"{runs[0][5]:>8.0f}")
    print(f"ratio = distfit / baseline seconds of the same run (goal <= 1.5); units/s at the median; drv/wrk "
          f"MiB = sampled peak RSS of the driver / largest worker process during run_release ({args.workers} "
          f"workers; max over runs); base MiB = sampled peak RSS during the baseline (goal < 2048 MiB, flat in N)")
    print(f"driver ru_maxrss over the whole run = {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
