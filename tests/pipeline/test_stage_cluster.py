"""distfit/pipeline/stage_cluster.py: the run's local cluster started ahead of the data stage,
closed when the data stage fails before any stage took it."""
from __future__ import annotations

import pandas as pd
import psutil
import yaml

from distfit.data.microdata import SNIFF_ROWS
from tests.clitools import assert_one_line_error, run
from tests.reference import SMALL_SPEC


def test_a_cluster_started_ahead_is_closed_when_the_tabulation_fails(capsys, tmp_path):
    """Bad microdata past the sniffed start (so found by the tabulation, after the cluster was
    started on its thread): exit 2, one line naming the line and value, no plan, and no worker
    process left behind."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SMALL_SPEC))
    rows = SNIFF_ROWS + 200
    people = pd.DataFrame({"age": [str(i % 6) for i in range(rows)], "sex": ["f", "m"] * (rows // 2),
                           "edu": [str(i % 3) for i in range(rows)]})
    people.loc[SNIFF_ROWS + 100, "sex"] = "x"
    source = tmp_path / "people.csv"
    people.to_csv(source, index=False)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    code, _, err = run(capsys, "run", str(spec), "--out", str(tmp_path / "run"), "--data", str(source),
                       "--workers", "1")
    assert code == 2
    assert_one_line_error(err.replace("distfit: local cluster with 1 worker processes on 127.0.0.1\n", ""),
                          "people.csv", f"line {SNIFF_ROWS + 102}", "'sex'", "'x'")
    assert "local cluster" in err  # it was started, ahead
    assert not (tmp_path / "run" / "plan.zarr").exists()
    # multiprocessing's resource tracker stays for the life of the process that spawned workers
    left = [p.cmdline() for p in psutil.Process().children(recursive=True) if p.pid not in before
            and p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, left
