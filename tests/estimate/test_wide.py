"""Estimates of wide schemas through the command line, under a memory cap (issue 26, point 1).

Each real-width run is a ``python -m distfit.cli`` subprocess with RLIMIT_AS at 4 GiB: an
estimate path that allocated anything proportional to the domain's cells (Adult 1.63e9, the
16 x 4 schema 4.3e9: 12-32 GiB per float64 row) fails there with MemoryError instead of
passing. The auto switch between the projection and a graphical model is checked on both sides
of :data:`distfit.estimate.graphical.PROJECTION_MAX_CELLS` on real plans, and the graphical
extra's absence is one line, exit 2.
"""
from __future__ import annotations

import itertools
import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from distfit.estimate import graphical
from distfit.estimate.job import graphical_method
from distfit.estimate.measurements import measurement_model
from distfit.stores.estimate import read_estimate, verify_estimate
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release
from tests.clitools import assert_one_line_error
from tests.reference import shared_disagreement
from tests.storetools import planned

MEMORY_CAP = 4 << 30
ADULT_CSV = Path(__file__).resolve().parents[2] / "pipelines" / "data" / "adult.csv"
ADULT_SPEC = ADULT_CSV.parents[1] / "adult.yaml"


def cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


#: A ``python -c`` program that runs ``distfit`` with mbi and jax unimportable (the graphical extra absent).
WITHOUT_EXTRA = ("import sys; sys.modules['mbi'] = None; sys.modules['jax'] = None\n"
                 "from distfit.cli.main import main\n"
                 "raise SystemExit(main(sys.argv[1:]))")


def distfit(*argv: str, cwd: Path, capped: bool = False, extra: bool = True) -> subprocess.CompletedProcess:
    """``distfit ARGV`` in a child process (RLIMIT_AS 4 GiB with ``capped``; without the
    graphical extra unless ``extra``)."""
    command = ["-m", "distfit.cli"] if extra else ["-c", WITHOUT_EXTRA]
    return subprocess.run([sys.executable, *command, *argv], cwd=cwd, capture_output=True, text=True,
                          preexec_fn=cap_memory if capped else None, timeout=900)



def check_graphical_store(path: Path, expected_method: str) -> dict:
    """The sealed estimate at ``path``: verified, the expected method, one unit of nonnegative
    clique marginals that agree on their shared attributes, nonnegative query estimates."""
    assert verify_estimate(path)[0]
    est = read_estimate(path)
    assert est.method == expected_method
    estimates = np.asarray(est.estimates[...])
    assert estimates.shape[0] == 1 and estimates.min() >= 0
    unit = {clique: np.asarray(table[0]) for clique, table in est.marginals.items()}
    total = next(iter(unit.values())).sum()
    assert min(t.min() for t in unit.values()) >= 0
    assert all(abs(t.sum() - total) <= 1e-6 * total for t in unit.values())
    assert shared_disagreement(unit) <= 1e-6 * total
    return unit


