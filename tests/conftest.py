"""Fixtures shared across the test packages."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import pytest

from distfit.release.job import run_release
from distfit.runtime.placement import Placement
from distfit.stores.data import write_synthetic
from tests.reference import SMALL_CHUNK, SMALL_SPEC, SMALL_UNITS
from tests.storetools import PlannedSpec, planned


def pytest_configure(config) -> None:
    """The tests run with a home directory of their own (this process and every subprocess it
    starts): the ledger of private releases (distfit.stores.ledger, under ~/.local/share) then
    holds only the tests' releases, and never the runner's."""
    home = tempfile.mkdtemp(prefix="distfit-tests-home-")
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    os.environ["HOME"] = home


#: The test files that take longest (``pytest --durations``, session 18: each 80-700 worker-seconds
#: under load), run first. The suite runs in two processes, one file to each at a time
#: (``--dist loadfile``), which take the files in collection order (``--no-loadscope-reorder``:
#: pytest-xdist would otherwise order them by their number of tests, and test_wide.py's few
#: long tests, ~10 minutes under load, ran last and alone while the other process idled):
#: longest processing time first.
LONGEST_FIRST = (
    "tests/estimate/test_wide.py",
    "tests/pipeline/test_run_cluster.py",
    "tests/pipeline/test_run.py",
    "tests/estimate/test_graphical.py",
    "tests/cluster/test_slurm.py",
    "tests/estimate/test_levels.py",
    "tests/runtime/test_cluster.py",
    "tests/test_readme.py",
    "tests/plan/test_job.py",
    "tests/report/test_page.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    """Orders the files as :data:`LONGEST_FIRST` says, the rest after them as collected (a stable
    sort: each file's tests keep their order, and every process collects the same order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def small_plan(tmp_path_factory) -> PlannedSpec:
    """One real multi-block plan of ``tests.reference.SMALL_SPEC`` for the session (treat its
    files as read-only)."""
    return planned(tmp_path_factory.mktemp("small-plan"), SMALL_SPEC)


@pytest.fixture(scope="session")
def small_data(small_plan, tmp_path_factory) -> str:
    """The path of ``SMALL_UNITS`` synthetic units of the small plan's spec in chunks of
    ``SMALL_CHUNK`` (seed 1), for the session (read-only: copy it to change it)."""
    data = tmp_path_factory.mktemp("small-data") / "data.zarr"
    write_synthetic(small_plan.spec, SMALL_UNITS, data, seed=1, chunk_units=SMALL_CHUNK, fsync=False)
    return str(data)


@dataclass(frozen=True)
class SmallRelease:
    """The small plan's release of ``small_data`` at ``path`` (serial, a test seed: not
    private) and its ``checksum``."""

    plan: str
    data: str
    path: str
    checksum: str


@pytest.fixture(scope="session")
def small_release(small_plan, small_data, tmp_path_factory) -> SmallRelease:
    """One sealed multi-block release for the session (read-only: copy it to change it)."""
    path = tmp_path_factory.mktemp("small-release") / "release.zarr"
    result = run_release(small_plan.plan, small_data, path, seed=24680, placement=Placement(serial=True), fsync=False)
    return SmallRelease(small_plan.plan, small_data, str(path), result.checksum)
