"""How long a user waits for ``distfit --version`` and ``distfit --help`` (issue 31, point 1:
<= 0.3 s), beside the interpreter's own start-up and an ``import numpy`` in the same run.

Usage::

    python benchmarks/bench_startup.py [--repeat 10]

Each command runs ``--repeat`` times as a fresh ``python -m distfit.cli`` process (the commands
interleaved, so load drifts hit all alike). Printed per command: the best and median wall time
and CPU-seconds (user + system of the child, from ``os.wait4``), and the ratio of its median CPU
to the bare interpreter's. CPU-seconds are the figure to compare across machines: wall time on a
shared machine includes waiting for a core. The load average is printed before the runs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMANDS = {
    "python -c pass (reference)": [sys.executable, "-c", "pass"],
    "python -c 'import numpy' (reference)": [sys.executable, "-c", "import numpy"],
    "distfit --version": [sys.executable, "-m", "distfit.cli", "--version"],
    "distfit --help": [sys.executable, "-m", "distfit.cli", "--help"],
}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU-seconds) of one run of ``argv``."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {process.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="runs of each command (default 10)")
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeat):
        for name, argv in COMMANDS.items():
            runs[name].append(timed(argv, env))
    bare_cpu = statistics.median(cpu for _, cpu in runs["python -c pass (reference)"])
    print(f"{'command':40s} {'wall best':>10s} {'median':>8s} {'CPU best':>9s} {'median':>8s} {'CPU / bare python':>18s}")
    for name, samples in runs.items():
        walls, cpus = [w for w, _ in samples], [c for _, c in samples]
        print(f"{name:40s} {min(walls):9.3f}s {statistics.median(walls):7.3f}s {min(cpus):8.3f}s "
              f"{statistics.median(cpus):7.3f}s {statistics.median(cpus) / bare_cpu:17.1f}x")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
