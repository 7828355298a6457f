"""distfit.release.tasks: what a worker runs (the tasks themselves run end to end in test_job.py)."""
from __future__ import annotations

import subprocess
import sys

from distfit.release.tasks import TASK_UNITS, task_chunks


def test_task_chunks_are_guided_runs():
    for pending, chunk_units, threads in ((list(range(245)), 4096, 2), (list(range(25)), 4096, 2),
                                          ([0, 3, 4, 9], 10, 8), (list(range(1000)), 1, 3), ([], 8, 2)):
        tasks = task_chunks(pending, chunk_units, threads)
        assert [c for t in tasks for c in t] == pending
        sizes = [len(t) for t in tasks]
        assert all(1 <= s <= max(1, TASK_UNITS // chunk_units) for s in sizes)
        assert sizes == sorted(sizes, reverse=True)
        if pending:
            assert sizes[-1] == 1
    assert len(task_chunks(list(range(245)), 4096, 2)) == 50  # 8 chunks (32k units) a task, then fewer


def test_a_worker_imports_no_driver_module():
    """Unpickling a release task imports distfit.release.tasks, not the driver's modules."""
    code = ("import sys, distfit.release.tasks; "
            "print(sorted(m for m in ('distfit.release.job', 'distfit.data.microdata', 'distfit.audit.plan', "
            "'dask.dataframe', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