def test_sixteen_attributes_of_four_values_through_the_cli_under_4_gib(tmp_path):
    """16 attributes of 4 values, all 120 2-way marginals (4.3e9 cells): plan, release of 300
    people (microdata), then ``distfit estimate`` on a real local Dask cluster under a 4 GiB
    address-space cap. Auto picks the local polytope and states its memory first; every
    2-way marginals' estimates are closer to the truth in total (L1) than the raw release."""
    attributes = [f"a{i}" for i in range(16)]
    spec = {"name": "wide16", "attributes": [{"name": a, "size": 4} for a in attributes],
            "queries": [{"name": "pairs", "marginals": {"order": 2}, "target": 25.0}]}
    (tmp_path / "wide.yaml").write_text(yaml.safe_dump(spec))
    rng = np.random.default_rng(7)
    common = rng.integers(0, 4, size=(300, 1))
    people = np.where(rng.random((300, 16)) < 0.6, common, rng.integers(0, 4, size=(300, 16)))
    np.savetxt(tmp_path / "people.csv", people, fmt="%d", delimiter=",", header=",".join(attributes), comments="")
    assert distfit("plan", "wide.yaml", "--out", "plan.zarr", "--serial", cwd=tmp_path).returncode == 0
    released = distfit("release", "plan.zarr", "--data", "people.csv", "--out", "release.zarr", "--seed", "5",
                       "--serial", cwd=tmp_path)
    assert released.returncode == 0, released.stderr
    done = distfit("estimate", "plan.zarr", "release.zarr", "--out", "est.zarr", "--workers", "2", cwd=tmp_path,
                   capped=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cells 4294967296" in done.stdout
    assert "distfit: estimate by graphical-local: working memory about" in done.stderr
    unit = check_graphical_store(tmp_path / "est.zarr", "graphical-local")
    assert len(unit) == 120
    # accuracy against the truth: the queries are the 120 pairs' 4 x 4 tables, pairs in
    # combination order, cells row-major (their labels say so)
    release = read_release(tmp_path / "release.zarr")
    assert release.labels[16] == "pairs.a0.a2:a0[0],a2[0]"
    truth = np.concatenate([np.bincount(4 * people[:, i] + people[:, j], minlength=16)
                            for i, j in itertools.combinations(range(16), 2)]).astype(float)
    raw = np.asarray(release.answers[0])
    estimates = np.asarray(read_estimate(tmp_path / "est.zarr").estimates[0])
    assert (raw < 0).any()  # small counts: the raw release has negative cells to correct
    assert np.abs(estimates - truth).sum() < np.abs(raw - truth).sum()


@pytest.fixture(scope="module")
def adult_run(tmp_path_factory):
    """A draft plan of the README's Adult spec and a release of the shipped 32,561 people. The
    estimate is what is under test: the draft (every block within 1.5x its optimum, no
    refinement rounds; 21 CPU-s serial against ~240 for the default plan) has the default
    plan's blocks, bases and queries, so the estimate's measurements have the same shapes and
    its work and memory are the same; only the noise covariances differ."""
    root = tmp_path_factory.mktemp("adult")
    planned = distfit("plan", str(ADULT_SPEC), "--out", "plan.zarr", "--refine-rounds", "0", "--gap-tolerance", "0.5",
                      "--serial", cwd=root)
    assert planned.returncode == 0, planned.stderr[-2000:]
    released = distfit("release", "plan.zarr", "--data", str(ADULT_CSV), "--out", "release.zarr", "--seed", "3",
                       "--serial", cwd=root)  # one unit: a local cluster would add its start and nothing else
    assert released.returncode == 0, released.stderr[-2000:]
    return root


def test_adult_estimate_through_the_cli_under_4_gib(adult_run):
    """The README's Adult example (14 attributes, 1.63e9 cells, 42,301 queries): ``distfit
    estimate`` with the default method finishes under a 4 GiB cap without the graphical extra,
    by the local polytope (its memory stated first, against the limit the cap leaves), and
    seals a verified store of consistent, nonnegative clique marginals of the 32,561 people."""
    done = distfit("estimate", "plan.zarr", "release.zarr", "--out", "est.zarr", "--serial", cwd=adult_run,
                   capped=True, extra=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cells 1632960000" in done.stdout and "queries        42301" in done.stdout
    stated = re.search(r"distfit: estimate by graphical-local: working memory about ([\d,.]+) MiB a task "
                       r"\(limit ([\d.]+) GiB\)", done.stderr)
    assert stated, done.stderr[-3000:]
    assert float(stated[1].replace(",", "")) < 1024 * float(stated[2]) < 4096  # the cap's remainder, not 8 GiB
    assert "estimate units 0-0: ADMM: 25/1000 steps" in done.stderr  # progress per batch of iterations
    assert "0 units unconverged" in done.stdout
    unit = check_graphical_store(adult_run / "est.zarr", "graphical-local")
    total = next(iter(unit.values())).sum()
    assert abs(total - 32561) < 0.01 * 32561  # the total is estimated from the release: near the truth


def test_adult_projection_is_refused_in_one_line_before_allocating(adult_run):
    """``--method projection`` at Adult's width states what it would need and exits 2 at once,
    under the cap (it allocates nothing of the domain's size) and with nothing left at --out."""
    refused = distfit("estimate", "plan.zarr", "release.zarr", "--out", "proj.zarr", "--method", "projection",
                      "--serial", cwd=adult_run, capped=True)
    assert refused.returncode == 2
    assert_one_line_error(refused.stderr, "--method projection", "1,632,960,000 cells", "GiB", "over the limit")
    assert not (adult_run / "proj.zarr").exists()
    assert not list(adult_run.glob("proj.zarr*"))


@pytest.fixture(scope="module")
def switch_models(tmp_path_factory):
    """Real plans of 11 attributes (all 1-way marginals) of 4^11 = PROJECTION_MAX_CELLS cells
    and of twice that (the last attribute of 8 values): the two sides of the auto switch."""
    models = {}
    for name, last in (("at", 4), ("above", 8)):
        spec = {"name": f"switch-{name}",
                "attributes": [{"name": f"a{i}", "size": 4} for i in range(10)] + [{"name": "a10", "size": last}],
                "queries": [{"name": "ones", "marginals": {"order": 1}, "target": 1.0}]}
        models[name] = measurement_model(read_plan(planned(tmp_path_factory.mktemp(f"switch-{name}"), spec).plan))
    assert models["at"].cells == graphical.PROJECTION_MAX_CELLS
    assert models["above"].cells == 2 * graphical.PROJECTION_MAX_CELLS
    return models


def test_auto_switch_on_each_side(switch_models):
    """Auto: the projection at PROJECTION_MAX_CELLS cells with a chunk that fits the memory
    limit (its memory stated: 10 float64 copies of the chunk's cells, the estimates), a
    graphical model one attribute value past it (the local polytope: a residual plan), and a
    graphical model at the limit when the chunk would need more memory than the limit. ``--method projection`` is refused where it
    would not fit, in one line."""
    at, above = switch_models["at"], switch_models["above"]
    method, problem, memory = graphical_method(at, "auto", False, 2)
    assert (method, problem) == ("projection", None)
    assert memory == 8 * (10 * 2 * at.cells + 2 * at.num_queries)
    method, problem, memory = graphical_method(above, "auto", False, 2)
    assert method == "graphical-local" and problem.memory_bytes == memory < graphical.MEMORY_LIMIT_BYTES
    method, _, _ = graphical_method(at, "auto", False, 1000)  # 1000 units x 4M cells: 312 GiB
    assert method.startswith("graphical-")
    with pytest.raises(ValueError) as info:
        graphical_method(at, "projection", False, 1000)
    assert "\n" not in str(info.value) and "over the limit of 8.0 GiB" in str(info.value)
    with pytest.raises(ValueError, match="--integer"):
        graphical_method(above, "auto", True, 2)


def test_the_memory_limit_is_what_an_address_space_cap_leaves():
    """Without a cap the methods' memory limit is MEMORY_LIMIT_BYTES; under RLIMIT_AS it is the
    cap less what the process has mapped (VmSize), so that a method which would not fit is
    refused in one line before it starts: 256 MiB above the current size leaves about 256 MiB."""
    script = ("import resource\n"
              "from distfit.estimate.job import memory_limit\n"
              "free = memory_limit()\n"
              "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
              "resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))\n"
              "print(free, memory_limit())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    free, capped = map(int, done.stdout.split())
    assert free == graphical.MEMORY_LIMIT_BYTES
    assert 200 << 20 < capped <= 256 << 20


def test_without_the_graphical_extra_the_estimate_says_so_in_one_line(tmp_path, adult_run):
    """With mbi and jax unimportable, a wide estimate by the region graph (which needs them)
    exits 2 with one line saying how to install the extra, and writes nothing."""
    result = distfit("estimate", "plan.zarr", "release.zarr", "--out", str(tmp_path / "e.zarr"), "--method",
                     "graphical-region-graph", "--serial", cwd=adult_run, extra=False)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "pip install 'distfit[graphical]'")
    assert not list(tmp_path.glob("e.zarr*"))
